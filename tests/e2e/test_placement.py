"""Placement decided by the planner and enforced by the real kube-scheduler on the KWOK GPU pools."""

from __future__ import annotations

import time
from typing import Any

import pytest

from e2e.cluster.testing import Kubectl, is_true, pod_ready, wait_for
from tests.e2e.manifests import deployment, engines_claim

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("gpu_pools")]
TIMEOUT = 90


def ready_pods(kubectl: Kubectl, namespace: str, name: str, count: int) -> list[dict[str, Any]]:
    wait_for(
        f"LLMDeployment {name} Ready",
        lambda: kubectl.get("llmdeployment", name, namespace),
        lambda o: is_true(o, "Ready"),
        timeout=TIMEOUT,
    )
    pods = wait_for(
        f"{count} Ready pods of {name}",
        lambda: kubectl.items("pods", namespace, f"llmoperator.io/deployment={name}"),
        lambda items: len(items) == count and all(pod_ready(p) for p in items),
        timeout=TIMEOUT,
    )
    return list(pods)


def node_labels(kubectl: Kubectl, pods: list[dict[str, Any]]) -> list[dict[str, str]]:
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kubectl.items("nodes")}
    return [nodes[p["spec"]["nodeName"]] for p in pods]


def remove(kubectl: Kubectl, namespace: str, name: str) -> None:
    """Free the GPUs for the next test: delete and wait until the pods are gone."""
    kubectl.delete("llmdeployment", name, namespace)
    wait_for(
        f"pods of {name} to go",
        lambda: kubectl.items("pods", namespace, f"llmoperator.io/deployment={name}"),
        lambda items: items == [],
        timeout=TIMEOUT,
    )


def test_fp8_lands_only_on_ada_or_hopper_or_newer(operator: None, kubectl: Kubectl, namespace: str) -> None:
    engines_claim(kubectl, namespace)
    kubectl.apply(
        deployment("fp8", engine={"backend": "tensorrt-engine", "precision": "fp8", "maxBatchSize": 8,
                                  "maxInputLen": 2048, "maxSeqLen": 4096,
                                  "maxNumTokens": 4096, "prebuilt": {"uri": "pvc://engines/x"}},
                   parallelism={"tensor": "auto", "pipeline": "auto"}, replicas=2),
        namespace,
    )  # fmt: skip
    for labels in node_labels(kubectl, ready_pods(kubectl, namespace, "fp8", 2)):
        cc = (int(labels["nvidia.com/gpu.compute.major"]), int(labels["nvidia.com/gpu.compute.minor"]))
        assert cc >= (8, 9), f"fp8 pod on {labels['nvidia.com/gpu.product']} (compute {cc})"
    remove(kubectl, namespace, "fp8")


def test_tp8_skips_the_4_gpu_pcie_pool(operator: None, kubectl: Kubectl, namespace: str) -> None:
    engines_claim(kubectl, namespace)
    products = ["NVIDIA-L40S", "NVIDIA-H100-80GB-HBM3"]
    kubectl.apply(
        deployment(
            "tp8", parallelism={"tensor": 8, "pipeline": 1}, resources={"gpu": {"products": products}}
        ),
        namespace,
    )
    (labels,) = node_labels(kubectl, ready_pods(kubectl, namespace, "tp8", 1))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    status = kubectl.get("llmdeployment", "tp8", namespace)["status"]  # type: ignore[index]
    assert status["placement"]["gpuProduct"] == "NVIDIA-H100-80GB-HBM3"
    remove(kubectl, namespace, "tp8")


def test_multi_node_tensor_parallel_group_stays_in_one_nvlink_clique(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    engines_claim(kubectl, namespace)
    kubectl.apply(
        deployment("clique", parallelism={"tensor": 8, "pipeline": 1},
                   resources={"gpu": {"products": ["NVIDIA-GB200"]}}),
        namespace,
    )  # fmt: skip
    pods = ready_pods(kubectl, namespace, "clique", 2)
    roles = sorted(p["metadata"]["labels"]["llmoperator.io/role"] for p in pods)
    assert roles == ["leader", "worker"]
    cliques = {labels["nvidia.com/gpu.clique"] for labels in node_labels(kubectl, pods)}
    assert len(cliques) == 1, f"one TP group spans cliques {cliques}"
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    remove(kubectl, namespace, "clique")


def test_pipeline_stages_stay_in_one_network_block(operator: None, kubectl: Kubectl, namespace: str) -> None:
    engines_claim(kubectl, namespace)
    kubectl.apply(
        deployment(
            "pp", parallelism={"tensor": 4, "pipeline": 2}, resources={"gpu": {"products": ["NVIDIA-GB200"]}}
        ),
        namespace,
    )
    pods = ready_pods(kubectl, namespace, "pp", 2)
    blocks = {labels["topology.k8s.aws/network-node-layer-3"] for labels in node_labels(kubectl, pods)}
    assert len(blocks) == 1, f"PP stages of one replica span network blocks {blocks}"
    remove(kubectl, namespace, "pp")


def test_replicas_spread_over_zones(operator: None, kubectl: Kubectl, namespace: str) -> None:
    engines_claim(kubectl, namespace)
    kubectl.apply(
        deployment("spread", resources={"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}}, replicas=2),
        namespace,
    )
    zones = {
        labels["topology.kubernetes.io/zone"]
        for labels in node_labels(kubectl, ready_pods(kubectl, namespace, "spread", 2))
    }
    assert len(zones) == 2
    remove(kubectl, namespace, "spread")


def test_a_plan_that_falls_short_is_served_and_says_why(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    """A model outside the catalogue with no spec.model.architecture can be placed, but its memory
    cannot be checked: the user reads that in status and in a Warning Event, not in an OOM later."""
    engines_claim(kubectl, namespace)
    body = deployment("unknown", resources={"gpu": {"products": ["NVIDIA-A10G"]}})
    body["spec"]["model"] = {
        "name": "acme/house-model-7b",
        "source": {"uri": "pvc://engines/models/house-7b"},
    }
    kubectl.apply(body, namespace)
    ld = wait_for(
        "placement warnings in status", lambda: kubectl.get("llmdeployment", "unknown", namespace),
        lambda o: bool(o and o.get("status", {}).get("placement", {}).get("warnings")), timeout=TIMEOUT,
    )  # fmt: skip
    assert ld is not None
    (warning,) = ld["status"]["placement"]["warnings"]
    assert "acme/house-model-7b is not in the catalogue" in warning and "not checked" in warning
    events = wait_for(
        "a PlacementWarning Event", lambda: kubectl.events(namespace, "unknown"),
        lambda items: any(e["reason"] == "PlacementWarning" for e in items), timeout=TIMEOUT,
    )  # fmt: skip
    posted = [e for e in events if e["reason"] == "PlacementWarning"]
    assert len(posted) == 1 and posted[0]["type"] == "Warning" and posted[0]["message"] == warning
    remove(kubectl, namespace, "unknown")


def test_a_node_pool_appearing_later_unblocks_a_stalled_deployment(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    engines_claim(kubectl, namespace)
    kubectl.apply(deployment("later", resources={"gpu": {"products": ["NVIDIA-H200"]}}), namespace)
    ld = wait_for(
        "Stalled: no H200 anywhere", lambda: kubectl.get("llmdeployment", "later", namespace),
        lambda o: is_true(o, "Stalled"), timeout=TIMEOUT,
    )  # fmt: skip
    assert ld is not None
    stalled = next(c for c in ld["status"]["conditions"] if c["type"] == "Stalled")
    assert stalled["reason"] == "NoMatchingGPUProduct" and "NVIDIA-H200" in stalled["message"]
    node_name = f"h200-{namespace[-6:]}"
    kubectl.apply({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name, "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": {
            "kubernetes.io/hostname": node_name, "type": "kwok", "nvidia.com/gpu.product": "NVIDIA-H200",
            "nvidia.com/gpu.count": "8", "nvidia.com/gpu.memory": "143771",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0", "topology.kubernetes.io/zone": "us-east-1c"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"},
                   "capacity": {"cpu": "96", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}},
    })  # fmt: skip
    try:
        (labels,) = node_labels(kubectl, ready_pods(kubectl, namespace, "later", 1))
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
        remove(kubectl, namespace, "later")
    finally:
        kubectl.delete("node", node_name)


def test_a_failed_member_is_one_group_event_and_no_other_group_is_touched(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    """tp 4 x pp 2 on 4-GPU nodes: each replica is a two-pod TensorRT-LLM world (StatefulSet shape,
    no LeaderWorkerSet CRD here). A member that fails breaks its group's world: on a real node the
    leader's container restarts and relaunches every rank (tests/e2e/test_cpu_multi_node.py); these
    pods run no process, so what is shown here is the operator's part: the failure reported once,
    naming the member, no pod deleted (the failed worker replaced by its StatefulSet), and the other
    replica untouched."""
    engines_claim(kubectl, namespace)
    kubectl.apply(
        deployment(
            "group",
            parallelism={"tensor": 4, "pipeline": 2},
            resources={"gpu": {"products": ["NVIDIA-GB200"]}},
            replicas=2,
        ),
        namespace,
    )
    pods = ready_pods(kubectl, namespace, "group", 4)

    def group_of(pod: dict[str, Any]) -> str:
        labels = pod["metadata"]["labels"]  # leaders are numbered by their StatefulSet
        return str(labels.get("llmoperator.io/group", labels.get("apps.kubernetes.io/pod-index")))

    def uids(group: str, items: list[dict[str, Any]]) -> dict[str, str]:
        return {
            p["metadata"]["labels"]["llmoperator.io/role"]: p["metadata"]["uid"]
            for p in items
            if group_of(p) == group
        }

    before = {g: uids(g, pods) for g in ("0", "1")}
    assert all(set(b) == {"leader", "worker"} for b in before.values()), before
    # Every member mounts the group's launch identity: one Secret, made and owned by the operator.
    owner = kubectl.get("llmdeployment", "group", namespace)
    assert owner is not None
    (secret_name,) = {v["secret"]["secretName"] for p in pods for v in p["spec"]["volumes"] if "secret" in v}
    secret = kubectl.get("secret", secret_name, namespace)
    assert secret is not None, f"pods mount {secret_name}, which does not exist"
    assert [r["uid"] for r in secret["metadata"]["ownerReferences"]] == [owner["metadata"]["uid"]]
    assert set(secret["data"]) == {"leader.crt", "leader.key", "worker.crt", "worker.key"}
    assert owner["status"]["launchSecret"] == secret_name, "what tells the operator the Secret is its own"
    # Each role mounts its half only: a worker never the leader's key, a leader never the workers'.
    mine = {
        "leader": ["leader.crt", "leader.key", "worker.crt"],
        "worker": ["worker.crt", "worker.key", "leader.crt"],
    }
    for p in pods:
        (identity,) = [v["secret"] for v in p["spec"]["volumes"] if "secret" in v]
        assert [i["key"] for i in identity["items"]] == mine[p["metadata"]["labels"]["llmoperator.io/role"]]
    worker = next(
        p["metadata"]["name"]
        for p in pods
        if group_of(p) == "0" and p["metadata"]["labels"]["llmoperator.io/role"] == "worker"
    )
    # What the kubelet reports when a rank's process dies and the pod does not restart it.
    kubectl(
        "patch", "pod", worker, "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Failed"}}',
        namespace=namespace,
    )  # fmt: skip
    after = wait_for(
        "group 0's worker replaced and Ready",
        lambda: kubectl.items("pods", namespace, "llmoperator.io/deployment=group"),
        lambda items: (
            len(items) == 4
            and all(pod_ready(p) for p in items)
            and set(uids("0", items)) == {"leader", "worker"}
            and uids("0", items)["worker"] != before["0"]["worker"]
        ),
        timeout=TIMEOUT,
    )
    reported = wait_for(
        "the group's failure reported",
        lambda: [e for e in kubectl.events(namespace, "group") if e.get("reason") == "GroupRecreated"],
        timeout=60,
    )
    time.sleep(5)  # the leader's own end (on a real node) or a duplicate would come by now
    again = [e for e in kubectl.events(namespace, "group") if e.get("reason") == "GroupRecreated"]
    assert len(again) == 1 and reported[0]["message"].startswith(f"{worker} failed (Failed"), again
    assert "group 0 of pool main restarts as a whole" in reported[0]["message"], reported
    assert uids("0", after)["leader"] == before["0"]["leader"], (
        "the operator deletes no pod of a formed group"
    )
    assert uids("1", after) == before["1"], "the healthy replica must not be restarted"
    ready_pods(kubectl, namespace, "group", 4)
    secret_after = kubectl.get("secret", secret_name, namespace)
    assert secret_after is not None and secret_after["data"] == secret["data"], "the key is never replaced"
    remove(kubectl, namespace, "group")
