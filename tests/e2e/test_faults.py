"""Faults, each with a printed figure, against `llm-operator run` as a local process that the test
kills and restarts: killed at random points while deployments change; a deployment deleted while
it is down; kube-apiserver and etcd restarted during a rollout. The operator watches only the
test's namespace (the module-scoped `operator` fixture of other modules is not running here).

Serving pods run on the simulated GPU pools (KWOK): rollouts and garbage collection are the real
controllers' work, without loading the machine.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.testing import E2ECluster, Kubectl, condition, wait_for
from tests.e2e import manifests
from tests.e2e.operator_fixtures import REPO, OperatorProcess, sample

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.exclusive,
]  # restarts the API server and etcd; runs operators of its own

GPU = {"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}}
CHILD_KINDS = ",".join(
    ["configmaps", "services", "statefulsets", "poddisruptionbudgets", "horizontalpodautoscalers", "jobs",
     "networkpolicies"]
)  # fmt: skip
MANAGED = "app.kubernetes.io/managed-by=llm-operator"


@pytest.fixture
def own_operator(crd: None, cluster: E2ECluster, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    manifests.engines_claim(cluster.kubectl, namespace)
    op = OperatorProcess(cluster, tmp_path / "operator.log", ("--namespace", namespace))
    try:
        op.wait_healthy()
        yield op
    finally:
        op.stop()


def children(kubectl: Kubectl, namespace: str) -> list[dict[str, Any]]:
    return kubectl.items(CHILD_KINDS, namespace, MANAGED)


def in_place(objs: list[dict[str, Any]]) -> tuple[dict[tuple[str, str], str], set[str]]:
    """The uid of each child a new revision changes in place, and apart from them the names of its
    model repositories: a changed one is a new ConfigMap, named by its content."""
    kept, repos = {}, set()
    for obj in objs:
        meta = obj["metadata"]
        if meta["labels"].get("app.kubernetes.io/component") == "model-repository":
            repos.add(meta["name"])
        else:
            kept[(obj["kind"], meta["name"])] = meta["uid"]
    return kept, repos


def desired_children(kubectl: Kubectl, deployments: list[dict[str, Any]], tmp: Path) -> set[tuple[str, str]]:
    """(kind, name) of what the operator should have applied for these stored LLMDeployments, from
    `llm-operator render` (the same desired() the reconciler calls) against the cluster's nodes."""
    (tmp / "nodes.json").write_text(kubectl("get", "nodes", "-o", "json").stdout)
    (tmp / "deployments.yaml").write_text(yaml.safe_dump_all(deployments))
    out = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", str(tmp / "deployments.yaml"),
         "--nodes", str(tmp / "nodes.json")],
        capture_output=True, text=True, check=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    return {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(out.stdout) if o}


def strays(kubectl: Kubectl, namespace: str, tmp: Path) -> tuple[list[str], int]:
    """What differs between the children in the cluster and the desired ones (missing, extra,
    duplicate, or not owned by exactly their deployment), and how many children there are."""
    deployments = kubectl.items("llmdeployments", namespace)
    uids = {d["metadata"]["name"]: d["metadata"]["uid"] for d in deployments}
    have = children(kubectl, namespace)
    want = desired_children(kubectl, deployments, tmp) if deployments else set()
    found = [(c["kind"], c["metadata"]["name"]) for c in have]
    problems = [f"missing {k}" for k in sorted(want - set(found))]
    problems += [f"extra {k}" for k in sorted(set(found) - want)]
    problems += [f"duplicate {k}" for k in sorted({k for k in found if found.count(k) > 1})]
    for child in have:
        owner = child["metadata"].get("labels", {}).get("llmoperator.io/deployment")
        refs = [r for r in child["metadata"].get("ownerReferences", []) if r.get("controller")]
        if [r["uid"] for r in refs] != [uids.get(owner)]:
            problems.append(f"{child['kind']} {child['metadata']['name']} owned by {refs} (want {owner})")
    return problems, len(have)


def unconverged(kubectl: Kubectl, namespace: str) -> list[str]:
    """Why each deployment is not Ready at its generation with its StatefulSet at spec.replicas
    (empty when all are): what a timed-out wait should show."""
    why = []
    for ld in kubectl.items("llmdeployments", namespace):
        name, generation = ld["metadata"]["name"], ld["metadata"]["generation"]
        observed = (ld.get("status") or {}).get("observedGeneration")
        ready = condition(ld, "Ready") or {}
        sts = kubectl.get("statefulset", name, namespace)
        replicas = None if sts is None else sts["spec"]["replicas"]
        if observed != generation or ready.get("status") != "True" or replicas != ld["spec"]["replicas"]:
            why.append(f"{name}: observedGeneration {observed} of {generation}, Ready "
                       f"{ready.get('status')} ({ready.get('reason')}: {ready.get('message')}), "
                       f"StatefulSet replicas {replicas} of {ld['spec']['replicas']}")  # fmt: skip
    return why


def test_operator_killed_twenty_times_while_deployments_change_converges_without_strays(
    own_operator: OperatorProcess, kubectl: Kubectl, namespace: str, gpu_pools: None, tmp_path: Path
) -> None:
    seed = int(os.environ.get("LLMOP_FAULT_SEED", time.time_ns() % 2**31))
    rng = random.Random(seed)
    specs: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for kill in range(20):
        if kill:
            own_operator.start()
        time.sleep(rng.uniform(0, 2.0))  # during startup, the first reconciles, or idle
        name = rng.choice([f"f{i}" for i in range(5)])
        spec = specs.setdefault(name, manifests.deployment(name, resources=GPU))
        if len(specs) > 1 or kill:  # create, or edit: replicas, or the engine shape (a new revision)
            spec["spec"]["replicas"] = rng.randint(1, 3)
            spec["spec"]["engine"]["maxBatchSize"] = rng.choice([8, 16])
        kubectl.apply(spec, namespace=namespace)
        time.sleep(rng.uniform(0.2, 2.5))
        own_operator.kill()
    own_operator.start()
    restarted = time.monotonic()

    def not_converged() -> list[str]:
        own_operator.running()  # a dead operator converges nothing: say so, not only that nothing did
        return unconverged(kubectl, namespace)

    wait_for(f"every deployment Ready at its generation (seed {seed}, log {own_operator.log_path})",
             not_converged, lambda why: not why, timeout=180)  # fmt: skip
    took = time.monotonic() - restarted
    problems, count = strays(kubectl, namespace, tmp_path)
    assert not problems, problems
    print(f"operator SIGKILLed 20 times in {restarted - started:.0f} s (seed {seed}) while {len(specs)} "
          f"deployments were created and edited: converged {took:.1f} s after the last restart, "
          f"{count} children, 0 missing, extra, duplicate or orphaned")  # fmt: skip

    # Once more over what has converged, one StatefulSet scaled by hand meanwhile: the new process
    # lists, reconciles each deployment, finds its predecessor's applies standing and applies
    # only what someone else changed (its status may follow the pods the scaling made).
    own_operator.kill()
    edited = sorted(specs)[0]
    kubectl("scale", "statefulset", edited, "--replicas=5", namespace=namespace)
    own_operator.start()
    own_operator.wait_healthy()
    reconciles = "llm_operator_reconcile_duration_seconds_count"
    wait_for(f"{len(specs)} reconciles by the new process", own_operator.metrics,
             lambda t: sample(t, reconciles) >= len(specs), timeout=60)  # fmt: skip
    time.sleep(2)  # any write would follow its reconcile at once
    text = own_operator.metrics()
    applied = sample(text, "llm_operator_api_writes_total", verb="apply")
    assert applied == 1 == sample(text, "llm_operator_api_writes_total", kind="StatefulSet"), text
    sts = kubectl.get("statefulset", edited, namespace)
    assert sts is not None and sts["spec"]["replicas"] == specs[edited]["spec"]["replicas"], "restored"


def test_deleted_while_the_operator_is_down_nothing_hangs_and_children_are_collected(
    own_operator: OperatorProcess, kubectl: Kubectl, namespace: str, gpu_pools: None
) -> None:
    kubectl.apply(manifests.deployment("gone", resources=GPU, replicas=2), namespace=namespace)
    wait_for("children", lambda: children(kubectl, namespace), lambda cs: len(cs) >= 4, timeout=120)
    wait_for("serving pods", lambda: kubectl.items("pods", namespace, MANAGED), lambda ps: len(ps) == 2)
    own_operator.kill()
    started = time.monotonic()
    kubectl("delete", "llmdeployment", "gone", "--timeout=30s", namespace=namespace)  # waits until gone
    deleted = time.monotonic() - started
    wait_for("children and pods collected",
             lambda: children(kubectl, namespace) + kubectl.items("pods", namespace, MANAGED),
             lambda left: left == [], timeout=120)  # fmt: skip
    collected = time.monotonic() - started
    own_operator.start()
    own_operator.wait_healthy()
    time.sleep(3)  # a restarted operator must not bring anything back
    assert children(kubectl, namespace) == []
    print(f"deleted while the operator was down: `kubectl delete` returned in {deleted:.1f} s "
          f"(no finalizer); the garbage collector removed all children and pods "
          f"{collected:.1f} s later")  # fmt: skip


class ServingWatch:
    """Samples, every 0.5 s while the API answers, how many pods back the deployment's Service."""

    def __init__(self, kubectl: Kubectl, namespace: str, service: str) -> None:
        self.kubectl, self.namespace, self.service = kubectl, namespace, service
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            selector = f"kubernetes.io/service-name={self.service}"
            result = self.kubectl("get", "endpointslices", "-l", selector, "-o", "json",
                                  namespace=self.namespace, check=False)  # fmt: skip
            if result.returncode == 0:
                slices = yaml.safe_load(result.stdout)["items"]
                ready = [e for s in slices for e in s.get("endpoints") or [] if e["conditions"].get("ready")]
                self.samples.append(len(ready))

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.samples


def test_apiserver_and_etcd_restarted_during_a_rollout(
    own_operator: OperatorProcess, cluster: E2ECluster, kubectl: Kubectl, namespace: str, gpu_pools: None
) -> None:
    if cluster.launcher is None:
        pytest.skip("restarts components of the embedded control plane")
    spec = manifests.deployment("roll", resources=GPU, replicas=2)
    kubectl.apply(spec, namespace=namespace)
    wait_for("roll Ready", lambda: unconverged(kubectl, namespace), lambda why: not why, timeout=120)
    before, repos_before = in_place(children(kubectl, namespace))
    watch = ServingWatch(kubectl, namespace, "roll")
    generation = (kubectl.get("statefulset", "roll", namespace) or {})["metadata"]["generation"]
    spec["spec"]["engine"]["maxBatchSize"] = 16  # a new revision: every serving pod is replaced
    kubectl.apply(spec, namespace=namespace)
    sts = wait_for("the operator's new pod template", lambda: kubectl.get("statefulset", "roll", namespace),
                   lambda s: s is not None and s["metadata"]["generation"] > generation,
                   timeout=60, interval=0.1)  # fmt: skip
    assert sts is not None
    status = sts.get("status", {})  # the rollout's progress now: 0 while the controller has not seen it
    updated = (
        status.get("updatedReplicas", 0)
        if status.get("observedGeneration") == sts["metadata"]["generation"]
        else 0
    )
    apiserver = cluster.launcher.restart("kube-apiserver")
    etcd = cluster.launcher.restart("etcd")
    restarted = time.monotonic()

    def not_rolled_out() -> list[str]:
        sts = kubectl.get("statefulset", "roll", namespace)
        status = (sts or {}).get("status", {})
        done = status.get("updatedReplicas") == 2 and status.get("currentRevision") == status.get(
            "updateRevision"
        )
        return unconverged(kubectl, namespace) + ([] if done else [f"StatefulSet roll status {status}"])

    wait_for("the rollout converged", not_rolled_out, lambda why: not why, timeout=180)
    took = time.monotonic() - restarted
    samples = watch.stop()
    after, repos = in_place(children(kubectl, namespace))
    assert after == before, "no child recreated, none added or lost: the rollout changes them in place"
    assert len(repos) == 1 and repos != repos_before, "the new model repository replaced the old one"
    assert own_operator.proc.poll() is None, "the operator rode out both restarts"
    assert samples and min(samples) >= 1, f"the Service lost every ready pod: {samples}"
    print(f"rollout ({updated} of 2 pods updated) across a kube-apiserver restart ({apiserver:.1f} s until "
          f"ready) and an etcd restart "
          f"({etcd:.1f} s): converged {took:.1f} s after, {len(after)} children kept their uids, the "
          f"Service had >= {min(samples)} ready pods in all {len(samples)} samples taken while the API "
          "answered")  # fmt: skip
