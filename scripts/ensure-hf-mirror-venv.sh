#!/usr/bin/env bash
# Creates (or reuses) the environment of the test world's Hugging Face mirror (olah, from PyPI) and
# prints the directory of its `olah-cli`.
#
# olah lives apart from the project's environment (scripts/ensure-venv.sh): it pins its own fastapi,
# pydantic and huggingface_hub, and only the test world (e2e/cluster/artifacts.py) runs it. Like the
# project's, the environment is cached outside the repo under $LLMOP_CACHE/venvs, keyed by the lock's
# hash; pip installs exactly the lock (--no-deps).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
lock="$root/requirements/hf-mirror.lock"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || { echo "ensure-hf-mirror-venv: $py not found (Python 3.11 is required)" >&2; exit 1; }
key=$( (cat "$lock"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv="$cache/venvs/hf-mirror-$key"
mkdir -p "$cache/venvs"; exec 7>"$cache/venvs/.hf-mirror.lock"; flock 7
if [ ! -f "$venv/.complete" ]; then
  echo "ensure-hf-mirror-venv: creating $venv from $lock" >&2
  rm -rf "$venv"; mkdir -p "$cache/venvs"
  start=$SECONDS
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q --no-deps -r "$lock" >&2
  "$venv/bin/olah-cli" --help >/dev/null
  echo "ensure-hf-mirror-venv: installed in $((SECONDS - start)) s, $(du -sm "$venv" | cut -f1) MiB" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin"
