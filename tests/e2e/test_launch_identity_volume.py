"""The multi-node launch identity as the real kubelet mounts it: the Secret volume of a rendered
leader and worker pod (items, defaultMode 0440, the pod's fsGroup) in a namespace enforcing
restricted Pod Security, loaded into the launch agent's own TLS contexts as the image's non-root
user with a read-only root filesystem.

Multi-node serving needs GPUs, so the pods here are the rendered templates with their GPU parts
taken out and the launch agent's context set-up as their command, on the cpu-runtime image, running
as NVIDIA's images are run (uid 1000) from the copy their init container makes; the agent itself
runs over real TLS in tests/unit/test_launch_agent.py and between real pods in
tests/e2e/test_cpu_multi_node.py.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from llm_operator import contract
from llm_operator.api.v1alpha1 import LLMDeployment, LLMDeploymentSpec
from llm_operator.controller.secrets.launch import launch_secret
from llm_operator.images import Images, launcher_image
from llm_operator.plan.types import PoolPlan
from llm_operator.render.inject import INJECT_VOLUME
from llm_operator.render.pod import NVIDIA_UID, SECRET_FS_GROUP
from llm_operator.render.serving import workloads
from llm_operator.storage import engine_location

from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, wait_for
from e2e.operator_env import CPU_RUNTIME_IMAGE, LAUNCHER_REPOSITORY

pytestmark = pytest.mark.e2e

H100 = "NVIDIA-H100-80GB-HBM3"
MULTI = PoolPlan("main", H100, (H100,), (9, 0), 81559, 8, 2, 8, 2, 1)
UID = "5e1f2a3b-0c4d-4e5f-8a9b-0c1d2e3f4a5b"
SPEC = LLMDeploymentSpec.model_validate(
    {"model": {"name": "meta-llama/Meta-Llama-3-70B-Instruct", "source": {"uri": "pvc://models/m"}}}
)
# What the launch agent does with the volume (its TLS context, from the role's files), and the files.
PROBE = """
import json, os, pathlib
from llm_operator.runtime import launch_agent
from llm_operator.runtime.config import PodConfig
c = PodConfig.from_env(os.environ)
identity = pathlib.Path(c.launch_identity_dir)
(launch_agent.server_context if c.role == "worker" else launch_agent.client_context)(identity)
def stat(d):
    return {p.name: [p.stat().st_mode & 0o777, p.stat().st_uid, p.stat().st_gid]
            for p in pathlib.Path(d).iterdir() if not p.name.startswith("..")}
print(json.dumps({"uid": os.getuid(), "groups": os.getgroups(), "secret": stat(identity)}))
"""


def probe_pod(name: str, template: dict[str, Any]) -> dict[str, Any]:
    """The rendered pod, its launch identity volume, emptyDirs and security settings kept, GPU parts out."""
    spec = copy.deepcopy(template["spec"])
    (container,) = spec["containers"]
    keep = {contract.LAUNCH_VOLUME, "tmp", "home", INJECT_VOLUME}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] in keep]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] in keep]
    for key in ("startupProbe", "readinessProbe", "livenessProbe", "lifecycle", "resources"):
        container.pop(key, None)
    # The group index comes from a StatefulSet's pod label, which a bare pod lacks.
    env = [e for e in container["env"] if "value" in e and e["name"] != "LLMOP_GROUP_INDEX"]
    env.append({"name": "LLMOP_GROUP_INDEX", "value": "0"})
    container.update(image=CPU_RUNTIME_IMAGE, imagePullPolicy="IfNotPresent",
                     command=["python3", "-c", PROBE], env=env)  # fmt: skip
    for key in ("affinity", "tolerations", "topologySpreadConstraints", "nodeSelector"):
        spec.pop(key, None)
    spec.update(nodeSelector={"kubernetes.io/hostname": NODE_NAME}, restartPolicy="Never",
                terminationGracePeriodSeconds=1)  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_each_role_reads_only_its_half_of_the_identity_through_the_fs_group(
    embedded: E2ECluster, kubectl: Kubectl, namespace: str
) -> None:
    ld = LLMDeployment.model_validate(
        {
            "metadata": {"name": "llama", "namespace": namespace, "uid": UID},
            "spec": SPEC.model_dump(by_alias=True),
        }
    )
    secret = launch_secret(ld)
    del secret["metadata"]["ownerReferences"]  # no such LLMDeployment: the collector would delete it
    images = Images("runtime", "cpu-runtime", "builder", "1.1.0", launcher_image(LAUNCHER_REPOSITORY))
    engine = engine_location("pvc://llm-engine-cache/engines", "llama-fp8-tp8pp2-sm90-abc")
    leader_sts, worker_sts = workloads(
        "llama", namespace, SPEC, MULTI, images, engine, "h", uid=UID, revision="r1"
    )
    kubectl.apply(
        [secret, probe_pod("leader", leader_sts["spec"]["template"]),
         probe_pod("worker", worker_sts["spec"]["template"])],
        namespace=namespace,
    )  # fmt: skip
    seen: dict[str, dict[str, Any]] = {}
    for role in ("leader", "worker"):
        pod = wait_for(
            f"pod {role} to finish",
            lambda role=role: kubectl.get("pod", role, namespace),  # type: ignore[misc]
            lambda p: p is not None and p["status"].get("phase") in ("Succeeded", "Failed"),
            timeout=120,
        )
        logs = kubectl("logs", role, namespace=namespace).stdout
        assert pod is not None and pod["status"]["phase"] == "Succeeded", logs
        seen[role] = json.loads(logs.strip().splitlines()[-1])

    for role, keys in (("leader", contract.LEADER_LAUNCH_FILES), ("worker", contract.WORKER_LAUNCH_FILES)):
        out = seen[role]
        assert out["uid"] == NVIDIA_UID and SECRET_FS_GROUP in out["groups"], (
            "the pod's user, with the fsGroup"
        )
        # The kubelet's layout: root's files, readable by the fsGroup only, this role's keys only.
        assert out["secret"] == {k: [0o440, 0, SECRET_FS_GROUP] for k in keys}
