#!/usr/bin/env bash
# Creates (or reuses) the environment of a tool that lives apart from the project's
# (scripts/ensure-venv.sh), and prints its bin directory. usage: ensure-tool-venv.sh NAME CHECK...
#   bench      aiperf, make bench's P9 client: its pins conflict with the operator's (prometheus-client)
#   hf-mirror  olah, the test world's Hugging Face mirror: it pins its own fastapi, pydantic, huggingface_hub
#   uv         the resolver scripts/lock.sh writes the locks with
# pip installs exactly requirements/NAME.lock (--no-deps; --require-hashes, scripts/lock.sh writes
# the hashes); CHECK (a command of the environment with its arguments) must then run. Like the
# project's, it is cached outside the repo under $LLMOP_CACHE/venvs, keyed by the lock's hash and
# the Python version.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME CHECK..." >&2; exit 2; }
name=$1; shift
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
lock="$root/requirements/$name.lock"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || { echo "ensure-tool-venv: $py not found (Python 3.11 is required)" >&2; exit 1; }
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
  "$venv/bin/$1" "${@:2}" >/dev/null
  echo "ensure-tool-venv: installed in $((SECONDS - start)) s, $(du -sm "$venv" | cut -f1) MiB" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin"
