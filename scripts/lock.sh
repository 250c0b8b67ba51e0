#!/usr/bin/env bash
# Writes requirements/NAME.lock with the sha256 of every file PyPI has for each pinned version, so
# that `pip install --require-hashes` (scripts/ensure-venv.sh, ensure-tool-venv.sh, the images'
# Dockerfiles and images.builder) refuses any other bytes. usage: scripts/lock.sh NAME... [--upgrade]
#   dev        the project's environment: pyproject.toml's dependencies and dev extra, plus setuptools
#              and wheel (the editable install builds without isolation)
#   bench      aiperf, make bench's P9 client         hf-mirror  olah, the test world's Hub mirror
#   inference-perf, guidellm, litellm   the clients tests/e2e/clients.py runs (inference-perf on Python 3.12)
#   pip        the pip every environment is upgraded to first   uv  this script's own resolver
#   image-operator     the operator image: pyproject.toml's runtime dependencies (not the project)
#   image-fetch        the fetch image's fetcher libraries: boto3, huggingface_hub
#   image-fetch-tools  the fetch image's store tools (awscli, gsutil), at image-fetch's versions
#   image-cpu-runtime  the CPU runtime's wheels, each without its dependencies (images/cpu-runtime.Dockerfile)
# The image locks take the versions dev.lock pins wherever it pins a package, so an image runs what
# the tests ran. Without --upgrade each lock keeps the versions it pins (only its hashes are written
# anew); with it, the newest versions the inputs allow. The resolver is uv, from requirements/uv.lock.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
upgrade=()
names=()
for arg in "$@"; do
  case $arg in
    --upgrade) upgrade=(--upgrade) ;;
    dev|bench|hf-mirror|inference-perf|guidellm|litellm|pip|uv|image-operator|image-fetch|image-fetch-tools|image-cpu-runtime) names+=("$arg") ;;
    *) echo "lock: unknown lock '$arg' (see $0)" >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
uv="$("$root/scripts/ensure-tool-venv.sh" uv uv --version)/uv"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
printf 'torch; sys_platform == "never"\ntriton; sys_platform == "never"\n' >"$work/dev.overrides"
pins() { grep -v '^\s*#' "$1" | grep -E '^[A-Za-z0-9]' | sed 's/ .*//' || true; }  # name==version lines

for name in "${names[@]}"; do
  lock="$root/requirements/$name.lock"
  inputs=()
  options=()
  case $name in
    dev) printf 'setuptools\nwheel\n' >"$work/build.in"; inputs=("$root/pyproject.toml" --extra dev "$work/build.in")
      # xgrammar's torch is Debian's (ensure-venv.sh) and its triton GPU kernels are not used on CPU.
      options=(--override "$work/dev.overrides") ;;
    bench) echo aiperf >"$work/$name.in"; inputs=("$work/$name.in") ;;
    hf-mirror) echo olah >"$work/$name.in"; inputs=("$work/$name.in") ;;
    inference-perf|litellm) echo "$name" >"$work/$name.in"; inputs=("$work/$name.in") ;;
    # Its torch (the data loader) is Debian's CPU-only build, as dev's: PyPI's brings CUDA's GBs.
    # jinja2: transformers renders chat templates with it, and guidellm does not ask for it.
    guidellm) printf 'guidellm\njinja2\n' >"$work/$name.in"; inputs=("$work/$name.in")
      options=(--override "$work/dev.overrides") ;;
    pip|uv) echo "$name" >"$work/$name.in"; inputs=("$work/$name.in") ;;
    image-operator) inputs=("$root/pyproject.toml") ;;
    image-fetch) printf 'boto3\nhuggingface_hub\n' >"$work/$name.in"; inputs=("$work/$name.in") ;;
    image-fetch-tools) printf 'awscli\ngsutil\n' >"$work/$name.in"; inputs=("$work/$name.in")
      options=(-c "$work/image-fetch.pins"); pins "$root/requirements/image-fetch.lock" >"$work/image-fetch.pins" ;;
    image-cpu-runtime) printf 'nvidia-pytriton\nnumpy\ntyping-extensions\njinja2\nmarkupsafe\ntokenizers\nsafetensors\ngguf\npyyaml\nxgrammar\napache-tvm-ffi\npydantic\npydantic-core\nannotated-types\ntyping-inspection\n' >"$work/$name.in"
      inputs=("$work/$name.in"); options=(--no-deps) ;;
  esac
  if [[ $name == image-* ]]; then pins "$root/requirements/dev.lock" >"$work/dev.pins"; options+=(-c "$work/dev.pins"); fi
  pins "$lock" >"$work/$name.pins"
  header=$(grep '^#' "$lock" || true)
  python=$(sed -n 's/^# python: //p' "$lock" 2>/dev/null || true)  # a lock's own Python (ensure-tool-venv.sh)
  "$uv" pip compile --quiet --generate-hashes --no-header --python-version "${python:-3.11}" \
    --python-platform x86_64-manylinux_2_36 --no-annotate "${upgrade[@]}" "${options[@]}" -c "$work/$name.pins" "${inputs[@]}" \
    -o "$work/$name.lock"
  { echo "$header"; cat "$work/$name.lock"; } >"$lock"
  echo "lock: wrote $lock ($(grep -cE '^[A-Za-z0-9]' "$lock") packages)" >&2
done
