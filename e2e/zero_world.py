"""What a scale-to-zero run on the embedded cluster stands on (tests/e2e/test_scale_to_zero.py,
bench/zero.py): completions sent through a router's Service from the cluster's network namespace,
streamed ones read line by line, a deployment seen at zero, and the wake-up's phases as the API and
Prometheus show them while it happens."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from llm_operator.contract import OPENAI_PORT
from llm_operator.render.scale_to_zero import PICKER_QUEUE

from e2e.cluster import netns
from e2e.cluster.load import prometheus_query
from e2e.cluster.testing import Kubectl, condition

DEPLOYMENT_LABEL = "llmoperator.io/deployment"


@dataclass(frozen=True)
class Router:
    """A router's Service as the cluster's network namespace reaches it."""

    netns: str
    ip: str


@dataclass
class Answer:
    sent: float
    status: int = 0
    text: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    done: float = 0.0


@dataclass
class Streamed(Answer):
    """A streamed request read line by line: (seconds after sending, line) for each."""

    lines: list[tuple[float, str]] = field(default_factory=list)

    @property
    def first_token(self) -> float | None:
        """Seconds from sending to the first data event (the model's first token), if one came."""
        return next((at for at, text in self.lines if text.startswith("data: ")), None)


def complete(router: Router, body: dict[str, Any], answer: Answer, timeout: float) -> None:
    """An unstreamed completion through the router: the answer's status, fields and text."""
    conn = netns.HTTPConnection(router.netns, router.ip, OPENAI_PORT, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        raw = response.read().decode()
        answer.status, answer.headers = response.status, {k.lower(): v for k, v in response.getheaders()}
        answer.text = json.loads(raw)["choices"][0]["text"] if response.status == 200 else raw
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        answer.text = f"{type(e).__name__}: {e}"
    finally:
        answer.done = time.time()
        conn.close()


def stream(router: Router, body: dict[str, Any], answer: Streamed, timeout: float) -> None:
    """A raw streamed completion through the router, read line by line as it comes: held at zero,
    the waker sends `: waking` comments before the first token (docs/autoscaling.md, "Progress
    while held")."""
    conn = netns.HTTPConnection(router.netns, router.ip, OPENAI_PORT, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                     {"content-type": "application/json"})  # fmt: skip
        response = conn.getresponse()
        answer.status, answer.headers = response.status, {k.lower(): v for k, v in response.getheaders()}
        while line := response.readline():
            answer.lines.append((time.time() - answer.sent, line.decode().rstrip("\n")))
        data = [text.removeprefix("data: ") for _, text in answer.lines if text.startswith("data: ")]
        answer.text = "".join(json.loads(d)["choices"][0]["text"] for d in data if d != "[DONE]")
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        answer.text = f"{type(e).__name__}: {e}"
    finally:
        answer.done = time.time()
        conn.close()


def at_zero(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    """The deployment, once KEDA set it to 0 replicas, the operator's status says so and no
    serving pod is left."""
    ld = kubectl.get("llmdeployment", name, namespace)
    if ld is None or ld["spec"].get("replicas") != 0:
        return None
    if kubectl.items("pods", namespace, f"{DEPLOYMENT_LABEL}={name}"):
        return None
    ready = condition(ld, "Ready") or {}
    return ld if (ready.get("status"), ready.get("reason")) == ("True", "ScaledToZero") else None


def timestamp(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def pod_times(kubectl: Kubectl, namespace: str, name: str) -> tuple[float, float]:
    """The first serving pod's creation and Ready times (the API's, to the second)."""
    pods = kubectl.items("pods", namespace, f"{DEPLOYMENT_LABEL}={name}")
    pod = min(pods, key=lambda p: str(p["metadata"]["creationTimestamp"]))
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    return timestamp(pod["metadata"]["creationTimestamp"]), timestamp(ready["lastTransitionTime"])


# A pod's phases in the order they happen, each read from the pod object as it is polled.
POD_PHASES = ("created", "scheduled", "started", "ready")


def _true(pod: dict[str, Any], type_: str) -> bool:
    return (condition(pod, type_) or {}).get("status") == "True"


def pod_phases(pod: dict[str, Any]) -> set[str]:
    """Which of POD_PHASES a pod object has reached: scheduled (PodScheduled), started (every
    container running: its init containers are done), ready (Ready)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    running = bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)
    reached = {"created"} | ({"scheduled"} if _true(pod, "PodScheduled") else set())
    return reached | ({"started"} if running else set()) | ({"ready"} if _true(pod, "Ready") else set())


class Phases:
    """When each step of a wake-up was first seen: Prometheus polled every `period` s for the
    requests the picker holds, the deployment and its serving pods watched (each object timed as
    kubectl prints it: a poll would lag by a kubectl run on the busy node). `first` has "held",
    "replicas" and, once every serving pod seen has reached it, each of POD_PHASES ("created" at
    the first pod), as time.time(); `held` the most held at a scrape."""

    def __init__(
        self, kubectl: Kubectl, prometheus: str, namespace: str, name: str, period: float = 0.25
    ) -> None:
        self.kubectl, self.prometheus, self.namespace, self.name = kubectl, prometheus, namespace, name
        self.period = period
        self.first: dict[str, float] = {}
        self.held = 0.0
        self.pods: dict[str, dict[str, Any]] = {}  # the last object of each serving pod seen
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watches: list[subprocess.Popen[str]] = []
        self._threads = [threading.Thread(target=self._poll, daemon=True)]

    def __enter__(self) -> Phases:
        for what in (["llmdeployment", self.name], ["pods", f"--selector={DEPLOYMENT_LABEL}={self.name}"]):
            argv = [self.kubectl.binary, f"--kubeconfig={self.kubectl.kubeconfig}", "get", *what,
                    f"--namespace={self.namespace}", "--watch", "--output=json"]  # fmt: skip
            watch = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._watches.append(watch)
            self._threads.append(threading.Thread(target=self._read, args=(watch,), daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for watch in self._watches:
            watch.terminate()
            watch.wait(timeout=10)
        for thread in self._threads:
            thread.join(timeout=10)

    def _poll(self) -> None:
        query = f'sum({PICKER_QUEUE}{{namespace="{self.namespace}",inference_pool="{self.name}"}})'
        while not self._stop.wait(self.period):
            try:
                held = max(prometheus_query(self.prometheus, query).values(), default=0.0)
            except (OSError, ValueError):
                continue
            with self._lock:
                if held > 0:
                    self.first.setdefault("held", time.time())
                self.held = max(self.held, held)

    def _read(self, watch: subprocess.Popen[str]) -> None:
        """kubectl prints each object as indented JSON, ending with a `}` line of its own."""
        assert watch.stdout is not None
        lines: list[str] = []
        for line in watch.stdout:
            lines.append(line)
            if line.rstrip("\n") == "}":
                now = time.time()
                with self._lock:
                    self._saw([json.loads("".join(lines))], now)
                lines.clear()

    def _saw(self, items: list[dict[str, Any]], now: float) -> None:
        for obj in items:
            meta = obj["metadata"]
            if obj["kind"] == "LLMDeployment" and meta["name"] == self.name:
                if (obj["spec"].get("replicas") or 0) > 0:
                    self.first.setdefault("replicas", now)
            elif obj["kind"] == "Pod" and (meta.get("labels") or {}).get(DEPLOYMENT_LABEL) == self.name:
                self.pods[meta["name"]] = obj
        if self.pods:
            self.first.setdefault("created", now)
        for phase in POD_PHASES[1:]:
            if self.pods and all(phase in pod_phases(p) for p in self.pods.values()):
                self.first.setdefault(phase, now)

    def api_times(self) -> dict[str, float]:
        """The same pod phases from the API's own timestamps (to the second), over the pods seen:
        creation the earliest; each other phase the latest of the pods, once all have reached it."""
        pods = list(self.pods.values())
        if not pods:
            return {}
        times = {"created": min(timestamp(p["metadata"]["creationTimestamp"]) for p in pods)}
        for phase, type_ in (("scheduled", "PodScheduled"), ("ready", "Ready")):
            if all(_true(p, type_) for p in pods):
                times[phase] = max(timestamp((condition(p, type_) or {})["lastTransitionTime"]) for p in pods)
        if all("started" in pod_phases(p) for p in pods):
            times["started"] = max(timestamp(s["state"]["running"]["startedAt"])
                                   for p in pods for s in p["status"]["containerStatuses"])  # fmt: skip
        return times
