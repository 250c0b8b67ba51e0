"""KEDA in the test world: the controller behind `autoscaling.provider: keda`, installed for a
test module or a bench by e2e/keda_world.py (docs/development.md, "KEDA").

build-tools.sh (group `keda`) builds KEDA's operator and its metrics API server from the
github.com/kedacore/keda/v2 module at v2.21.0 and copies the module's install manifests (its
kustomize tree, `config/`) beside them. They run as upstream installs them: `config/minimal` (CRDs,
RBAC, the two Deployments and Services, the external metrics APIService; no admission webhooks),
rendered by kubectl's kustomize, as pods on the real node from two one-layer images written here as
upstream's Dockerfiles place the binaries (`/keda`, `/keda-adapter`, user 65532). KEDA generates
and rotates the mutual-TLS certificates between the two itself (`--enable-cert-rotation`, the
Secret `kedaorg-certs`) and patches the APIService's caBundle, as in a real cluster. As pods they
resolve `prometheus.monitoring.svc`, the address the operator writes into ScaledObjects.

The external metrics API is KEDA's alone: the monitoring add-on's prometheus-adapter serves only
custom.metrics.k8s.io (the HPA provider), so v1beta1.external.metrics.k8s.io has no other owner.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import routing

BINARIES = ("keda-operator", "keda-adapter")
RELEASE = "2.21.0"  # build-tools.sh's KEDA_VERSION
NAMESPACE = "keda"
HUB = "localhost/llm-operator"
# binary -> (the image upstream's manifests name, as ours; where its Dockerfile puts the binary).
IMAGES = {
    "keda-operator": (f"{HUB}/keda:{RELEASE}", "/keda"),
    "keda-adapter": (f"{HUB}/keda-metrics-apiserver:{RELEASE}", "/keda-adapter"),
}
DEPLOYMENTS = ("keda-operator", "keda-metrics-apiserver")
APISERVICE = "v1beta1.external.metrics.k8s.io"
SCALED_OBJECTS = "scaledobjects.keda.sh"
# Requests small enough to leave the real node's CPUs to the serving pods of the test; the
# readiness probes start at once (upstream waits 20 s for the operator, 5 s for the adapter).
CPU_REQUEST = "10m"
READINESS_DELAY_S = 1


def config_dir(operator: Path) -> Path:
    """Where build-tools.sh copied the module's `config/` tree."""
    return operator.parent / "config"


def manifests(kubectl: Path, operator: Path) -> list[dict[str, Any]]:
    """KEDA's `config/minimal`, rendered by `kubectl kustomize`, on our images (IfNotPresent) with
    CPU_REQUEST and READINESS_DELAY_S; everything else as upstream ships it."""
    out = subprocess.run(
        [str(kubectl), "kustomize", str(config_dir(operator) / "minimal")],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    by_command = {entry: ref for ref, entry in IMAGES.values()}
    docs = [d for d in yaml.safe_load_all(out) if d]
    for doc in docs:
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            container["image"] = by_command[container["command"][0]]
            container["imagePullPolicy"] = "IfNotPresent"
            container["resources"]["requests"]["cpu"] = CPU_REQUEST
            container["readinessProbe"]["initialDelaySeconds"] = READINESS_DELAY_S
    return docs


def archive(name: str, binary: Path, log: Callable[[str], None]) -> Path:
    """The OCI archive of `name`'s image ("keda-operator" or "keda-adapter"), written unless cached."""
    ref, entry = IMAGES[name]
    return routing.binary_image(ref, entry, binary, name, Path(__file__), log)
