#!/usr/bin/env bash
# Creates (or reuses) the environment of a tool that lives apart from the project's
# (scripts/ensure-venv.sh), and prints its bin directory. usage: ensure-tool-venv.sh NAME CHECK...
#   bench      aiperf, make bench's P9 client and tests/e2e/clients.py's: its pins conflict with the
#              operator's (prometheus-client)
#   hf-mirror  olah, the test world's Hugging Face mirror: it pins its own fastapi, pydantic, huggingface_hub
#   inference-perf, guidellm, litellm  the clients tests/e2e/clients.py runs against a deployment
#   uv         the resolver scripts/lock.sh writes the locks with
# pip installs exactly requirements/NAME.lock (--no-deps; --require-hashes, scripts/lock.sh writes
# the hashes); CHECK (a command of the environment with its arguments) must then run. Like the
# project's, it is cached outside the repo under $LLMOP_CACHE/venvs, keyed by the lock's hash and
# the Python version. A lock's header may say `# python: 3.12` (that Python: on PATH, else pyenv's) and
# `# debian-torch` (Debian's CPU-only torch linked in, as scripts/ensure-venv.sh does; Python 3.11 only).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME CHECK..." >&2; exit 2; }
name=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
lock="$root/requirements/$name.lock"
want=$(sed -n 's/^# python: //p' "$lock")
py=${PYTHON:-python${want:-3.11}}
if ! "$py" -V >/dev/null 2>&1 && [ -n "$want" ]; then  # a pyenv shim of a version not selected fails
  py=$(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions/$want".*/bin/python"$want" 2>/dev/null | tail -1)
fi
"${py:-false}" -V >/dev/null 2>&1 || { echo "ensure-tool-venv: python${want:-3.11} not found (required by $lock)" >&2; exit 1; }
key=$( (cat "$lock" "$root/requirements/pip.lock"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv="$cache/venvs/$name-$key"
mkdir -p "$cache/venvs"; exec 7>"$cache/venvs/.$name.lock"; flock 7
if [ ! -f "$venv/.complete" ]; then
  echo "ensure-tool-venv: creating $venv from $lock" >&2
  rm -rf "$venv"
  start=$SECONDS
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --require-hashes --no-deps -r "$root/requirements/pip.lock" >&2
  "$venv/bin/pip" install -q --require-hashes --no-deps -r "$lock" >&2
  if grep -q '^# debian-torch' "$lock"; then
    mkdir -p "$venv/debian"
    ln -sfn /usr/lib/python3/dist-packages/torch "$venv/debian/torch"
    echo "$venv/debian" >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/debian-torch.pth"
  fi
  "$venv/bin/$1" "${@:2}" >/dev/null
  echo "ensure-tool-venv: installed in $((SECONDS - start)) s, $(du -sm "$venv" | cut -f1) MiB" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin"
