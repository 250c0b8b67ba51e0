#!/usr/bin/env bash
# `make test` after lint: the e2e tier and the other tiers (unit, Triton on CPU, images, gitops)
# at the same time. The e2e tier spends most of its time waiting on the cluster (pods starting,
# analysis windows, HPA syncs) while the other tiers need the CPU, so together they take about
# the e2e tier's time instead of both one after the other. The e2e tier runs in two parts: first
# the modules marked `exclusive` (they need the cluster to themselves), then the rest in
# E2E_STREAMS (default 2) pytest-xdist streams sharing one operator (tests/e2e/streams.py). This
# script holds a lease on the embedded cluster across both, so it starts once. The e2e tier prints
# as it goes; the other tiers' output follows it, whole. Any part failing fails the run.
# PYTEST_ADDOPTS reaches every part.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
log=$(mktemp)
# How busy the machine's CPUs were over a part (from /proc/stat): whether a part waits or computes,
# the figure test-time work starts from.
cpu_now() { read -r _ user nice system idle iowait irq softirq steal _ </proc/stat
  echo "$((user + nice + system + irq + softirq + steal)) $((idle + iowait)) $SECONDS"; }
cpu_since() { read -r busy0 idle0 t0 <<<"$1"; read -r busy1 idle1 t1 <<<"$(cpu_now)"
  echo "$2: $((t1 - t0)) s, CPUs $(( 100 * (busy1 - busy0) / (busy1 - busy0 + idle1 - idle0 + 1) ))% busy"; }
run_start=$(cpu_now)
release_cluster=:
trap 'rm -f "$log"; eval "$release_cluster"' EXIT

# KEDA, for its tests (tests/e2e/test_keda.py and test_scale_to_zero.py, exclusive), LWS, for its
# test (tests/e2e/test_lws_multi_node.py, exclusive), and cosign, for the release test (late in the
# e2e tier); each waits on this build's lock: cold they build for minutes (KEDA about 14, trimmed), at
# the lowest priority beside the tiers instead of before them in `make tools`.
nice -n 19 e2e/cluster/build-tools.sh keda lws release >/dev/null 2>&1 &
release_tools=$!
# The clients' environments (tests/e2e/clients.py: aiperf, inference-perf, guidellm, LiteLLM), for
# test_routing.py and test_llmapi_contract.py, which wait on each environment's lock: cold about 6
# minutes in all, mostly downloads, beside the tiers rather than in the e2e tier's way.
PYTHONPATH=.:operator nice -n 19 "$PY" -m tests.e2e.clients >/dev/null 2>&1 &
client_envs=$!
"$PY" -m pytest -p no:cacheprovider --durations=10 -m "not e2e" >"$log" 2>&1 &
others=$!
trap 'kill "$others" "$release_tools" "$client_envs" 2>/dev/null; exit 130' INT TERM
embedded=1
if [ -n "${KUBECONFIG:-}" ] && [ "$(realpath -m "$KUBECONFIG")" != "$(realpath -m .cluster/kubeconfig)" ]; then
  embedded=0  # the tests use that cluster as it is (tests/e2e/conftest.py)
fi
if [ $embedded = 1 ]; then  # a failure here is the first test's to report
  "$PY" -m e2e.cluster up --with all --session $$ >/dev/null
  release_cluster="$PY -m e2e.cluster release --session $$ >/dev/null"
fi
part_start=$(cpu_now)
"$PY" -m pytest -p no:cacheprovider --durations=12 -m "e2e and exclusive"
exclusive=$?
timing=$(cpu_since "$part_start" "the exclusive e2e part")
part_start=$(cpu_now)
"$PY" -m pytest -p no:cacheprovider --durations=15 -m "e2e and not exclusive" -n "${E2E_STREAMS:-2}"
streams=$?
timing="$timing; $(cpu_since "$part_start" "the e2e streams")"
e2e=$((exclusive > streams ? exclusive : streams))
wait "$others"
rest=$?
wait "$release_tools"
wait "$client_envs"

echo
echo "=== the other tiers (unit, Triton on CPU, images, gitops), run beside the e2e tier ==="
cat "$log"
echo "=== $timing; $(cpu_since "$run_start" "in all") ==="
echo "=== e2e tier: exit $e2e; other tiers: exit $rest ==="
# pytest's own codes (1 tests failed, 2 interrupted, ...): the larger one tells the worse story.
exit $((e2e > rest ? e2e : rest))
