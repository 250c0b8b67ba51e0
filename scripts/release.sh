#!/usr/bin/env bash
# The release's build-and-publish steps: `scripts/release.sh REGISTRY VERSION`
#   1. builds images.builder's images (OCI archives, no Docker; root),
#   2. pushes each as REGISTRY/<name>:VERSION with crane (python -m images.push),
#   3. packages the chart with version and appVersion VERSION and its default images pinned to the
#      digests just pushed (image.digest, image.digests: python -m images.release pin), and pushes
#      it to oci://REGISTRY/charts,
#   4. signs every image and the chart by digest with cosign, and attests each image's SBOM
#      (CycloneDX, python -m images.sbom); with a key it also attests an SLSA provenance of each.
# Prints `REGISTRY/<name>@<digest>` per image, then `REGISTRY/charts/llm-operator@<digest>`.
# Signing: COSIGN_KEY set (a key file; COSIGN_PASSWORD its password) signs with that key and
# uploads nothing to a transparency log: tests/e2e/test_release.py runs it so against the test
# world's registry. Unset, cosign signs keylessly with the CI's OIDC identity (Fulcio, Rekor):
# .github/workflows/release.yml's publish job, whose attest job then adds GitHub's build provenance.
# VERSION must be the project's version (pyproject.toml, Chart.yaml's appVersion and the operator's
# default image tags, which tests keep equal).
# Credentials: crane and cosign read $DOCKER_CONFIG/config.json, helm $HELM_REGISTRY_CONFIG (point
# both at one file and `crane auth login` once). HELM, PY, COSIGN: the binaries (default: helm and
# cosign on PATH, .venv's python).
set -euo pipefail
die() { echo "release: error: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: scripts/release.sh REGISTRY VERSION (e.g. ghcr.io/llm-operator/llm-operator 0.1.0)"
registry=${1%/} version=$2
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
helm=${HELM:-helm}
cosign=${COSIGN:-cosign}
project=$("$py" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
[ "$version" = "$project" ] || die "VERSION $version is not the project's version $project: bump pyproject.toml, \
Chart.yaml (version, appVersion) and the default image tags (operator/llm_operator/images.py, controller/config.py) together"
if [ -n "${COSIGN_KEY:-}" ]; then
  # No Fulcio, Rekor or TUF: the key is the identity, and the signatures live in the registry only.
  signing=(--key "$COSIGN_KEY" --use-signing-config=false --tlog-upload=false)
else
  signing=()
fi

start=$SECONDS
"$py" -m images.builder --all >&2
"$py" -m images.push --registry "$registry" --version "$version" >&2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cp -r charts/llm-operator "$out/chart"
"$py" -m images.release pin "$out/chart/values.yaml"
"$helm" package "$out/chart" --version "$version" --app-version "$version" -d "$out" >&2
pushed=$("$helm" push "$out/llm-operator-$version.tgz" "oci://$registry/charts" 2>&1) || die "helm push: $pushed"
chart_digest=$(sed -n 's/^Digest: //p' <<<"$pushed")
[[ $chart_digest == sha256:* ]] || die "helm push printed no digest: $pushed"
"$py" -m images.sbom --out "$out/sbom" >&2

# sign REF NAME: sign REF (by digest); with a key, attest an SLSA provenance of it too (in CI
# actions/attest-build-provenance writes that with the workflow's identity).
sign() {
  "$cosign" sign --yes "${signing[@]}" "$1" >&2 || die "cosign sign $1 failed"
  [ -n "${COSIGN_KEY:-}" ] || return 0
  "$py" -m images.release provenance "$2" "${1#*@}" >"$out/$2.provenance.json"
  attest "$1" slsaprovenance1 "$out/$2.provenance.json"
}
attest() { # REF TYPE PREDICATE_FILE
  "$cosign" attest --yes "${signing[@]}" --type "$2" --predicate "$3" "$1" >&2 || die "cosign attest --type $2 $1 failed"
}
# Side by side: each step mostly waits on the registry.
jobs=()
while read -r name digest; do
  { sign "$registry/$name@$digest" "$name"; attest "$registry/$name@$digest" cyclonedx "$out/sbom/$name.cdx.json"; } &
  jobs+=($!)
  echo "$registry/$name@$digest"
done < <("$py" -m images.release digests)
sign "$registry/charts/llm-operator@$chart_digest" llm-operator &
jobs+=($!)
for job in "${jobs[@]}"; do wait "$job" || die "signing failed (above)"; done
echo "$registry/charts/llm-operator@$chart_digest"
echo "release: $registry, $version in $((SECONDS - start)) s" >&2
