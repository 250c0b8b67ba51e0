#!/usr/bin/env bash
# `make test` after lint: the e2e tier and the other tiers (unit, Triton on CPU, images, gitops)
# at the same time. The e2e tier spends most of its time waiting on the cluster (pods starting,
# analysis windows, HPA syncs) while the other tiers need the CPU, so together they take about
# the e2e tier's time instead of both one after the other. The e2e tier prints as it goes; the
# other tiers' output follows it, whole. Either failing fails the run. PYTEST_ADDOPTS reaches both.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# cosign, for the release test (late in the e2e tier, which waits on this build's lock): cold it
# builds for minutes, at the lowest priority beside the tiers instead of before them in `make tools`.
nice -n 19 e2e/cluster/build-tools.sh release >/dev/null 2>&1 &
release_tools=$!
"$PY" -m pytest -p no:cacheprovider -m "not e2e" >"$log" 2>&1 &
others=$!
trap 'kill "$others" "$release_tools" 2>/dev/null; exit 130' INT TERM
"$PY" -m pytest -p no:cacheprovider -m e2e
e2e=$?
wait "$others"
rest=$?
wait "$release_tools"

echo
echo "=== the other tiers (unit, Triton on CPU, images, gitops), run beside the e2e tier ==="
cat "$log"
echo "=== e2e tier: exit $e2e; other tiers: exit $rest ==="
# pytest's own codes (1 tests failed, 2 interrupted, ...): the larger one tells the worse story.
exit $((e2e > rest ? e2e : rest))
