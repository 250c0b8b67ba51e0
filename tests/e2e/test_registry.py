"""The test world's registry as users meet theirs: a cpu-reference LLMDeployment whose runtime image
is named by the registry's own host pulls with the pull secret its spec names
(`runtime.imagePullSecrets`), through the kubelet and containerd's CRI pull; a wrong secret is
ErrImagePull / ImagePullBackOff in the deployment's status, in the registry's words; the right one
pulls. The node has no credentials for that host (only its mirrors of the default registries
carry the node's own: e2e/cluster/registry.py).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import pytest
import yaml

from e2e.cluster import registry
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, wait_for
from tests.e2e.test_real_pods import EXAMPLES

pytestmark = pytest.mark.e2e
SECRET = "registry-credentials"


def pull_secret(password: str) -> dict[str, Any]:
    config = registry.dockerconfigjson(registry.PUSH_USER, password)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()},
    }


def test_a_wrong_pull_secret_is_in_the_status_in_the_registrys_words_and_the_right_one_pulls(
    operator: None, cluster: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster's registry")
    # A tag of the CPU runtime no node has: the kubelet must pull it (IfNotPresent), nothing cached.
    built = registry.local_name("localhost/llm-operator/cpu-runtime:dev")
    image = f"{built.rpartition(':')[0]}:e2e-{secrets.token_hex(4)}"
    crane = cluster.launcher.registry_crane()
    crane.check("tag", built, image.rpartition(":")[2])
    kubectl.apply(pull_secret("not-the-password"), namespace=namespace)
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "cpu-reference.yaml").read_text())
    doc["spec"]["resources"]["cpu"] = "250m"
    doc["spec"]["runtime"] = {
        **doc["spec"].get("runtime", {}),
        "image": image,
        "imagePullSecrets": [{"name": SECRET}],
    }
    kubectl.apply(doc, namespace=namespace)

    def refused() -> dict[str, Any] | None:
        ld = kubectl.get("llmdeployment", "tiny-llama", namespace)
        message = (condition(ld, "Ready") or {}).get("message") or ""
        pulling = "ErrImagePull" in message or "ImagePullBackOff" in message
        return ld if pulling and "401 Unauthorized" in message else None

    ld = wait_for("Ready False: the pull refused with the registry's 401", refused, timeout=120)
    assert ld is not None
    ready = condition(ld, "Ready")
    assert ready is not None and ready["status"] == "False" and ready["reason"] == "PodsFailing", ready
    assert image in ready["message"] and "not-the-password" not in ready["message"]
    print(f"Ready False: {ready['message']}")

    kubectl.apply(pull_secret(cluster.launcher.registry_passwords.push), namespace=namespace)
    # The kubelet retries a refused pull after its back-off (up to 5 min); a new pod pulls at once.
    kubectl(
        "delete", "pods", "-l", "llmoperator.io/deployment=tiny-llama", "--wait=false", namespace=namespace
    )
    wait_for(
        "tiny-llama Ready with the right secret",
        lambda: kubectl.get("llmdeployment", "tiny-llama", namespace),
        lambda o: is_true(o, "Ready"),
        timeout=240,
    )
    (pod,) = kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama")
    # By container: CRI reports one of the image's names, maybe a tag of an earlier run.
    (server,) = (c for c in pod["spec"]["containers"] if c["image"] == image)
    status = next(c for c in pod["status"]["containerStatuses"] if c["name"] == server["name"])
    assert status["imageID"].endswith(crane.check("digest", image)), status
