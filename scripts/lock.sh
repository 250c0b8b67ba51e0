#!/usr/bin/env bash
# Writes requirements/NAME.lock with the sha256 of every file PyPI has for each pinned version, so
# that `pip install --require-hashes` (scripts/ensure-venv.sh, ensure-tool-venv.sh) refuses any
# other bytes. usage: scripts/lock.sh NAME... [--upgrade]
#   dev        the project's environment: pyproject.toml's dependencies and dev extra, plus setuptools
#              and wheel (the editable install builds without isolation)
#   bench      aiperf, make bench's P9 client         hf-mirror  olah, the test world's Hub mirror
#   pip        the pip every environment is upgraded to first   uv  this script's own resolver
# Without --upgrade each lock keeps the versions it pins (only its hashes are written anew); with
# it, the newest versions the inputs allow. The resolver is uv, from requirements/uv.lock.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
upgrade=()
names=()
for arg in "$@"; do
  case $arg in
    --upgrade) upgrade=(--upgrade) ;;
    dev|bench|hf-mirror|pip|uv) names+=("$arg") ;;
    *) echo "lock: unknown lock '$arg' (dev, bench, hf-mirror, pip, uv)" >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
uv="$("$root/scripts/ensure-tool-venv.sh" uv uv --version)/uv"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

for name in "${names[@]}"; do
  lock="$root/requirements/$name.lock"
  inputs=()
  case $name in
    dev) printf 'setuptools\nwheel\n' >"$work/build.in"; inputs=("$root/pyproject.toml" --extra dev "$work/build.in") ;;
    bench) echo aiperf >"$work/$name.in"; inputs=("$work/$name.in") ;;
    hf-mirror) echo olah >"$work/$name.in"; inputs=("$work/$name.in") ;;
    pip|uv) echo "$name" >"$work/$name.in"; inputs=("$work/$name.in") ;;
  esac
  grep -v '^\s*#' "$lock" | grep -E '^[A-Za-z0-9]' | sed 's/ .*//' >"$work/$name.pins" || true
  header=$(grep '^#' "$lock" || true)
  "$uv" pip compile --quiet --generate-hashes --no-header --python-version 3.11 \
    --python-platform x86_64-manylinux_2_36 --no-annotate "${upgrade[@]}" -c "$work/$name.pins" "${inputs[@]}" \
    -o "$work/$name.lock"
  { echo "$header"; cat "$work/$name.lock"; } >"$lock"
  echo "lock: wrote $lock ($(grep -cE '^[A-Za-z0-9]' "$lock") packages)" >&2
done
