"""An operator upgrade that moves a default leaves existing deployments as they are
(docs/upgrading.md): the release is recorded on each LLMDeployment at its first reconcile, and
the CRD's schema defaults were written into each stored object when it was created.

The operator runs as a local process watching only the test's namespace, restarted with another
default release the way an upgrade would change it. Serving pods run on the simulated GPU pools
(KWOK), which pull nothing: any image name serves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator import releases

from e2e.cluster.testing import E2ECluster, Kubectl, is_true, wait_for
from tests.e2e import manifests
from tests.e2e.operator_fixtures import REPO, OperatorProcess

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.exclusive,
]  # runs operators of its own, and applies a changed CRD for a while

OLD, NEW = releases.BY_TRTLLM["1.1.0"], releases.BY_TRTLLM["1.2.1"]
ANNOTATION = "llmoperator.io/tensorrt-llm-version"
CRD = REPO / "crds" / "llmdeployments.llmoperator.io.yaml"
GPU = {"gpu": {"products": ["NVIDIA-H100-80GB-HBM3"]}}
PYTORCH = {"backend": "pytorch", "precision": "bf16", "maxBatchSize": 8, "maxInputLen": 2048,
           "maxSeqLen": 4096, "maxNumTokens": 4096}  # fmt: skip


@pytest.fixture
def operators(
    crd: None, cluster: E2ECluster, namespace: str, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """The test's operators, one at a time (the last one runs); each stopped at the end."""
    manifests.engines_claim(cluster.kubectl, namespace)
    started: list[OperatorProcess] = []
    try:
        yield started
    finally:
        for op in started:
            op.stop()


def start(
    operators: list[OperatorProcess], cluster: E2ECluster, namespace: str, tmp: Path, **env: str
) -> None:
    if operators:
        operators[-1].stop()
    op = OperatorProcess(cluster, tmp / f"operator-{len(operators)}.log", ("--namespace", namespace), **env)
    operators.append(op)
    op.wait_healthy()


def pytorch_deployment(name: str) -> dict[str, Any]:
    return manifests.deployment(name, engine=PYTORCH, resources=GPU)


def ready(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        return kubectl.get("llmdeployment", name, namespace)

    def done(ld: dict[str, Any] | None) -> bool:
        status = (ld or {}).get("status") or {}
        return (
            ld is not None
            and status.get("observedGeneration") == ld["metadata"]["generation"]
            and is_true(ld, "Ready")
        )

    found = wait_for(f"{name} Ready", probe, done, timeout=180)
    assert found is not None
    return found


def pods(kubectl: Kubectl, namespace: str, name: str) -> dict[str, str]:
    """uid -> serving image of the deployment's pods."""
    found = kubectl.items("pods", namespace, f"llmoperator.io/deployment={name}")
    return {p["metadata"]["uid"]: p["spec"]["containers"][0]["image"] for p in found}


def template(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    sts = kubectl.get("statefulset", name, namespace)
    assert sts is not None
    return {"generation": sts["metadata"]["generation"], "template": sts["spec"]["template"]}


def test_a_new_default_release_leaves_existing_deployments_serving_unchanged(
    operators: list[OperatorProcess],
    cluster: E2ECluster,
    kubectl: Kubectl,
    namespace: str,
    gpu_pools: None,
    tmp_path: Path,
) -> None:
    start(operators, cluster, namespace, tmp_path)  # the defaults: OLD
    kubectl.apply(pytorch_deployment("before"), namespace)
    ld = ready(kubectl, namespace, "before")
    assert ld["metadata"]["annotations"][ANNOTATION] == OLD.trtllm
    assert ld["status"]["release"] == {"tensorrtLlmVersion": OLD.trtllm, "image": OLD.image}
    before, serving = template(kubectl, namespace, "before"), pods(kubectl, namespace, "before")
    assert set(serving.values()) == {OLD.image} and len(serving) == 1

    # GitOps re-applying the manifest, which has no annotation: neither server-side apply (by
    # another field manager) nor client-side apply removes what the operator recorded.
    kubectl.apply(pytorch_deployment("before"), namespace)
    kubectl("apply", "-f", "-", namespace=namespace, input=json.dumps(pytorch_deployment("before")))
    meta = kubectl.get("llmdeployment", "before", namespace)["metadata"]  # type: ignore[index]
    assert meta["annotations"][ANNOTATION] == OLD.trtllm

    # The upgrade: the operator restarted with another default release.
    start(
        operators,
        cluster,
        namespace,
        tmp_path,
        LLMOP_TRTLLM_VERSION=NEW.trtllm,
        LLMOP_RUNTIME_IMAGE=NEW.image,
    )
    kubectl.apply(pytorch_deployment("after"), namespace)
    after = ready(kubectl, namespace, "after")  # the new operator has listed and reconciled both
    assert after["metadata"]["annotations"][ANNOTATION] == NEW.trtllm
    assert set(pods(kubectl, namespace, "after").values()) == {NEW.image}
    ld = ready(kubectl, namespace, "before")
    assert ld["status"]["release"]["tensorrtLlmVersion"] == OLD.trtllm
    assert template(kubectl, namespace, "before") == before, "the pod template is unchanged"
    assert pods(kubectl, namespace, "before") == serving, "the same pods serve, with the same image"

    # The user moves it to the operator's default: the annotation removed, the new one is recorded.
    kubectl("annotate", "llmdeployment", "before", f"{ANNOTATION}-", namespace=namespace)
    wait_for(
        "before moved to the new release, its pods replaced",
        lambda: pods(kubectl, namespace, "before"),
        lambda now: set(now.values()) == {NEW.image} and not set(now) & set(serving),
        timeout=180,
    )
    ld = ready(kubectl, namespace, "before")
    assert ld["metadata"]["annotations"][ANNOTATION] == NEW.trtllm
    assert ld["status"]["release"] == {"tensorrtLlmVersion": NEW.trtllm, "image": NEW.image}


def test_a_changed_schema_default_leaves_stored_objects_as_created(
    crd: None, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """The API server writes a CRD's schema defaults into the object on create; on read it fills
    only fields absent from storage. engine.backend defaulted to tensorrt-engine before this CRD,
    which defaults it to pytorch: an object created under the older CRD without naming a backend
    keeps tensorrt-engine under this one, and only new objects get pytorch."""
    real = yaml.safe_load(CRD.read_text())
    older = copy.deepcopy(real)
    schema = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert schema["engine"]["properties"]["backend"]["default"] == "pytorch"
    schema["engine"]["properties"]["backend"]["default"] = "tensorrt-engine"
    schema["engine"]["default"]["backend"] = "tensorrt-engine"
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(older))
    stored = manifests.deployment("stored")  # engines, prebuilt
    del stored["spec"]["engine"]["backend"]  # as written for the older operator
    fresh = manifests.deployment("fresh", engine={k: v for k, v in PYTORCH.items() if k != "backend"})

    def backend(name: str) -> str:
        ld = kubectl.get("llmdeployment", name, namespace)
        assert ld is not None
        return str(ld["spec"]["engine"]["backend"])

    def created_now() -> str:
        """The backend a new object naming none gets (created in a dry run: nothing is stored)."""
        out = kubectl.json(
            "create", "--dry-run=server", "-f", "-", namespace=namespace, input=json.dumps(fresh)
        )
        return str(out["spec"]["engine"]["backend"])

    assert created_now() == "pytorch"
    try:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        wait_for("the older default in force", created_now, lambda b: b == "tensorrt-engine")
        kubectl.apply(stored, namespace)
        assert backend("stored") == "tensorrt-engine"
    finally:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_for("the real CRD back", created_now, lambda b: b == "pytorch")
    assert backend("stored") == "tensorrt-engine", "the stored object keeps what it was created with"
    kubectl.apply(stored, namespace)  # re-applied, still without a backend
    assert backend("stored") == "tensorrt-engine", "an update fills only absent fields"
