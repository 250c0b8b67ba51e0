"""The multi-node group of test_cpu_multi_node.py, as a LeaderWorkerSet under LWS's real controller:
LWS v0.9.0 built from its Go module and installed from its own manifests (tests/e2e/lws_fixtures.py),
then an operator started, which finds the LWS CRD and renders tiny-llama's `parallelism: {tensor:
1, pipeline: 2}` group as one LeaderWorkerSet. LWS's controllers make the leader and worker
StatefulSets and its pod webhook labels the pods and sets LWS_LEADER_ADDRESS; the leader's mpirun
reaches rank 1 through the worker's launch agent under the host name LWS's headless Service gives it.

- The group becomes Ready and answers the OpenAI API with exactly the text the same weights decode
  in this process (the text test_cpu_multi_node.py shows a single pod serves).
- A killed worker is one group event under LWS's RecreateGroupOnPodRestart: the leader is
  recreated too, never half a group serving, the deployment says which member failed and why (as
  for its StatefulSet-shaped groups, though LWS does the recreating), and the group serves again.

Day one on a cluster with LWS (../shared/reference/review-gpu-path.md §4): an LWS named like the
client Service left the workers without DNS records. Rendered so again, this module fails: LWS keeps
the operator's ClusterIP Service as its pods' subdomain and the group is never Ready. A Service of
the LWS's name that is there before it (a user's) does the same; the leader says so within about a
minute, not after its 600 s wait for the workers (the last test).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator

import pytest
from llm_operator.api.v1alpha1 import LLMDeploymentSpec
from llm_operator.modelrepo import weights_seed
from llm_operator.runtime.cpu_reference import TINY_MODELS
from llm_operator.runtime.cpu_reference.tiny_lm import TinyLM

from e2e.chat import base_url
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from e2e.group_faults import what_the_pods_said
from e2e.group_world import (
    MAX_TOKENS,
    MODEL,
    PROMPT,
    READY_TIMEOUT,
    SPLIT,
    World,
    all_new,
    deployment,
    force_delete,
    recover_from,
)  # fmt: skip
from tests.e2e import openai_sdk

# Installs LWS's CRDs and cluster-wide webhooks, and runs an operator of its own that sees them.
pytestmark = [pytest.mark.e2e, pytest.mark.exclusive]

LWS = f"{SPLIT}-lws"  # render/names.py leader_worker_set: not the client Service's name
LEADER, WORKER = f"{LWS}-0", f"{LWS}-0-1"  # LWS's pod names: <lws>-<group>, <lws>-<group>-<worker>
LABELS = "leaderworkerset.sigs.k8s.io"  # what LWS's pod webhook labels its pods with
GROUP_INDEX, WORKER_INDEX = f"{LABELS}/group-index", f"{LABELS}/worker-index"


@contextlib.contextmanager
def lws_namespace(kubectl: Kubectl, hint: str) -> Iterator[str]:
    """A namespace for a test's LeaderWorkerSets; what its pods said is printed on a failure."""
    ns = kubectl.create_namespace(hint)
    try:
        yield ns
    except BaseException:
        print(what_the_pods_said(kubectl, ns))
        raise
    finally:
        # The deployment first (while it exists the operator applies a deleted LWS again: CI saw a
        # new LWS make pods for the whole of delete_namespace's wait), then the LWS, orphaning its
        # StatefulSets, or LWS makes anew what the namespace's end deletes; each gone before the next.
        for kind in ("llmdeployments", "leaderworkersets"):
            kubectl("delete", kind, "--all", "--cascade=orphan", "--wait=true", "--timeout=60s", namespace=ns)
        kubectl.delete_namespace(ns)


@pytest.fixture(scope="module")
def world(lws_operator: None, cluster: E2ECluster, kubectl: Kubectl) -> Iterator[World]:
    assert cluster.launcher is not None  # lws_running skips on any other cluster
    doc = deployment(SPLIT, parallelism={"tensor": 1, "pipeline": 2})
    spec = LLMDeploymentSpec.model_validate(doc["spec"])
    lm = TinyLM(TINY_MODELS[MODEL], weights_seed(spec.model.revision or "main"))
    with lws_namespace(kubectl, "lws-multi-node") as ns:
        start = time.monotonic()
        kubectl.apply(doc, namespace=ns)
        ld = wait_for(f"{SPLIT} Ready", lambda: kubectl.get("llmdeployment", SPLIT, ns),
                      lambda d: is_true(d, "Ready"), timeout=READY_TIMEOUT)  # fmt: skip
        assert ((ld or {}).get("status") or {}).get("endpoints", {}).get("openai"), condition(ld, "Ready")
        print(f"lws: {SPLIT} Ready {time.monotonic() - start:.1f} s after it was applied")
        yield World(ns, cluster.launcher, "".join(lm.generate(PROMPT, MAX_TOKENS)))


def env(pod: dict[str, object], name: str) -> str | None:
    containers = pod["spec"]["containers"]  # type: ignore[index]
    values = [e.get("value") for c in containers for e in c.get("env", []) if e["name"] == name]
    return values[0] if values else None


def test_the_group_runs_as_a_leader_worker_set_and_answers_as_one_pod_does(
    world: World, kubectl: Kubectl
) -> None:
    ns = world.namespace
    lws = kubectl.get("leaderworkerset", LWS, ns)
    assert lws is not None and lws["status"]["readyReplicas"] == 1, lws
    # LWS's StatefulSets only: the leaders' (owned by the LWS), the group's workers' (by its leader pod).
    owners = {s["metadata"]["name"]: [o["kind"] for o in s["metadata"]["ownerReferences"]]
              for s in kubectl.items("statefulsets", ns)}  # fmt: skip
    assert owners == {LWS: ["LeaderWorkerSet"], LEADER: ["Pod"]}, owners
    pods = world.members(kubectl, SPLIT)
    assert sorted(pods) == [LEADER, WORKER], sorted(pods)
    # LWS's pod webhook ran: group and worker indexes, and the leader's address in every pod.
    assert [(p["metadata"]["labels"][GROUP_INDEX], p["metadata"]["labels"][WORKER_INDEX])
            for _, p in sorted(pods.items())] == [("0", "0"), ("0", "1")]  # fmt: skip
    assert {env(p, "LWS_LEADER_ADDRESS") for p in pods.values()} == {f"{LEADER}.{LWS}.{ns}"}
    # The client Service is the operator's, LWS's headless Service (its pods' subdomain) is apart.
    client, headless = kubectl.get("service", SPLIT, ns), kubectl.get("service", LWS, ns)
    assert client is not None and client["spec"]["clusterIP"] != "None", client
    assert headless is not None and headless["spec"]["clusterIP"] == "None", headless
    assert [o["kind"] for o in headless["metadata"]["ownerReferences"]] == ["LeaderWorkerSet"]
    log = kubectl("logs", LEADER, namespace=ns).stdout
    assert "pipeline stage 1 of 2: layers range(" in log, log[-3000:]
    assert world.answer(SPLIT) == world.want
    with base_url(world.cluster, f"http://{SPLIT}.{ns}.svc:8080/v1") as served:
        openai_sdk.speaks_openai(served, "llm-operator/tiny-llama", MODEL)


def test_a_killed_worker_is_one_group_event_under_lws(world: World, kubectl: Kubectl) -> None:
    """LWS's RecreateGroupOnPodRestart: the worker's loss ends the leader's mpirun, the leader's
    restart makes LWS delete the leader pod and with it the group's worker StatefulSet; both come
    back new and the group serves again, nothing meanwhile answered by half a group."""
    ns = world.namespace
    before = {n: p["metadata"]["uid"] for n, p in world.members(kubectl, SPLIT).items()}
    # Until both members are new: the killed worker's processes end with its grace period, and
    # the old world answers meanwhile (as in test_cpu_multi_node.py).
    kill = force_delete(kubectl, ns, WORKER)
    group = recover_from(world, kubectl, SPLIT, kill, all_new(world, kubectl, before), f"{WORKER} was killed")
    assert group.wrong == [], group.wrong
    after = {n: p["metadata"]["uid"] for n, p in world.members(kubectl, SPLIT).items()}
    assert sorted(after) == sorted(before) and not set(after.values()) & set(before.values()), (
        f"{before} -> {after}:\n{what_the_pods_said(kubectl, ns)}")  # fmt: skip
    said = [(e.get("reason"), e.get("message")) for e in kubectl.events(ns, LWS)]
    assert any(reason == "RecreateGroup" for reason, _ in said), said  # LWS's own word for it
    # The deployment names the member seen failing first, in its container's words, and the group.
    recreated = [e for e in kubectl.events(ns, SPLIT) if e.get("reason") == "GroupRecreated"]
    assert recreated, [(e.get("reason"), e.get("message")) for e in kubectl.events(ns, SPLIT)]
    words = recreated[0]["message"]
    assert recreated[0]["type"] == "Warning" and re.match(rf"{LWS}-0(-1)? failed \(exited \d+", words), words
    assert words.endswith(
        f"LeaderWorkerSet {LWS} recreates group 0 of pool main as a whole ({LEADER}, {WORKER})"
    )
    print(f"lws: recovery from a killed worker {group.seconds:.1f} s; Ready meanwhile: {group.not_ready}")


def test_a_service_in_the_groups_subdomain_is_named_in_a_minute(lws_operator: None, kubectl: Kubectl) -> None:
    """A ClusterIP Service of the LeaderWorkerSet's name, made before it: LWS keeps it as its pods'
    subdomain and makes no headless Service, so no worker name resolves, ever. The leader sees that
    the subdomain does not list its own address and exits about a minute after it starts (not after
    LLMOP_WORKER_WAIT_SECONDS, 600 s), and the deployment's GroupRecreated Warning says why."""
    taken = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": LWS},
             "spec": {"selector": {"app": "none"}, "ports": [{"name": "http", "port": 80}]}}  # fmt: skip
    with lws_namespace(kubectl, "lws-subdomain") as ns:
        kubectl.apply(taken, namespace=ns)
        kubectl.apply(deployment(SPLIT, parallelism={"tensor": 1, "pipeline": 2}), namespace=ns)
        start = time.monotonic()
        recreated = wait_for(
            "the leader's word on its subdomain",
            lambda: [e for e in kubectl.events(ns, SPLIT) if e.get("reason") == "GroupRecreated"],
            timeout=240,
        )
        words = recreated[0]["message"]
        assert recreated[0]["type"] == "Warning", recreated[0]
        subdomain = rf"{LWS}\.{ns}\.svc"
        said = (
            rf"{LWS}-0-1\.{subdomain}: does not resolve \(.+\); {subdomain} answers [0-9a-f.:, ]+, "
            r"not this pod's [0-9a-f.:, ]+: a Service of that name that is not the group's headless"
        )
        assert re.search(said, words), words
        print(f"lws: a taken subdomain named {time.monotonic() - start:.1f} s after the group was applied")
