"""Serving pods that really run, on the embedded cluster's real node from the cpu-runtime image: what
a KWOK shell could never show.

- A pod is Ready only once Triton has loaded the model and the OpenAI front door answers (its
  startup probe asks the front door's /health, which asks Triton's /v2/health/ready).
- Tokens stream back, one OpenAI event each, through the client Service's ClusterIP (kube-proxy;
  the client inside the cluster's network namespace) and through `kubectl port-forward`
  (127.0.0.1); the official `openai` SDK is answered at the base URL status.endpoints.openai names
  (tests/e2e/openai_sdk.py).
- `kubectl delete pod` in the middle of long streams: they complete (preStop waits for the
  requests running in the engine, then Triton waits for open connections on SIGTERM, and the front
  door stops after it), the pod is replaced, and requests through the Service meanwhile all succeed
  with two replicas.
- Triton's admin APIs (model repository, logging, shared memory) answer 403 without the key from
  the deployment's admin-key Secret and 200 with it; generate needs no key.
- Each pod's cold start, measured by the operator from the pod's own timestamps, is one ColdStart
  Event, and status.lastColdStart holds the later one, its phases adding up; the pod replaced by
  the delete above is the next one.

tiny-llama runs on the default contract, the pytorch backend's (engine.cpuReference.contract:
Triton's llmapi model `tensorrt_llm`), and every request goes through the OpenAI front door, as a
client's does. No test here keeps the ensemble contract: what they check (readiness, streaming
through the Service, the drain, the admin key, a failed start) is the serving pod's, whichever model
Triton loads; the ensemble's own Triton API is held by tests/triton/test_cpu_runtime.py.
- A runtime that cannot start (too little shared memory for Triton's python backend: a user's
  `resources.shmSize`) crash-loops, and the LLMDeployment says so in Triton's words; an image that
  cannot be pulled is reported in the kubelet's words, with a Warning Event.

A LimitRange caps the pods of the shared deployment at CPU_LIMIT: loading the model takes tens of
seconds and a 490-token stream several seconds, so each step above happens while something is
still in progress rather than after it. Real pods are few and small: the node has 2 CPUs.
"""

from __future__ import annotations

import base64
import http.client
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.contract import ADMIN_KEY_ENV, ADMIN_KEY_HEADER, ADMIN_KEY_SECRET_KEY, OPENAI_PORT
from llm_operator.inject import content_tag
from llm_operator.render.inject import INJECT_PATH, INJECT_VOLUME

from e2e.chat import base_url
from e2e.cluster.processes import free_port
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, pod_ready, wait_for
from e2e.generate import ADMIN_REQUESTS, Chunk, GenerateError, answers, connection, open_requests, stream
from e2e.operator_env import LAUNCHER_REPOSITORY
from tests.e2e import openai_sdk

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU_LIMIT = "250m"
SELECTOR = "llmoperator.io/deployment=tiny-llama"
PROMPT = "Once upon a time"  # 16 tokens: 16 + 490 fits tiny-llama's 512 positions
LONG = 490
MODEL = "tiny-llama"  # the example's alias: the name OpenAI clients ask for


def tiny_llama(**spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = CPU_LIMIT
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return doc


# The model Triton serves tiny-llama as: `tensorrt_llm` on the default (pytorch) contract.
TRITON_MODEL = "tensorrt_llm"


def health(netns: str, ip: str, port: int = 8000, path: str = "/v2/health/ready") -> int | str:
    """Triton's /v2/health/ready (or another health path) on the pod's IP, asked from inside the
    cluster's network: the HTTP status, or why there was none."""
    conn = connection(ip, inside=netns, port=port, timeout=1.0)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError as e:
        return type(e).__name__
    finally:
        conn.close()


@dataclass
class Sample:
    at: float
    running: bool  # the container has started
    pod_ready: bool
    triton: int | str  # /v2/health/ready
    openai: int | str  # the front door's /health


@dataclass
class Served:
    namespace: str
    netns: str
    timeline: dict[str, list[Sample]] = field(default_factory=dict)  # pod name -> samples


@pytest.fixture(scope="module")
def served(operator: None, cluster: E2ECluster, kubectl: Kubectl) -> Iterator[Served]:
    """tiny-llama with two replicas under a CPU limit, and what its pods and Triton said every half
    second until it was Ready."""
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its real node's images and its network namespace")
    ns = kubectl.create_namespace("real-pods")
    try:
        yield watch_until_ready(kubectl, Served(ns, cluster.launcher.netns))
    finally:
        kubectl.delete("namespace", ns)


def watch_until_ready(kubectl: Kubectl, served: Served) -> Served:
    limit = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "cpu"},
             "spec": {"limits": [{"type": "Container", "default": {"cpu": CPU_LIMIT}}]}}  # fmt: skip
    kubectl.apply(limit, namespace=served.namespace)
    kubectl.apply(tiny_llama(replicas=2), namespace=served.namespace)
    start, deadline, done = time.monotonic(), time.monotonic() + 240, False
    while not done:
        assert time.monotonic() < deadline, f"tiny-llama not Ready in 240 s: {served.timeline}"
        done = is_true(
            kubectl.get("llmdeployment", "tiny-llama", served.namespace), "Ready"
        )  # one last round
        for pod in kubectl.items("pods", served.namespace, SELECTOR):
            statuses = pod.get("status", {}).get("containerStatuses") or [{}]
            ip = pod.get("status", {}).get("podIP")
            served.timeline.setdefault(pod["metadata"]["name"], []).append(
                Sample(
                    at=time.monotonic() - start,
                    running="running" in (statuses[0].get("state") or {}),
                    pod_ready=pod_ready(pod),
                    triton=health(served.netns, ip) if ip else "no IP",
                    openai=health(served.netns, ip, 8080, "/health") if ip else "no IP",
                )
            )
        time.sleep(0.5)
    return served


def first(samples: list[Sample], what: str, ok: Callable[[Sample], bool]) -> float:
    seen = [s.at for s in samples if ok(s)]
    assert seen, f"never {what}: {samples}"
    return seen[0]


def test_a_pod_is_ready_only_once_triton_has_loaded_the_model(served: Served, kubectl: Kubectl) -> None:
    pods = kubectl.items("pods", served.namespace, SELECTOR)
    assert len(pods) == 2
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["startupProbe"]["httpGet"] == {"path": "/health", "port": "openai", "scheme": "HTTP"}
        assert container["readinessProbe"]["httpGet"] == {
            "path": "/v2/health/ready",
            "port": "http",
            "scheme": "HTTP",
        }
        # The LimitRange's CPU slows the load; memory is the spec's 2Gi plus its 256Mi of /dev/shm.
        assert container["resources"]["limits"] == {"cpu": CPU_LIMIT, "memory": "2304Mi"}
        samples = served.timeline[pod["metadata"]["name"]]
        running = first(samples, "running", lambda s: s.running)
        loaded = first(samples, "model ready in Triton", lambda s: s.triton == 200)
        ready = first(samples, "pod Ready", lambda s: s.pod_ready)
        answering = first(samples, "the front door answering", lambda s: s.openai == 200)
        # Triton was up and loading for a while, and the pod stayed out of its Service meanwhile,
        # until the OpenAI port answered too.
        assert running + 5 < loaded <= ready, (running, loaded, ready)
        assert answering <= ready, (answering, ready)
        log = kubectl("logs", pod["metadata"]["name"], namespace=served.namespace).stdout
        assert f"successfully loaded '{TRITON_MODEL}'" in log
        print(f"{pod['metadata']['name']}: running at {running:.1f} s, model loaded by {loaded:.1f} s, "
              f"front door answering by {answering:.1f} s, pod Ready at {ready:.1f} s")  # fmt: skip


def cold_starts(kubectl: Kubectl, ns: str) -> dict[str, list[str]]:
    """The ColdStart Events' messages, by the pod each names."""
    found: dict[str, list[str]] = {}
    for e in kubectl.events(ns, "tiny-llama"):
        if e["reason"] == "ColdStart":
            found.setdefault(e["message"].split()[1], []).append(e["message"])
    return found


def last_cold_start(kubectl: Kubectl, ns: str) -> dict[str, Any]:
    status = (kubectl.get("llmdeployment", "tiny-llama", ns) or {}).get("status") or {}
    return dict(status.get("lastColdStart") or {})


def seconds_between(earlier: str, later: str) -> int:
    return int((datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds())


def ready_since(pod: dict[str, Any]) -> str:
    return str(next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"])


def test_each_pods_cold_start_is_in_the_status_and_one_event(served: Served, kubectl: Kubectl) -> None:
    """status.lastColdStart is the later of the two pods' starts, cut into phases at the moments its
    own status records (creation, PodScheduled, the init container's end, Triton's container
    running, Ready) that add up to the whole; each pod's start is one ColdStart Event."""
    ns = served.namespace
    pods = {p["metadata"]["name"]: p for p in kubectl.items("pods", ns, SELECTOR)}
    events = wait_for("a ColdStart Event for each pod", lambda: cold_starts(kubectl, ns),
                      lambda found: set(found) == set(pods), timeout=30)  # fmt: skip
    last = last_cold_start(kubectl, ns)
    pod = pods[last["podName"]]
    assert ready_since(pod) == max(ready_since(p) for p in pods.values()), "the later of the two"
    assert (last["startedAt"], last["readyAt"]) == (pod["metadata"]["creationTimestamp"], ready_since(pod))
    phases = {p["name"]: p["seconds"] for p in last["phases"]}
    assert list(phases) == ["scheduled", "initialized", "started", "ready"]
    assert sum(phases.values()) == last["totalSeconds"] == seconds_between(last["startedAt"], last["readyAt"])
    # On 250m CPU Triton loads the model for tens of seconds after its container runs.
    assert phases["ready"] >= 5, last
    time.sleep(3)  # passes after the last start post nothing more
    again = cold_starts(kubectl, ns)
    assert {name: len(said) for name, said in again.items()} == {name: 1 for name in pods}, again
    said = ", ".join(f"{name} {seconds} s" for name, seconds in phases.items())
    assert events[last["podName"]] == [
        f"pod {last['podName']} started from nothing in {last['totalSeconds']} s: {said}"
    ]
    print(f"cold starts: {[m for ms in again.values() for m in ms]}")


def assert_streamed(chunks: list[Chunk], tokens: int) -> None:
    """One event per token, and they came over time, not all at the end."""
    assert len(chunks) == tokens, [c.text for c in chunks]
    assert all(len(c.text) == 1 for c in chunks)
    spread = chunks[-1].at - chunks[0].at
    assert spread > 0.3 and chunks[0].at < spread, [round(c.at, 3) for c in chunks]
    # A buffering hop hands over many events at one instant. A few tokens together are normal: the
    # CPU quota (CPU_LIMIT) runs the runtime in slices of a 100 ms period.
    per_instant = Counter(round(c.at, 2) for c in chunks)
    assert max(per_instant.values()) <= tokens // 4, f"arrived in a few bursts: {per_instant}"


def test_serving_pods_serve_from_a_read_only_root(served: Served, kubectl: Kubectl) -> None:
    """Ready above with readOnlyRootFilesystem, in a namespace enforcing restricted Pod Security:
    Triton, its python backend and the launcher write only to their emptyDirs."""
    pod = kubectl.items("pods", served.namespace, SELECTOR)[0]
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    ns = kubectl.get("namespace", served.namespace) or {}
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    shell = ["exec", "-n", served.namespace, pod["metadata"]["name"], "--", "sh", "-c"]
    root = kubectl(*shell, "touch /probe", check=False)
    assert root.returncode != 0 and "Read-only file system" in root.stderr, root
    assert kubectl(*shell, 'touch "$HOME/probe" /tmp/probe').returncode == 0


def test_tritons_admin_apis_answer_only_with_the_deployments_key(served: Served, kubectl: Kubectl) -> None:
    """From inside the cluster's network, a pod's model-repository, logging and shared-memory APIs
    answer 403 without the key from the operator's Secret and 200 with it; generate needs none.
    The key is read as an admin would (docs/runtime.md), and is in no log of the pod."""
    ld = kubectl.get("llmdeployment", "tiny-llama", served.namespace) or {}
    name = ld["status"]["adminKeySecret"]
    secret = kubectl.get("secret", name, served.namespace) or {}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == ld["metadata"]["uid"]
    key = base64.b64decode(secret["data"][ADMIN_KEY_SECRET_KEY]).decode()
    pod = kubectl.items("pods", served.namespace, SELECTOR)[0]
    (container,) = pod["spec"]["containers"]
    (env,) = (e for e in container["env"] if e["name"] == ADMIN_KEY_ENV)
    assert env["valueFrom"]["secretKeyRef"] == {"name": name, "key": ADMIN_KEY_SECRET_KEY}

    ip = pod["status"]["podIP"]

    def connect() -> http.client.HTTPConnection:
        return connection(ip, inside=served.netns, timeout=30)

    assert answers(connect, ADMIN_REQUESTS) == dict.fromkeys(ADMIN_REQUESTS, 403)
    with_key = answers(connect, ADMIN_REQUESTS, {ADMIN_KEY_HEADER: key})
    assert with_key == {**dict.fromkeys(ADMIN_REQUESTS, 200), "model-repository (GET)": 405}, "POST only"
    assert answers(connect, open_requests(TRITON_MODEL)) == {"generate": 200, "model-config": 200}
    log = kubectl("logs", pod["metadata"]["name"], namespace=served.namespace).stdout
    assert "--http-restricted-api=" in log and key not in log


def test_the_launcher_runs_from_the_copy_the_init_container_made(served: Served, kubectl: Kubectl) -> None:
    """The cpu-runtime image carries no launcher, like NVIDIA's images: the launcher image's init
    container (busybox, no Python) copied it into the emptyDir, and the image's python3 runs it from
    there. The launcher image is the one of this checkout's injected files, by their content tag."""
    pod = kubectl.items("pods", served.namespace, SELECTOR)[0]
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["name"] == INJECT_VOLUME and init["state"]["terminated"]["exitCode"] == 0, init
    assert pod["spec"]["initContainers"][0]["image"] == f"{LAUNCHER_REPOSITORY}:{content_tag()}"
    exec_ = ["exec", "-n", served.namespace, pod["metadata"]["name"], "-c", "triton", "--", "python3"]
    where = kubectl(*exec_, "-c", "import llm_operator.runtime.launcher as m; print(m.__file__)")
    assert where.stdout.strip() == f"{INJECT_PATH}/llm_operator/runtime/launcher.py", where
    # -I: without PYTHONPATH the image has none of its own.
    own = kubectl(*exec_, "-I", "-c", "import llm_operator.runtime.launcher", check=False)
    assert own.returncode != 0 and "No module named 'llm_operator'" in own.stderr, own
    # The main container's view of the copy is read-only.
    write = kubectl(*exec_, "-c", f"open('{INJECT_PATH}/llm_operator/x.py', 'w')", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write


def test_tokens_stream_through_the_cluster_ip_and_port_forward(
    served: Served, cluster: E2ECluster, kubectl: Kubectl
) -> None:
    service = kubectl.get("service", "tiny-llama", served.namespace)
    assert service is not None
    ip = service["spec"]["clusterIP"]
    through_proxy = list(stream(connection(ip, OPENAI_PORT, inside=served.netns), MODEL, PROMPT, 100))
    assert_streamed(through_proxy, 100)

    port = free_port()
    forward = subprocess.Popen(
        [kubectl.binary, f"--kubeconfig={kubectl.kubeconfig}", "-n", served.namespace, "port-forward",
         "--address=127.0.0.1", "svc/tiny-llama", f"{port}:{OPENAI_PORT}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert forward.stdout is not None
        assert "Forwarding from 127.0.0.1" in forward.stdout.readline()
        through_forward = list(stream(connection("127.0.0.1", port), MODEL, PROMPT, 100))
    finally:
        forward.terminate()
        forward.wait(timeout=10)
    assert_streamed(through_forward, 100)
    assert "".join(c.text for c in through_forward) == "".join(c.text for c in through_proxy), "greedy"


def test_the_openai_sdk_is_answered_at_the_url_the_status_names(
    served: Served, cluster: E2ECluster, kubectl: Kubectl
) -> None:
    """Sync, async and streaming, through the client Service from inside the cluster's network."""
    ld = kubectl.get("llmdeployment", "tiny-llama", served.namespace)
    url = ((ld or {}).get("status") or {}).get("endpoints", {}).get("openai")
    assert url == f"http://tiny-llama.{served.namespace}.svc:8080/v1"
    assert cluster.launcher is not None
    with base_url(cluster.launcher, url) as base:
        openai_sdk.speaks_openai(base, "llm-operator/tiny-llama", "tiny-llama")


@dataclass
class Outcome:
    started: float
    ended: float = 0.0
    chunks: int = 0
    error: str = ""


def long_stream(netns: str, ip: str, outcome: Outcome, first_chunk: threading.Event) -> None:
    conn = connection(ip, OPENAI_PORT, inside=netns)
    try:
        for _ in stream(conn, MODEL, PROMPT, LONG):
            outcome.chunks += 1
            first_chunk.set()
    except (GenerateError, OSError, http.client.HTTPException) as e:
        outcome.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()  # Triton waits on SIGTERM for the front door's connection of an open stream
    outcome.ended = time.monotonic()


def keep_asking(netns: str, ip: str, outcomes: list[Outcome], stop: threading.Event) -> None:
    """Back-to-back short streams through the ClusterIP, a new connection each (kube-proxy picks a
    pod per connection)."""
    while not stop.is_set():
        outcome = Outcome(time.monotonic())
        outcomes.append(outcome)
        conn = connection(ip, OPENAI_PORT, inside=netns, timeout=30)
        try:
            outcome.chunks = len(list(stream(conn, MODEL, "Hi", 20)))
        except (GenerateError, OSError, http.client.HTTPException) as e:
            outcome.error = f"{type(e).__name__}: {e}"
        finally:
            conn.close()
        outcome.ended = time.monotonic()


def test_deleting_a_pod_mid_stream_completes_the_stream_and_fails_no_request(
    served: Served, kubectl: Kubectl
) -> None:
    ns, netns = served.namespace, served.netns
    victim = kubectl.get("pod", "tiny-llama-0", ns)
    assert pod_ready(victim) and victim is not None
    grace = victim["spec"]["terminationGracePeriodSeconds"]
    service = kubectl.get("service", "tiny-llama", ns)
    assert service is not None
    log = subprocess.Popen(
        [kubectl.binary, f"--kubeconfig={kubectl.kubeconfig}", "-n", ns, "logs", "-f", "tiny-llama-0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    outcomes: list[Outcome] = []
    stop = threading.Event()
    asker = threading.Thread(target=keep_asking, args=(netns, service["spec"]["clusterIP"], outcomes, stop))
    asker.start()
    # Batched together they take 8 s on an idle node, and 25 s on a busy one: always past the
    # preStop settle (5 s), always within Triton's exit timeout (30 s) after it.
    longs = [Outcome(time.monotonic()) for _ in range(3)]
    began = [threading.Event() for _ in longs]
    streams = [threading.Thread(target=long_stream, args=(netns, victim["status"]["podIP"], o, e))
               for o, e in zip(longs, began, strict=True)]  # fmt: skip
    try:
        for t in streams:
            t.start()
        assert all(e.wait(30) for e in began), [o.error for o in longs]
        deleted = time.monotonic()
        kubectl("delete", "pod", "tiny-llama-0", "--wait=false", namespace=ns)
        for t in streams:
            t.join(timeout=grace)
        gone = wait_for(
            "the deleted pod gone",
            lambda: kubectl.get("pod", "tiny-llama-0", ns),
            lambda p: p is None or p["metadata"]["uid"] != victim["metadata"]["uid"],
            timeout=grace + 10,
        )
        stopped = time.monotonic() - deleted
        replaced = wait_for(
            "tiny-llama-0 replaced and Ready",
            lambda: kubectl.get("pod", "tiny-llama-0", ns),
            lambda p: p is not None and p["metadata"]["uid"] != victim["metadata"]["uid"] and pod_ready(p),
            timeout=180,
        )
        time.sleep(3)  # and the Service sends it requests
    finally:
        stop.set()
        asker.join(timeout=60)
        log.terminate()
    assert gone is None or gone["metadata"]["uid"] != victim["metadata"]["uid"]
    assert replaced is not None
    for o in longs:
        assert (o.error, o.chunks) == ("", LONG), "the long streams completed"
    assert stopped < grace, f"the pod took {stopped:.0f} s to stop, more than its {grace} s grace"
    failed = [o for o in outcomes if o.error or o.chunks != 20]
    assert not failed, failed
    assert len(outcomes) > 20, "requests kept coming through the replacement"
    said = log.communicate(timeout=10)[0]
    # The replacement started from nothing: its start is the deployment's last, and one more Event.
    created = replaced["metadata"]["creationTimestamp"]
    start = wait_for("the replacement's cold start in status", lambda: last_cold_start(kubectl, ns),
                     lambda s: s.get("startedAt") == created, timeout=30)  # fmt: skip
    assert start["podName"] == "tiny-llama-0"
    assert len(cold_starts(kubectl, ns)["tiny-llama-0"]) == 2, "the first pod's start and its replacement's"
    # Triton got its SIGTERM (after preStop) and exited by itself within the grace period. Whether
    # the streams were still open then depends on the machine's speed: Triton waits for them if so.
    assert "signal 15: stopping" in said, said[-3000:]
    last = max(o.ended for o in longs) - deleted
    print(f"long streams ended {last:.1f} s after the delete; the pod stopped after {stopped:.1f} s "
          f"(grace {grace} s); {len(outcomes)} requests through the Service, none failed")  # fmt: skip


def degraded_with(kubectl: Kubectl, ns: str, *words: str, timeout: float = 120) -> dict[str, Any]:
    def degraded_says() -> dict[str, Any] | None:
        ld = kubectl.get("llmdeployment", "tiny-llama", ns)
        return (
            ld if all(w in ((condition(ld, "Degraded") or {}).get("message") or "") for w in words) else None
        )

    ld = wait_for(f"tiny-llama Degraded saying {words}", degraded_says, timeout=timeout)
    assert ld is not None
    return ld


def warning_events(kubectl: Kubectl, ns: str) -> list[str]:
    return [e["message"] for e in kubectl.events(ns, "tiny-llama")
            if e["type"] == "Warning" and e["reason"] == "PodsFailing"]  # fmt: skip


def test_a_runtime_that_cannot_start_crash_loops_and_the_status_says_why(
    operator: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's cpu-runtime image")
    # Each python-backend model instance needs 1 MiB of /dev/shm: Triton refuses the model.
    kubectl.apply(tiny_llama(resources={"shmSize": "512Ki", "cpu": "100m"}), namespace=namespace)
    loading = f"failed to load '{TRITON_MODEL}'"
    ld = degraded_with(kubectl, namespace, "CrashLoopBackOff", loading, "shared memory")
    assert condition(ld, "Ready")["status"] == "False"  # type: ignore[index]
    assert ld["status"]["reason"] == "PodsFailing"
    (pod,) = kubectl.items("pods", namespace, SELECTOR)
    terminated = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert terminated["exitCode"] == 1
    assert "error: creating server: Internal - failed to load all models" in terminated["message"]
    events = wait_for("a Warning Event", lambda: warning_events(kubectl, namespace))
    assert any("CrashLoopBackOff" in m for m in events), events
    print(f"Degraded: {condition(ld, 'Degraded')['message']}")  # type: ignore[index]


def test_an_image_that_cannot_be_pulled_is_reported_in_the_kubelets_words(
    operator: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    if cluster.launcher is None:
        pytest.skip("the embedded cluster has no registry: the pull fails at once")
    image = "localhost/llm-operator/no-such-image:v1"  # IfNotPresent: the node tries to pull it
    kubectl.apply(tiny_llama(runtime={"image": image}), namespace=namespace)
    ld = degraded_with(kubectl, namespace, image, timeout=90)
    message = condition(ld, "Degraded")["message"]  # type: ignore[index]
    assert "ErrImagePull" in message or "ImagePullBackOff" in message, message
    events = wait_for("a Warning Event", lambda: warning_events(kubectl, namespace))
    assert any(image in m and "pull" in m.lower() for m in events), events
    print(f"Degraded: {message}")
