#!/usr/bin/env bash
# `make demo`: the embedded cluster's core, the operator installed from the Helm chart (make
# operator-up), sample LLMDeployments, a chat completion streamed through the official openai SDK
# first, then status, a canary rollout, autoscaling and LLM-aware routing, each once the components
# it needs are built and started (the cluster's add-ons, e2e/cluster/addons.py: they build in the
# background while the first steps run).
#
# Leaves the cluster and the operator running so you can explore (`source .cluster/env`, then
# `kubectl get llmd -A`); `make cluster-down` stops both. Re-running upgrades the operator.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=.venv/bin/python
ns=${DEMO_NAMESPACE:-llm-demo}
started=${LLMOP_DEMO_START:-$EPOCHREALTIME} # `make demo` sets it before the Python environment

step() { printf '\n== %s\n' "$*"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
elapsed() { awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { s = b - a; printf "%d min %02d s", s / 60, s % 60 }'; }

step "building what the first steps need (a warm run only checks the caches; cold builds print their times)"
# The images (debootstrap and pip: mostly downloads and disk) build beside the Go builds (CPU).
$py -m images.builder pause operator cpu-runtime fetch launcher 2>&1 >/dev/null | sed -u 's/^/  /' &
images=$!
e2e/cluster/build-tools.sh core 2>&1 >/dev/null | sed -u 's/^/  /'
# What the later steps need builds next, at the lowest priority, beside the cluster's start and the
# first answer: Prometheus and prometheus-adapter for autoscaling, the endpoint picker and Envoy
# for routing.
mkdir -p "${LLMOP_CACHE:-$HOME/.cache/llm-operator}/logs"
addons_log=${LLMOP_CACHE:-$HOME/.cache/llm-operator}/logs/demo-addons.log
nice -n 19 e2e/cluster/build-tools.sh monitoring routing >/dev/null 2>"$addons_log" &
echo "  building in the background for the later steps: monitoring, routing (log: $addons_log)"
wait "$images"

step "cluster (real etcd, kube-apiserver, controller-manager, scheduler; KWOK GPU nodes; real node real-0)"
$py -m e2e.cluster up
export KUBECONFIG="$root/.cluster/kubeconfig"
k() { .cluster/bin/kubectl "$@"; }
k get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count,topology.kubernetes.io/zone --no-headers \
  | awk '{printf "  %-28s %-26s x%-3s %s\n", $1, $6, $7, $8}'

step "operator (make operator-up: the Helm chart, local images, a pod on real-0 under the chart's RBAC)"
$py -m e2e.operator_release up | sed 's/^/  /'

step "samples in namespace $ns: SmolLM2 and a tiny model on CPU, Llama 3 8B on H100 (prebuilt), Llama 3 70B fp8 tp4 (engine build)"
k create namespace "$ns" --dry-run=client -o yaml | k apply -f - >/dev/null
# Every pod the operator renders meets restricted Pod Security: the namespace enforces it.
for mode in enforce warn audit; do
  k label --overwrite namespace "$ns" "pod-security.kubernetes.io/$mode=restricted" >/dev/null
done
# The demo turns on autoscaling and a canary for tiny-llama below: a second run starts it afresh.
k -n "$ns" delete llmd tiny-llama --ignore-not-found --wait=true >/dev/null
# The engine cache's and calibration data's volumes outlive a deleted demo namespace (Retain): let
# the new claims bind them.
for pv in llm-engine-cache llm-calibration; do
  if [ "$(k get pv "$pv" -o jsonpath='{.status.phase}' 2>/dev/null)" = Released ]; then
    k patch pv "$pv" --type=json -p '[{"op": "remove", "path": "/spec/claimRef"}]' >/dev/null
  fi
done
k -n "$ns" apply -f examples/engine-cache.yaml >/dev/null
applied=$EPOCHREALTIME
k -n "$ns" apply --server-side -f examples/smollm2.yaml
k -n "$ns" apply --server-side -f examples/cpu-reference.yaml
# The GPU examples fetch s3:// models into the model cache; the demo's simulated GPU nodes serve
# nothing, so they read a directory of the engine cache's claim in place instead.
for f in llama3-8b-h100 llama3-70b-fp8; do
  sed -e 's#source: {uri: s3://models/\([^/}]*\)/*}#source: {uri: pvc://llm-engine-cache/models/\1}#' \
      -e '/cache: {claimName: llm-model-cache}/d' "examples/$f.yaml" | k -n "$ns" apply --server-side -f -
done

step "waiting for smollm2 Ready (kubectl wait --for=condition=Ready llmd/smollm2)"
# smollm2 runs for real on real-0: its pod is Ready once Triton has loaded the model.
k -n "$ns" wait --for=condition=Ready llmd/smollm2 --timeout=240s >/dev/null
echo "  smollm2 (cpu-reference, a real pod) applied -> Ready in $(since "$applied") s"

step "the OpenAI API: the official openai SDK at status.endpoints.openai, a chat completion streamed"
# The base URL is the status's (kubectl get llmd shows it as URL); the answer is printed as it
# arrives. SmolLM2-135M-Instruct is a real (small) instruct model, greedy here: it answers in words.
$py -m e2e.chat -n "$ns" smollm2 "What is the capital of France, and what is it famous for?" --model smollm2 --max-tokens 80
echo "  (the first answer, $(elapsed) after make demo started)"

step "tiny-llama: the tests' tiny model (random weights drawn from a seed: deterministic gibberish)"
k -n "$ns" wait --for=condition=Ready llmd/tiny-llama --timeout=180s >/dev/null
$py -m e2e.chat -n "$ns" tiny-llama "Tell me a story about a tiny llama." --model tiny-llama --max-tokens 60

k -n "$ns" wait --for=condition=Ready llmd --all --timeout=180s >/dev/null
echo "  all Ready in $(since "$applied") s"

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

step "Triton's own API: a prompt to tiny-llama through its Service (ClusterIP, kube-proxy), streamed back"
$py -m e2e.generate -n "$ns" tiny-llama "Once upon a time" --max-tokens 120

step "a canary rollout: a new revision of tiny-llama beside the old one, 50 % for 10 s, then promoted"
# The new revision asks for half a CPU: it must fit on the real node beside the one it replaces.
k -n "$ns" patch llmd tiny-llama --type=merge -p '{"spec":{
  "rollout":{"strategy":"canary","canary":{"steps":[{"weight":50,"pauseSeconds":10}]}},
  "runtime":{"env":[{"name":"RELEASE","value":"demo-2"}]},"resources":{"cpu":"500m"}}}' >/dev/null
# Each change of status.revisions, as `kubectl get llmd -w` would show it, until promoted.
$py - "$ns" <<'PY'
import json, subprocess, sys, time
ns, seen, deadline = sys.argv[1], None, time.monotonic() + 240
while time.monotonic() < deadline:
    out = subprocess.run([".cluster/bin/kubectl", "-n", ns, "get", "llmd", "tiny-llama", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    r = json.loads(out).get("status", {}).get("revisions", {})
    now = (r.get("phase"), r.get("canary"), r.get("canaryWeight"), r.get("stable"))
    if now != seen:
        seen = now
        print(f"  {r.get('phase', '?'):<11} stable {r.get('stable')} ({r.get('stableSlot')})"
              + (f", canary {r['canary']} ({r.get('canarySlot')}) weight {r.get('canaryWeight')} %" if r.get("canary") else "")
              + f": {r.get('message', '')}")
    if r.get("phase") == "Stable" and r.get("stableSlot") == "b":
        break
    time.sleep(1)
else:
    print("  not promoted within 240 s; the conditions say why:")
    for c in json.loads(out).get("status", {}).get("conditions", []):
        print(f"    {c['type']}={c['status']} {c['reason']}: {c.get('message', '')}")
PY
k -n "$ns" get pods -l llmoperator.io/deployment=tiny-llama -L llmoperator.io/slot,llmoperator.io/revision | sed 's/^/  /'


step "autoscaling on Triton's queue: Prometheus (recording rules) -> prometheus-adapter -> the real HPA"
echo "  waiting for the monitoring add-on: built in the background (log: $addons_log), then started"
begun=$EPOCHREALTIME
$py -m e2e.cluster up --with monitoring | grep -E '^(cold build|cluster|prometheus)' | sed 's/^/  /'
echo "  monitoring ready after $(since "$begun") s"
# Turned on live, as a user would: the HPA scales tiny-llama through its scale subresource.
k -n "$ns" patch llmd tiny-llama --type=merge -p \
  '{"spec":{"autoscaling":{"minReplicas":1,"maxReplicas":2,"metric":"pending-requests","target":"4"}}}' >/dev/null
if k -n "$ns" wait --for=condition=AutoscalingActive llmd/tiny-llama --timeout=120s >/dev/null; then
  k -n "$ns" get hpa tiny-llama | sed 's/^/  /'
  k get --raw "/apis/custom.metrics.k8s.io/v1beta2/namespaces/$ns/pods/*/triton_pending_requests" \
    | $py -c 'import json, sys
for i in json.load(sys.stdin)["items"]:
    print("  custom metric", i["metric"]["name"], "of pod", i["describedObject"]["name"], "=", i["value"])'
else
  k -n "$ns" get llmd tiny-llama -o jsonpath='  {.status.conditions[?(@.type=="AutoscalingActive")].message}{"\n"}'
fi
# The simulated GPU pods run nothing, so their HPA has no metric: the condition says so.
echo "  llama3-70b: $(k -n "$ns" get llmd llama3-70b -o jsonpath='{.status.conditions[?(@.type=="AutoscalingActive")].reason}: {.status.conditions[?(@.type=="AutoscalingActive")].message}')"

step "LLM-aware routing: the endpoint picker (Gateway API Inference Extension) and Envoy in front of tiny-llama"
echo "  waiting for the routing add-on: built in the background (log: $addons_log), then started"
begun=$EPOCHREALTIME
$py -m e2e.cluster up --with routing | grep -E '^(cold build|cluster)' | sed 's/^/  /'
echo "  routing ready after $(since "$begun") s"
# spec.routing.mode inference-pool: an InferencePool of the serving pods, and a router (Envoy asking
# the picker which replica has the shortest queue and the most free KV cache); status.endpoints.openai
# becomes the router's URL.
k -n "$ns" patch llmd tiny-llama --type=merge -p '{"spec":{"routing":{"mode":"inference-pool"}}}' >/dev/null
k -n "$ns" wait --for=condition=Ready llmd/tiny-llama --timeout=180s >/dev/null
k -n "$ns" get inferencepool,deploy -l llmoperator.io/deployment=tiny-llama --no-headers | sed 's/^/  /'
echo "  status.endpoints.openai: $(k -n "$ns" get llmd tiny-llama -o jsonpath='{.status.endpoints.openai}')"
$py -m e2e.chat -n "$ns" tiny-llama "Where do llamas live?" --model tiny-llama --max-tokens 40

echo
echo "make demo done in $(elapsed)."
cat <<EOF

Explore: source .cluster/env && kubectl -n $ns get llmd,pods
  the operator:  kubectl -n llm-operator-system logs deploy/llm-operator
  Triton:        kubectl -n $ns logs -l llmoperator.io/deployment=tiny-llama,llmoperator.io/role=leader
  from the host: kubectl -n $ns port-forward svc/tiny-llama 8000:8000 8080:8080 &
                 curl -N localhost:8080/v1/completions -H 'Content-Type: application/json' -d '{"model": "tiny-llama", "prompt": "Hi", "max_tokens": 40, "stream": true}'
                 curl localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\
                   -d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 40}'
  the APIs:      docs/serving-api.md
Stop:    make cluster-down
EOF
