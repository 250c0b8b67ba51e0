"""The operator as the test world runs it as a local process (tests/e2e/operator_fixtures.py,
bench/world.py): the images its serving pods use on the real node and the peers its
NetworkPolicies admit to their metrics ports."""

from __future__ import annotations

from e2e.cluster.netns import NODE_IP

# cpu-reference serving pods run this image on the embedded cluster's real node, which has it
# imported at `up` (images.builder); a `:dev` tag means imagePullPolicy IfNotPresent.
CPU_RUNTIME_IMAGE = "localhost/llm-operator/cpu-runtime:dev"
# The init container of every serving pod copies the launcher from the launcher image, tagged by
# the operator with the content hash of the files it copies (render/inject.py); `up` pushes it under
# that tag (images.builder names it so), and the node pulls it through its mirror of localhost.
LAUNCHER_REPOSITORY = "localhost/llm-operator/launcher"
# The test world's Prometheus is a process on the node address, not a pod in `monitoring`: the
# serving pods' NetworkPolicies admit their metrics port from there (e2e/cluster/monitoring.py).
METRICS_PEERS = f"{NODE_IP}/32"

ENV = {
    "LLMOP_CPU_RUNTIME_IMAGE": CPU_RUNTIME_IMAGE,
    "LLMOP_LAUNCHER_IMAGE_REPOSITORY": LAUNCHER_REPOSITORY,
    "LLMOP_METRICS_PEERS": METRICS_PEERS,
}
