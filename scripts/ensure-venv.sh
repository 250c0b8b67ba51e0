#!/usr/bin/env bash
# Creates (or reuses) the project's Python environment and links it at .venv.
#
# The environment lives outside the repo under $LLMOP_CACHE/venvs/<hash of the lock file>, so a warm
# run (CI on the same machine, a second checkout) reuses it without downloading anything; a change
# to requirements/dev.lock makes a new one. The project itself is installed editable on top.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
lock="$root/requirements/dev.lock"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || { echo "ensure-venv: $py not found (Python 3.11 is required)" >&2; exit 1; }
key=$( (cat "$lock"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv="$cache/venvs/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "ensure-venv: creating $venv from $lock" >&2
  rm -rf "$venv"; mkdir -p "$cache/venvs"
  start=$SECONDS
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q --no-deps -r "$lock"
  echo "ensure-venv: installed in $((SECONDS - start)) s, $(du -sm "$venv" | cut -f1) MiB" >&2
  touch "$venv/.complete"
fi
ln -sfn "$venv" "$root/.venv"
# Editable install of this checkout (cheap, and it must point at the checkout being tested).
if ! "$venv/bin/python" -c 'import llm_operator, sys, os; sys.exit(0 if os.path.realpath(llm_operator.__file__).startswith(os.path.realpath(sys.argv[1])) else 1)' "$root/operator" 2>/dev/null; then
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root"
fi
