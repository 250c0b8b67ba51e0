"""LeaderWorkerSet in the test world: the controller behind multi-node replicas rendered as
LeaderWorkerSets, installed by tests/e2e/test_lws_multi_node.py only (docs/development.md,
"LeaderWorkerSet").

build-tools.sh (group `lws`) builds LWS's manager (cmd/main.go: the LeaderWorkerSet and pod
controllers, their admission webhooks) from the sigs.k8s.io/lws module at v0.9.0 and copies the
module's install manifests (its kustomize tree, `config/`) beside it. It runs as upstream installs
it: `config/default` (the CRDs, RBAC, the manager's Deployment and configuration, the webhook
Service and the mutating/validating webhook configurations), rendered by kubectl's kustomize, as a
pod on the real node from a one-layer image written here as upstream's Dockerfile places the
binary (`/manager`, user 65532). LWS makes and rotates its webhook certificate itself
(`internalCertManagement`, open-policy-agent/cert-controller: the Secret `lws-webhook-server-cert`)
and writes its CA into both webhook configurations, as in a real cluster; the API server reaches the
webhooks through the Service's ClusterIP, like every other Service in this world.

Upstream's pod webhook is what makes a group a group: it labels each pod with its group index and
key and sets LWS_LEADER_ADDRESS, which the operator's launcher reads (runtime/config.py).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import routing

BINARY = "lws-manager"
RELEASE = "0.9.0"  # build-tools.sh's LWS_VERSION
NAMESPACE = "lws-system"
IMAGE = f"localhost/llm-operator/lws:{RELEASE}"
ENTRY = "/manager"  # where upstream's Dockerfile puts the binary
DEPLOYMENT = "lws-controller-manager"
CERT_SECRET = "lws-webhook-server-cert"
WEBHOOKS = {
    "MutatingWebhookConfiguration": "lws-mutating-webhook-configuration",
    "ValidatingWebhookConfiguration": "lws-validating-webhook-configuration",
}
CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
# One replica, not upstream's two (leader election between them only delays the start), with a
# request small enough to leave the real node's CPUs to the serving pods (upstream: 1 CPU, 1 GiB);
# its readiness probe starts at once (upstream waits 5 s).
CPU_REQUEST, MEMORY_REQUEST = "10m", "64Mi"
READINESS_DELAY_S = 1


def config_dir(manager: Path) -> Path:
    """Where build-tools.sh copied the module's `config/` tree."""
    return manager.parent / "config"


def manifests(kubectl: Path, manager: Path) -> list[dict[str, Any]]:
    """LWS's `config/default`, rendered by `kubectl kustomize`, on our image (IfNotPresent) with one
    replica, CPU_REQUEST/MEMORY_REQUEST and READINESS_DELAY_S; everything else as upstream ships it."""
    out = subprocess.run(
        [str(kubectl), "kustomize", str(config_dir(manager) / "default")],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        doc["spec"]["replicas"] = 1
        for container in doc["spec"]["template"]["spec"]["containers"]:
            container["image"] = IMAGE
            container["imagePullPolicy"] = "IfNotPresent"
            container["resources"]["requests"] = {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST}
            container["readinessProbe"]["initialDelaySeconds"] = READINESS_DELAY_S
    return docs


def archive(binary: Path, log: Callable[[str], None]) -> Path:
    """The OCI archive of the manager's image, written unless cached."""
    return routing.binary_image(IMAGE, ENTRY, binary, "lws", Path(__file__), log)
