#!/usr/bin/env bash
# `make demo`: the embedded cluster, the CRD, the operator, sample LLMDeployments, status printed.
#
# Leaves the cluster and the operator running so you can explore (`source .cluster/env`, then
# `kubectl get llmd -A`); `make cluster-down` stops both. Re-running restarts the operator.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=.venv/bin/python
ns=${DEMO_NAMESPACE:-llm-demo}

step() { printf '\n== %s\n' "$*"; }

step "cluster (real etcd, kube-apiserver, controller-manager, scheduler; KWOK GPU nodes; real node real-0)"
$py -m e2e.cluster up
export KUBECONFIG="$root/.cluster/kubeconfig"
k() { .cluster/bin/kubectl "$@"; }
k get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,topology.kubernetes.io/zone --no-headers \
  | awk '{printf "  %-28s %-26s x%-3s %s\n", $1, $6, $7, $8}'

step "CRD"
k apply --server-side --force-conflicts -f crds/ >/dev/null
# kubectl wait fails outright while a new CRD has no conditions yet: retry it for up to 30 s.
for _ in $(seq 30); do
  k wait --for=condition=Established crd/llmdeployments.llmoperator.io --timeout=1s >/dev/null 2>&1 && break
  sleep 1
done
k wait --for=condition=Established crd/llmdeployments.llmoperator.io --timeout=1s >/dev/null
echo "  llmdeployments.llmoperator.io established"

step "operator (llm-operator run; log: .cluster/logs/operator.log)"
if [ -f .cluster/operator.pid ] && kill -0 "$(cat .cluster/operator.pid)" 2>/dev/null; then
  kill "$(cat .cluster/operator.pid)"; sleep 1
fi
# cpu-reference pods run for real on real-0, from the cpu-runtime image `up` imported there.
LLMOP_CPU_RUNTIME_IMAGE=localhost/llm-operator/cpu-runtime:dev \
  nohup .venv/bin/llm-operator run --all-namespaces >.cluster/logs/operator.log 2>&1 &
echo $! >.cluster/operator.pid
for _ in $(seq 60); do
  curl -sf http://127.0.0.1:8080/healthz >/dev/null && break
  kill -0 "$(cat .cluster/operator.pid)" 2>/dev/null || { tail -20 .cluster/logs/operator.log; exit 1; }
  sleep 0.5
done
echo "  healthy (metrics: http://127.0.0.1:8000/metrics)"

step "samples in namespace $ns: a CPU model, Llama 3 8B on H100 (prebuilt), Llama 3 70B fp8 tp4 (engine build)"
k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
k -n "$ns" apply -f examples/engine-cache.yaml >/dev/null
for f in cpu-reference llama3-8b-h100 llama3-70b-fp8; do k -n "$ns" apply --server-side -f "examples/$f.yaml"; done

step "waiting for Ready (kubectl wait --for=condition=Ready llmd --all)"
start=$SECONDS
k -n "$ns" wait --for=condition=Ready llmd --all --timeout=180s
echo "  all Ready in $((SECONDS - start)) s"

step "status"
k -n "$ns" get llmd -o wide
echo
k -n "$ns" get pods -o wide --no-headers | awk '{printf "  %-28s %-8s %s\n", $1, $3, $7}'
echo
k -n "$ns" get jobs,statefulsets,services,hpa --no-headers | sed 's/^/  /'
echo
k -n "$ns" get llmd llama3-70b -o jsonpath='{range .status.conditions[*]}  {.type}={.status} ({.reason}) {.message}{"\n"}{end}'
echo "  placement: $(k -n "$ns" get llmd llama3-70b -o jsonpath='{.status.placement.reason}')"
echo "  engine:    $(k -n "$ns" get llmd llama3-70b -o jsonpath='{.status.engine.cacheKey}')"
printf '\nExplore: source .cluster/env && kubectl -n %s get llmd\nStop:    make cluster-down\n' "$ns"
