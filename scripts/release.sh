#!/usr/bin/env bash
# The release's build-and-publish steps, after the tests: `scripts/release.sh REGISTRY VERSION`
#   1. builds images.builder's images (OCI archives, no Docker; root),
#   2. pushes each as REGISTRY/<name>:VERSION with crane (python -m images.push),
#   3. packages the chart with version and appVersion VERSION (its default images are then
#      <image.repository's directory>/<name>:VERSION) and pushes it to oci://REGISTRY/charts.
# .github/workflows/release.yml runs it with REGISTRY=ghcr.io/<owner>; tests/e2e/test_release.py
# runs it against the test world's registry. VERSION must be the project's version (pyproject.toml,
# Chart.yaml's appVersion and the operator's default image tags, which tests keep equal).
# Credentials: crane reads $DOCKER_CONFIG/config.json, helm $HELM_REGISTRY_CONFIG (point both at one
# file and `crane auth login` once). HELM, PY: the binaries (default: helm on PATH, .venv's python).
set -euo pipefail
die() { echo "release: error: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: scripts/release.sh REGISTRY VERSION (e.g. ghcr.io/llm-operator 0.1.0)"
registry=${1%/} version=$2
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
helm=${HELM:-helm}
project=$("$py" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
[ "$version" = "$project" ] || die "VERSION $version is not the project's version $project: bump pyproject.toml, \
Chart.yaml (version, appVersion) and the default image tags (operator/llm_operator/images.py, controller/config.py) together"

start=$SECONDS
"$py" -m images.builder --all >&2
"$py" -m images.push --registry "$registry" --version "$version"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$helm" package charts/llm-operator --version "$version" --app-version "$version" -d "$out" >&2
"$helm" push "$out/llm-operator-$version.tgz" "oci://$registry/charts" >&2
echo "oci://$registry/charts/llm-operator:$version"
echo "release: $registry, $version in $((SECONDS - start)) s" >&2
