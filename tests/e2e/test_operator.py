"""The operator, running as a real process, against the real control plane with KWOK GPU nodes.

Covers the core loop end to end: children with owner, labels, GPUs and affinity; pods Ready via
KWOK; Ready condition (kubectl wait); engine build Job and its cache; scale subresource; spec
change rolling the StatefulSet; drift correction; garbage collection; Stalled on impossible specs.
"""

from __future__ import annotations

import copy
import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.testing import Kubectl, condition, is_true, pod_ready, wait_for

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 90


# A small model built on the A10G pool (two nodes, one GPU each) with the shortest build deadline.
A10G_BUILD = """
apiVersion: llmoperator.io/v1alpha1
kind: LLMDeployment
metadata: {name: a10g-build}
spec:
  model:
    name: meta-llama/Llama-3.2-1B-Instruct
    source: {uri: pvc://llm-engine-cache/models/llama3.2-1b}
  engine:
    backend: tensorrt-engine
    precision: bf16
    maxBatchSize: 8
    maxInputLen: 1024
    maxSeqLen: 2048
    maxNumTokens: 2048
    build: {activeDeadlineSeconds: 60}
    cache: {uri: pvc://llm-engine-cache/engines}
  parallelism: {tensor: 1, pipeline: 1}
  replicas: 1
  resources: {gpu: {products: [NVIDIA-A10G]}}
"""


def example(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    if doc["spec"]["engine"].get("backend") == "cpu-reference":
        # Its pods really run on the real node (2 CPUs): three replicas, or pods of tests whose
        # namespaces are still going away, fit beside each other.
        doc["spec"]["resources"]["cpu"] = "250m"
    model = doc["spec"]["model"]
    if model.pop("cache", None) is not None:
        # The GPU examples fetch s3:// models into the model cache; their simulated GPU nodes serve
        # nothing, so these tests read a directory of the engine cache's claim in place instead
        # (the model cache's own e2e tests fetch real models from the test world's servers).
        name = model["source"]["uri"].rstrip("/").rsplit("/", 1)[-1]
        model["source"] = {"uri": f"pvc://llm-engine-cache/models/{name}"}
    return doc


def engine_cache(kubectl: Kubectl, namespace: str) -> None:
    """The statically bound claims the examples expect (engine cache, calibration data), each PV
    under a name of its own (PVs are cluster-scoped)."""
    docs = list(yaml.safe_load_all((EXAMPLES / "engine-cache.yaml").read_text()))
    for pv, pvc in zip(docs[::2], docs[1::2], strict=True):
        unique = f"{pvc['metadata']['name']}-{secrets.token_hex(3)}"
        pv["metadata"]["name"] = pvc["spec"]["volumeName"] = unique
    kubectl.apply(docs, namespace=namespace)


def get_llmd(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    return kubectl.get("llmdeployment", name, namespace)


def wait_ready(kubectl: Kubectl, namespace: str, name: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    ld = wait_for(
        f"LLMDeployment {namespace}/{name} Ready",
        lambda: get_llmd(kubectl, namespace, name),
        lambda o: (
            o is not None
            and is_true(o, "Ready")
            and o["status"]["observedGeneration"] == o["metadata"]["generation"]
        ),
        timeout=timeout,
    )
    assert ld is not None
    return ld


def test_cpu_reference_serving_children_and_ready(operator: None, kubectl: Kubectl, namespace: str) -> None:
    started = time.monotonic()
    kubectl.apply(example("cpu-reference.yaml"), namespace=namespace)
    # kubectl wait is what users and CI scripts run.
    kubectl("wait", "--for=condition=Ready", "llmd/tiny-llama", f"--timeout={TIMEOUT}s", namespace=namespace)
    print(f"tiny-llama applied -> Ready: {time.monotonic() - started:.1f} s")
    ld = get_llmd(kubectl, namespace, "tiny-llama")
    assert ld is not None
    status = ld["status"]
    assert status["phase"] == "Ready" and status["readyReplicas"] == 1 and status["replicas"] == 1
    assert status["selector"] == "llmoperator.io/deployment=tiny-llama,llmoperator.io/role=leader"
    assert status["endpoints"]["http"] == f"http://tiny-llama.{namespace}.svc:8000"
    # The pods mount the model repository ConfigMap named by its content.
    repos = kubectl.items("configmaps", namespace, "app.kubernetes.io/component=model-repository")
    assert len(repos) == 1 and repos[0]["metadata"]["name"].startswith("tiny-llama-model-repo-")
    assert repos[0]["immutable"] is True
    for kind, name in [
        ("configmap", repos[0]["metadata"]["name"]),
        ("statefulset", "tiny-llama"),
        ("service", "tiny-llama"),
        ("service", "tiny-llama-pods"),
        ("poddisruptionbudget", "tiny-llama"),
    ]:
        obj = kubectl.get(kind, name, namespace)
        assert obj is not None, f"{kind}/{name} missing"
        owner = obj["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("LLMDeployment", "tiny-llama", True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llm-operator"
    pods = kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama")
    assert len(pods) == 1 and pod_ready(pods[0])
    container = pods[0]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))
    volumes = pods[0]["spec"]["volumes"]
    assert repos[0]["metadata"]["name"] in [v["configMap"]["name"] for v in volumes if "configMap" in v]
    # The model repository ConfigMap holds the rendered Triton configs.
    assert any(k.endswith("config.pbtxt") for k in repos[0]["data"])


def test_gpu_deployment_lands_on_requested_product(operator: None, kubectl: Kubectl, namespace: str) -> None:
    engine_cache(kubectl, namespace)
    kubectl.apply(example("llama3-8b-h100.yaml"), namespace=namespace)
    ld = wait_ready(kubectl, namespace, "llama3-8b")
    assert ld["status"]["placement"]["gpuProduct"] == "NVIDIA-H100-80GB-HBM3"
    assert ld["status"]["placement"]["tensorParallelism"] == 1
    pods = kubectl.items("pods", namespace, "llmoperator.io/deployment=llama3-8b")
    assert len(pods) == 2
    nodes = {n["metadata"]["name"]: n for n in kubectl.items("nodes")}
    for pod in pods:
        assert pod_ready(pod)
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"


def test_engine_build_job_then_serving_and_cache_hit(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    engine_cache(kubectl, namespace)
    doc = example("llama3-70b-fp8.yaml")
    doc["spec"].pop("autoscaling")
    doc["spec"]["replicas"] = 1
    kubectl.apply(doc, namespace=namespace)
    jobs = wait_for(
        "an engine-build Job",
        lambda: kubectl.items("jobs", namespace, "llmoperator.io/deployment=llama3-70b"),
        lambda items: len(items) == 1,
        timeout=TIMEOUT,
    )
    job = jobs[0]
    affinity = json.dumps(job["spec"]["template"]["spec"].get("affinity", {}))
    assert "NVIDIA-H100-80GB-HBM3" in affinity, "build Job must be pinned to the serving GPU product"
    ld = wait_ready(kubectl, namespace, "llama3-70b", timeout=2 * TIMEOUT)
    assert is_true(ld, "EngineReady")
    key = ld["status"]["engine"]["cacheKey"]
    index = kubectl.get("configmap", "llm-engine-cache-index", namespace)
    assert index is not None and key in index["data"]
    pod = kubectl.items("pods", namespace, "llmoperator.io/deployment=llama3-70b")[0]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # Same spec again after deletion: the key is cached, no second build.
    kubectl.delete("llmdeployment", "llama3-70b", namespace, wait=True)
    kubectl.apply(doc, namespace=namespace)
    wait_ready(kubectl, namespace, "llama3-70b")
    jobs = kubectl.items("jobs", namespace, "llmoperator.io/deployment=llama3-70b")
    assert all(j["metadata"]["name"] == job["metadata"]["name"] for j in jobs)


def gpu_blocker(product: str) -> dict[str, Any]:
    """A pod holding one GPU of `product`, as another team's workload would."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-blocker"},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": product},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {"name": "hold", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }


# Its GPU blocker pod (another team's workload) runs as root: baseline; the operator's pods
# are restricted all the same.
@pytest.mark.pod_security("baseline")
def test_a_failed_build_leaves_the_previous_revision_serving(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    engine_cache(kubectl, namespace)
    doc = yaml.safe_load(A10G_BUILD)
    kubectl.apply(doc, namespace=namespace)
    ld = wait_ready(kubectl, namespace, "a10g-build", timeout=2 * TIMEOUT)
    first_key = ld["status"]["engine"]["cacheKey"]
    serving = kubectl.items(
        "pods", namespace, "llmoperator.io/deployment=a10g-build,llmoperator.io/role=leader"
    )
    assert len(serving) == 1 and pod_ready(serving[0])
    template = kubectl.get("statefulset", "a10g-build", namespace)["spec"]["template"]  # type: ignore[index]

    # The pool's other GPU is taken, so the next build cannot start before its deadline (60 s): the
    # real Job controller fails it with DeadlineExceeded.
    kubectl.apply(gpu_blocker("NVIDIA-A10G"), namespace=namespace)
    wait_for(
        "the blocker to hold the other A10G",
        lambda: kubectl.get("pod", "gpu-blocker", namespace),
        lambda p: pod_ready(p),
        timeout=TIMEOUT,
    )
    doc["spec"]["engine"]["maxBatchSize"] = 16  # a different engine
    kubectl.apply(doc, namespace=namespace)
    failed = wait_for(
        "EngineBuildFailed",
        lambda: get_llmd(kubectl, namespace, "a10g-build"),
        lambda o: (
            o is not None
            and (condition(o, "EngineReady") or {}).get("reason") == "EngineBuildFailed"
            and o["status"]["observedGeneration"] == o["metadata"]["generation"]
        ),
        timeout=60 + 2 * TIMEOUT,
    )
    assert failed is not None
    assert failed["status"]["engine"]["cacheKey"] != first_key
    assert "DeadlineExceeded" in (condition(failed, "EngineReady") or {})["message"]
    assert is_true(failed, "Stalled") and is_true(failed, "Degraded") and is_true(failed, "Available")
    assert (condition(failed, "Degraded") or {}).get("reason") == "StalledWhileServing"
    events = kubectl.events(namespace, "a10g-build")
    assert any(e["type"] == "Warning" and e["reason"] == "EngineBuildFailed" for e in events)
    # Nothing that serves was touched: same pod, still Ready, same pod template (the old engine).
    after = kubectl.items(
        "pods", namespace, "llmoperator.io/deployment=a10g-build,llmoperator.io/role=leader"
    )
    assert [p["metadata"]["uid"] for p in after] == [serving[0]["metadata"]["uid"]] and pod_ready(after[0])
    assert kubectl.get("statefulset", "a10g-build", namespace)["spec"]["template"] == template  # type: ignore[index]

    # Going back to the cached engine recovers without a build.
    doc["spec"]["engine"]["maxBatchSize"] = 8
    kubectl.apply(doc, namespace=namespace)
    ld = wait_ready(kubectl, namespace, "a10g-build")
    assert ld["status"]["engine"]["cacheKey"] == first_key and not is_true(ld, "Stalled")


def test_scale_spec_change_drift_and_delete(operator: None, kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(example("cpu-reference.yaml"), namespace=namespace)
    wait_ready(kubectl, namespace, "tiny-llama")

    kubectl("scale", "llmd/tiny-llama", "--replicas=3", namespace=namespace)
    ld = wait_ready(kubectl, namespace, "tiny-llama")
    assert ld["status"]["readyReplicas"] == 3
    assert kubectl.get("statefulset", "tiny-llama", namespace)["spec"]["replicas"] == 3  # type: ignore[index]

    before = kubectl.get("statefulset", "tiny-llama", namespace)
    assert before is not None
    revision = before["spec"]["template"]["metadata"]["labels"]["llmoperator.io/revision"]
    changed = copy.deepcopy(example("cpu-reference.yaml"))
    changed["spec"]["runtime"]["profile"] = "throughput"
    changed["spec"]["replicas"] = 3
    kubectl.apply(changed, namespace=namespace)
    wait_for(
        "the StatefulSet to roll to a new pod template",
        lambda: kubectl.get("statefulset", "tiny-llama", namespace),
        lambda s: (
            s is not None
            and s["spec"]["template"]["metadata"]["labels"]["llmoperator.io/revision"] != revision
        ),
        timeout=TIMEOUT,
    )
    # Three real pods replaced one after another, each loading its model: 90 s ran out under load.
    wait_ready(kubectl, namespace, "tiny-llama", timeout=3 * TIMEOUT)

    # Drift: a deleted child comes back, an edited one is restored.
    kubectl.delete("service", "tiny-llama", namespace, wait=True)
    wait_for(
        "Service tiny-llama to be recreated",
        lambda: kubectl.get("service", "tiny-llama", namespace),
        timeout=TIMEOUT,
    )
    kubectl(
        "patch",
        "statefulset",
        "tiny-llama",
        "--type=merge",
        "-p",
        '{"spec":{"replicas":1}}',
        namespace=namespace,
    )
    wait_for(
        "StatefulSet replicas restored to 3",
        lambda: kubectl.get("statefulset", "tiny-llama", namespace),
        lambda s: s is not None and s["spec"]["replicas"] == 3,
        timeout=TIMEOUT,
    )

    kubectl.delete("llmdeployment", "tiny-llama", namespace)
    wait_for(
        "garbage collection of the children",
        lambda: kubectl.items(
            "statefulsets,services,configmaps", namespace, "app.kubernetes.io/managed-by=llm-operator"
        ),
        lambda items: items == [],
        timeout=TIMEOUT,
    )


def test_impossible_request_is_stalled_then_fixed(operator: None, kubectl: Kubectl, namespace: str) -> None:
    engine_cache(kubectl, namespace)
    doc = example("llama3-8b-h100.yaml")
    doc["spec"]["resources"]["gpu"]["products"] = ["NVIDIA-A10G"]
    doc["spec"]["parallelism"]["tensor"] = 8  # A10G nodes have 1 GPU and no NVLink
    doc["spec"]["engine"]["precision"] = "fp16"
    kubectl.apply(doc, namespace=namespace)
    ld = wait_for(
        "Stalled with a reason",
        lambda: get_llmd(kubectl, namespace, "llama3-8b"),
        lambda o: is_true(o, "Stalled"),
        timeout=TIMEOUT,
    )
    stalled = condition(ld, "Stalled")
    assert stalled is not None and stalled["reason"][0].isupper() and "NVIDIA-A10G" in stalled["message"]
    events = kubectl.events(namespace, "llama3-8b")
    assert any(e["type"] == "Warning" and e["reason"] == stalled["reason"] for e in events)
    assert kubectl.items("statefulsets", namespace) == []
    # Fixing the spec (a product that can hold it) unblocks it.
    doc["spec"]["parallelism"]["tensor"] = 1
    doc["spec"]["resources"]["gpu"]["products"] = ["NVIDIA-H100-80GB-HBM3"]
    kubectl.apply(doc, namespace=namespace)
    ld = wait_ready(kubectl, namespace, "llama3-8b")
    assert not is_true(ld, "Stalled")


def test_autoscaler_targets_the_deployment_scale_subresource(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    doc = example("cpu-reference.yaml")
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "metric": "pending-requests",
        "target": "4",
    }
    kubectl.apply(doc, namespace=namespace)
    wait_ready(kubectl, namespace, "tiny-llama")
    hpa = wait_for(
        "the HPA controller to write status",
        lambda: kubectl.get("hpa", "tiny-llama", namespace),
        lambda h: bool(h and h.get("status", {}).get("conditions")),
        timeout=TIMEOUT,
    )
    assert hpa is not None
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "llmoperator.io/v1alpha1",
        "kind": "LLMDeployment",
        "name": "tiny-llama",
    }
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "triton_pending_requests"
    # The HPA controller resolved the scale subresource (it knows the current replica count).
    assert hpa["status"].get("currentReplicas") == 1


def test_a_refused_apply_is_reported_in_status_then_recovers(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    """A platform policy (a real ValidatingAdmissionPolicy in the API server) refuses the operator's
    StatefulSet: the deployment says so, with the policy's message, instead of retrying silently."""
    name = f"team-label-{namespace[-6:]}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                                 "operations": ["CREATE", "UPDATE"], "resources": ["statefulsets"]}]},
            "validations": [{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                             "message": "every StatefulSet needs a team label"}],
        },
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
                 "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}},
    }  # fmt: skip
    labels = {"matchLabels": {"a": "b"}}
    probe = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "probe"},
             "spec": {"selector": labels, "template": {"metadata": {"labels": labels["matchLabels"]},
                      "spec": {"containers": [{"name": "c", "image": "x"}]}}}}  # fmt: skip
    dry_run = ["apply", "--dry-run=server", "-f", "-"]
    try:
        kubectl.apply([policy, binding])
        wait_for(
            "the policy to be enforced",
            lambda: kubectl(*dry_run, input=json.dumps(probe), namespace=namespace, check=False).returncode,
            lambda rc: rc != 0,
            timeout=30,
        )
        kubectl.apply(example("cpu-reference.yaml"), namespace=namespace)
        ld = wait_for(
            "Stalled with the policy's message",
            lambda: get_llmd(kubectl, namespace, "tiny-llama"),
            lambda o: is_true(o, "Stalled"),
            timeout=TIMEOUT,
        )
        stalled = condition(ld, "Stalled")
        assert stalled is not None and stalled["reason"] == "ReconcileFailed"
        assert "every StatefulSet needs a team label" in stalled["message"]
        events = kubectl.events(namespace, "tiny-llama")
        assert any(e["type"] == "Warning" and e["reason"] == "ReconcileFailed" for e in events)
    finally:
        kubectl.delete("validatingadmissionpolicybinding", name)
        kubectl.delete("validatingadmissionpolicy", name)
    ld = wait_ready(kubectl, namespace, "tiny-llama")
    assert not is_true(ld, "Stalled")
