#!/usr/bin/env bash
# Creates (or reuses) the benchmark client's environment and prints the path of its `aiperf`.
#
# aiperf lives apart from the project's environment (scripts/ensure-venv.sh): its pins conflict with
# the operator's (prometheus-client), and nothing but `make bench` (P9) runs it. Like the project's,
# the environment is cached outside the repo under $LLMOP_CACHE/venvs, keyed by the lock's hash.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
lock="$root/requirements/bench.lock"
py=${PYTHON:-python3.11}
command -v "$py" >/dev/null || { echo "ensure-bench-venv: $py not found (Python 3.11 is required)" >&2; exit 1; }
key=$( (cat "$lock"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv="$cache/venvs/bench-$key"
if [ ! -f "$venv/.complete" ]; then
  echo "ensure-bench-venv: creating $venv from $lock" >&2
  rm -rf "$venv"; mkdir -p "$cache/venvs"
  start=$SECONDS
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q --no-deps -r "$lock" >&2
  "$venv/bin/aiperf" --version >/dev/null
  echo "ensure-bench-venv: installed in $((SECONDS - start)) s, $(du -sm "$venv" | cut -f1) MiB" >&2
  touch "$venv/.complete"
fi
echo "$venv/bin/aiperf"
