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
"$root/scripts/ensure-system-packages.sh"
command -v "$py" >/dev/null || { echo "ensure-venv: $py not found (Python 3.11 is required)" >&2; exit 1; }
key=$( (cat "$lock" "$root/requirements/pip.lock"; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
venv="$cache/venvs/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "ensure-venv: creating $venv from $lock" >&2
  rm -rf "$venv"; mkdir -p "$cache/venvs"
  start=$SECONDS
  "$py" -m venv "$venv"
  # Hash-checked (scripts/lock.sh): pip first, then exactly the lock's files.
  "$venv/bin/pip" install -q --require-hashes --no-deps -r "$root/requirements/pip.lock"
  "$venv/bin/pip" install -q --require-hashes --no-deps -r "$lock"
  # torch is Debian's CPU-only build (ensure-system-packages.sh). Only it is linked in, so Debian's
  # other python3-* packages never shadow or mix with the locked ones.
  mkdir -p "$venv/debian"
  ln -sfn /usr/lib/python3/dist-packages/torch "$venv/debian/torch"
  echo "$venv/debian" > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/debian-torch.pth"
  "$venv/bin/python" -c 'import torch' || { echo "ensure-venv: Debian's torch does not import in $py" >&2; exit 1; }
  echo "ensure-venv: installed in $((SECONDS - start)) s, $(du -sm "$venv" | cut -f1) MiB" >&2
  touch "$venv/.complete"
fi
ln -sfn "$venv" "$root/.venv"
# Editable install of this checkout (cheap, and it must point at the checkout being tested).
if ! "$venv/bin/python" -c 'import llm_operator, sys, os; sys.exit(0 if os.path.realpath(llm_operator.__file__).startswith(os.path.realpath(sys.argv[1])) else 1)' "$root/operator" 2>/dev/null; then
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root"
fi
