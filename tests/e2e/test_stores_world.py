"""The model stores `up` starts in the cluster's network namespace (e2e/cluster/artifacts.py), as
the fetch Jobs will use them: the fetch image, under the operator's default fetch image name and
without a pull, runs the fetcher in a restricted pod on the real node against versitygw and olah
on NODE_IP; each server's access log shows the pod's requests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from llm_operator.images import DEFAULT_FETCH_IMAGE

from e2e.cluster import Cluster, artifacts
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, wait_for
from tests.e2e.stores import hub_gets, s3_gets

pytestmark = pytest.mark.e2e


def _launcher(cluster: E2ECluster) -> Cluster:
    if cluster.launcher is None:
        pytest.skip("the model stores run in the embedded cluster's namespace")
    return cluster.launcher


def _fetch_pod(name: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """A pod as a fetch Job's: the fetch image's entry point, the claim a volume (emptyDir here),
    the result in its termination message."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "fetch",
                    "image": DEFAULT_FETCH_IMAGE,
                    # `up` dropped an older build under this name: the node pulls this one.
                    "imagePullPolicy": "IfNotPresent",
                    "args": [*args, "--cache-root", "/cache"],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "terminationMessagePolicy": "File",
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                    },
                }
            ],
            "volumes": [{"name": "cache", "emptyDir": {}}],
        },
    }


def _result(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    done = wait_for(
        f"pod {name} to finish",
        lambda: kubectl.get("pod", name, namespace),
        lambda p: p is not None and p["status"].get("phase") in ("Succeeded", "Failed"),
        timeout=120,
    )
    assert done is not None
    (status,) = done["status"]["containerStatuses"]
    terminated = status["state"]["terminated"]
    assert done["status"]["phase"] == "Succeeded", (
        terminated,
        kubectl("logs", name, namespace=namespace).stdout,
    )
    result: dict[str, Any] = json.loads(terminated["message"])
    return result


def test_the_fetch_image_fetches_from_both_stores_in_a_pod(
    cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    stores = _launcher(cluster).stores
    assert stores.host == "10.240.0.10"
    s3_before = s3_gets(stores, "tiny-llama/model.safetensors")
    hub_before = hub_gets(stores, "model.safetensors")
    s3 = _fetch_pod(
        "fetch-s3",
        ["--uri", f"s3://{artifacts.BUCKET}/tiny-llama", "--source-key", "s3-00000000000000c3",
         "--endpoint", stores.s3_endpoint, "--region", artifacts.REGION, "--path-style"],
        stores.credentials,
    )  # fmt: skip
    hf = _fetch_pod(
        "fetch-hf",
        ["--uri", f"hf://{artifacts.HF_REPO}", "--revision", "v1", "--source-key", "hf-00000000000000d4",
         "--endpoint", stores.hf_endpoint],
        {},
    )  # fmt: skip
    kubectl.apply([s3, hf], namespace)
    from_s3, from_hub = _result(kubectl, namespace, "fetch-s3"), _result(kubectl, namespace, "fetch-hf")
    assert from_s3["files"] == 4 and from_s3["resolvedRevision"].startswith("etags-")
    assert from_hub["files"] == 5 and len(from_hub["resolvedRevision"]) == 40
    for result in (from_s3, from_hub):
        assert result["downloadedBytes"] == result["bytes"] > 800_000
    assert s3_gets(stores, "tiny-llama/model.safetensors") == s3_before + 1
    assert hub_gets(stores, "model.safetensors") == hub_before + 1
