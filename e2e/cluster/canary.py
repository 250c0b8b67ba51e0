"""Canary rollouts on the real node: the deployment, a status recorder and the traffic, shared by
tests/e2e/test_canary.py and `make bench` (P6).

The deployment is the cpu-reference example at 250m CPU with two replicas (three pods fit on the
real node's 2 CPUs while a canary runs beside them). Analysis windows are short (the test world's
Prometheus scrapes every 2 s) so a whole canary takes minutes, not hours.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster.testing import Kubectl

REPO = Path(__file__).resolve().parents[2]
NAME = "tiny-llama"
INTERVAL_S = 10  # analysis interval (and window)


def deployment(
    prometheus_url: str,
    *,
    steps: list[dict[str, Any]] | None = None,
    analysis: dict[str, Any] | None = None,
    routing: str = "replica-ratio",
    parent_refs: list[dict[str, Any]] | None = None,
    replicas: int = 2,
) -> dict[str, Any]:
    """tiny-llama with a canary strategy; `analysis` overrides the defaults below (None values
    remove a key; analysis={} keeps the defaults; pass analysis=None... use `without_analysis`)."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = "250m"
    doc["spec"]["replicas"] = replicas
    canary: dict[str, Any] = {
        "steps": steps or [{"weight": 25, "pauseSeconds": 5}, {"weight": 50, "pauseSeconds": 5}],
        "trafficRouting": routing,
        "analysis": {
            "prometheus": {"url": prometheus_url},
            "intervalSeconds": INTERVAL_S,
            "minRequests": 5,
            "maxErrorRatePercent": 5,
            "maxTimeToFirstTokenMilliseconds": 1000,
            **(analysis or {}),
        },
    }
    if parent_refs is not None:
        canary["gateway"] = {"parentRefs": parent_refs}
    doc["spec"]["rollout"] = {"strategy": "canary", "canary": canary}
    return doc


def without_analysis(doc: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    doc["spec"]["rollout"]["canary"].pop("analysis", None)
    return doc


def with_env(doc: dict[str, Any], **env: str) -> dict[str, Any]:
    """The same deployment with extra serving environment: a new revision."""
    doc = copy.deepcopy(doc)
    doc["spec"]["runtime"]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return doc


def revisions(obj: dict[str, Any] | None) -> dict[str, Any]:
    return dict(((obj or {}).get("status") or {}).get("revisions") or {})


@dataclass
class Sample:
    t: float  # monotonic
    revisions: dict[str, Any]
    conditions: dict[str, tuple[str, str]]  # type -> (status, reason)


@dataclass
class Recorder:
    """Polls the LLMDeployment's status twice a second in a thread: what it went through."""

    kubectl: Kubectl
    namespace: str
    name: str = NAME
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Recorder:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            obj = self.kubectl.get("llmdeployment", self.name, self.namespace)
            conds = {
                c["type"]: (c["status"], c["reason"])
                for c in ((obj or {}).get("status") or {}).get("conditions", [])
            }
            self.samples.append(Sample(time.monotonic(), revisions(obj), conds))
            self._stop.wait(0.5)

    def first(self, pred: Callable[[Sample], bool]) -> Sample | None:
        return next((s for s in list(self.samples) if pred(s)), None)

    def seen(self, key: str) -> list[Any]:
        """The distinct values `revisions[key]` took, in order."""
        out: list[Any] = []
        for s in list(self.samples):
            v = s.revisions.get(key)
            if v is not None and (not out or out[-1] != v):
                out.append(v)
        return out


def serving_pods(kubectl: Kubectl, namespace: str, name: str = NAME) -> dict[str, dict[str, Any]]:
    """Leader pods by name: uid, revision, slot, restarts, ready."""
    pods = kubectl.items("pods", namespace, f"llmoperator.io/deployment={name},llmoperator.io/role=leader")
    out = {}
    for p in pods:
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        labels = p["metadata"]["labels"]
        out[p["metadata"]["name"]] = {
            "uid": p["metadata"]["uid"],
            "revision": labels.get("llmoperator.io/revision"),
            "slot": labels.get("llmoperator.io/slot"),
            "restarts": sum(int(c.get("restartCount", 0)) for c in statuses),
            "terminating": bool(p["metadata"].get("deletionTimestamp")),
        }
    return out
