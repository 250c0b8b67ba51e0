"""Multi-node replicas as LeaderWorkerSets, checked by a real API server against the real LWS CRD.

No LeaderWorkerSet controller runs here (tests/e2e/test_lws_multi_node.py runs LWS's real one), so
this proves the part the operator owns for a GPU-sized layout: the objects it renders are accepted
under the CRD's schema, applied server-side (as the operator does) with strict field validation,
and a field the schema does not declare is refused rather than silently dropped.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from llm_operator.cli import dump_objects

from e2e.cluster import lws
from e2e.cluster.testing import E2ECluster, Kubectl, KubectlError, is_true, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.exclusive,
]  # adds and removes the LWS CRD, which an operator reads at start

# The release the test world builds LWS from (its module is then in Go's cache already).
LWS_MODULE = f"sigs.k8s.io/lws@v{lws.RELEASE}"
LWS_CRD = lws.CRD
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def lws_crd(kubectl: Kubectl, tmp_path: Path) -> Iterator[None]:
    """The cluster's LWS CRD, else the one in LWS's Go module, installed for this test only."""
    if kubectl.get("crd", LWS_CRD) is not None:
        yield
        return
    go = shutil.which("go")
    if go is None:
        pytest.skip("no LeaderWorkerSet CRD in this cluster and no Go to fetch it")
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    out = subprocess.run([go, "mod", "download", "-json", LWS_MODULE], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    crd = (
        Path(json.loads(out.stdout)["Dir"])
        / "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"
    )
    try:
        kubectl("apply", "--server-side", "-f", str(crd))
        wait_for(
            "the LWS CRD Established",
            lambda: kubectl.get("crd", LWS_CRD),
            lambda c: is_true(c, "Established"),
        )
        yield
    finally:
        # Gone before the next test: an operator starting meanwhile would take LWS for installed.
        kubectl.delete("crd", LWS_CRD, wait=True)


def rendered_leader_worker_sets(
    cluster: E2ECluster, kubectl: Kubectl, tmp_path: Path
) -> list[dict[str, Any]]:
    """`llm-operator render --leader-worker-set` of tp 8 x pp 2 (two 8-GPU nodes per replica),
    planned against this cluster's nodes."""
    doc = yaml.safe_load((REPO / "examples" / "llama3-70b-fp8.yaml").read_text())
    doc["spec"]["parallelism"] = {"tensor": 8, "pipeline": 2}
    (tmp_path / "app.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "nodes.yaml").write_text(kubectl("get", "nodes", "-o", "yaml").stdout)
    out = subprocess.run(
        [sys.executable, "-m", "llm_operator.cli", "render", "-f", str(tmp_path / "app.yaml"),
         "--nodes", str(tmp_path / "nodes.yaml"), "--leader-worker-set"],
        capture_output=True, text=True, timeout=60, check=True, cwd=REPO,
    )  # fmt: skip
    return [o for o in yaml.safe_load_all(out.stdout) if o["kind"] == "LeaderWorkerSet"]


def strict_dry_run(kubectl: Kubectl, objs: list[dict[str, Any]], namespace: str) -> None:
    kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "--field-manager=llm-operator",
            "-f", "-", input=dump_objects(objs), namespace=namespace)  # fmt: skip


def test_rendered_leader_worker_sets_pass_the_real_crd_schema(
    lws_crd: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    if not cluster.gpu_nodes("NVIDIA-H100-80GB-HBM3"):
        pytest.skip("this cluster has no H100 nodes to plan tp 8 x pp 2 on")
    objs = rendered_leader_worker_sets(cluster, kubectl, tmp_path)
    assert len(objs) == 1
    for obj in objs:
        obj["metadata"]["namespace"] = namespace
        obj["metadata"].pop("ownerReferences")  # the LLMDeployment does not exist here
    lws = objs[0]["spec"]
    assert lws["leaderWorkerTemplate"]["size"] == 2
    strict_dry_run(kubectl, objs, namespace)

    # The check can fail: a misspelt field is refused.
    wrong = copy.deepcopy(objs)
    wrong[0]["spec"]["leaderWorkerTemplate"]["restartPolicyy"] = "RecreateGroupOnPodRestart"
    with pytest.raises(KubectlError, match="not declared in schema"):
        strict_dry_run(kubectl, wrong, namespace)
