"""Scaling and canaries of a multi-node deployment on the real node, for test_cpu_multi_node.py:
its groups' pods as they are seen, the HPA's reading, and the rollout strategy the canary test adds
to the deployment."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from typing import Any

from e2e.cluster.testing import Kubectl, pod_ready

INTERVAL_S = 10  # the canary's analysis interval (and window): the test world scrapes every 2 s


def groups(pods: dict[str, dict[str, Any]], name: str, slot_base: str | None = None) -> dict[int, list[str]]:
    """Group index -> its members' pod names (leader first), of pods named as the StatefulSet
    shape names them: `<base>-<i>` leads group i, `<base>-g<i>-<n>` are its workers."""
    base = slot_base or name
    out: dict[int, list[str]] = {}
    for pod in sorted(pods):
        rest = pod.removeprefix(f"{base}-")
        if rest == pod:
            continue
        if rest.isdigit():
            out.setdefault(int(rest), []).insert(0, pod)
        elif rest.startswith("g") and rest[1:].split("-")[0].isdigit():
            out.setdefault(int(rest[1:].split("-")[0]), []).append(pod)
    return out


def whole_and_ready(pods: dict[str, dict[str, Any]], members: list[str]) -> bool:
    return all(pod_ready(pods.get(m)) for m in members)


@dataclass
class HalfGroups:
    """Samples of the deployment while it scales: any moment its status counted more ready
    replicas than there were groups with every member Ready is a half group counted as serving."""

    seen: list[str] = field(default_factory=list)

    def sample(self, ready_replicas: int, pods: dict[str, dict[str, Any]], name: str, size: int) -> None:
        whole = [g for g, m in groups(pods, name).items() if len(m) == size and whole_and_ready(pods, m)]
        if ready_replicas > len(whole):
            self.seen.append(f"readyReplicas {ready_replicas} with whole groups {whole}: {sorted(pods)}")


def hpa_metric(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    """The HPA's current average of its Pods metric, as `kubectl get hpa` shows it, or None
    (<unknown>)."""
    hpa = kubectl.get("hpa", name, namespace) or {}
    for metric in (hpa.get("status") or {}).get("currentMetrics") or []:
        value = ((metric.get("pods") or {}).get("current") or {}).get("averageValue")
        if value is not None:
            return str(value)
    return None


def scale_selector(kubectl: Kubectl, namespace: str, name: str) -> str:
    """The selector the deployment's scale subresource gives the HPA."""
    path = f"/apis/llmoperator.io/v1alpha1/namespaces/{namespace}/llmdeployments/{name}/scale"
    return str(json.loads(kubectl("get", "--raw", path).stdout)["status"]["selector"])


def autoscaled(doc: dict[str, Any], low: int, high: int) -> dict[str, Any]:
    """The deployment scaled by an HPA between `low` and `high` groups on its leaders' pending
    requests; spec.replicas left to the HPA (this manager's apply would set it back otherwise)."""
    doc = copy.deepcopy(doc)
    doc["spec"].pop("replicas", None)
    doc["spec"]["autoscaling"] = {
        "provider": "hpa", "minReplicas": low, "maxReplicas": high, "metric": "pending-requests",
        "target": "4",
    }  # fmt: skip
    return doc


def with_canary(doc: dict[str, Any], prometheus: str) -> dict[str, Any]:
    """One step at weight 50 (replica-ratio: the canary's group beside the stable one), analysed
    every INTERVAL_S on the revisions' leaders' Triton metrics."""
    doc = copy.deepcopy(doc)
    analysis = {
        "prometheus": {"url": prometheus}, "intervalSeconds": INTERVAL_S, "minRequests": 5,
        "maxErrorRatePercent": 5,
    }  # fmt: skip
    canary = {
        "steps": [{"weight": 50, "pauseSeconds": 5}],
        "trafficRouting": "replica-ratio",
        "analysis": analysis,
    }
    doc["spec"]["rollout"] = {"strategy": "canary", "canary": canary}
    return doc


def since(start: float) -> str:
    return f"{time.monotonic() - start:.1f} s"
