"""The autoscaler's health in the LLMDeployment's status, and KEDA as the second provider, on the
real control plane: the real HPA controller reports a metric it cannot read, and the real API
server validates the operator's ScaledObject against KEDA's own CRD (from the kedacore/keda Go
module, fetched through the module proxy into the cache, never into the repo)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.cluster.testing import Kubectl, condition, is_true, wait_for
from tests.e2e.test_operator import example, get_llmd

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.exclusive,
]  # adds and removes KEDA's CRD, which every autoscaling test reads

TIMEOUT = 90
KEDA_VERSION = "v2.21.0"
KEDA_CRD = "scaledobjects.keda.sh"
CONDITION = "AutoscalingActive"


def autoscaling_condition(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any] | None:
    return condition(get_llmd(kubectl, namespace, name), CONDITION)


def test_a_metric_nobody_serves_is_reported_and_replicas_stay(
    operator: None, kubectl: Kubectl, namespace: str
) -> None:
    """Pods that cannot be scheduled export nothing, so whatever the monitoring stack (none, or
    an adapter without this deployment's series), the HPA controller cannot read the metric."""
    doc = example("cpu-reference.yaml")
    doc["spec"]["resources"]["cpu"] = "64"  # no node has it: the pod stays Pending
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "metric": "queue-time",
        "target": "50000",
    }
    kubectl.apply(doc, namespace=namespace)
    # The HPA controller's own words, classified: without an adapter the API is missing; with one
    # (the monitoring stack), it has no series of this deployment's Pending pods. On a cluster
    # whose CRD is seconds old, the controller first reports `CannotScale` (its discovery does not
    # know the kind yet): the condition says so, then moves on.
    adapter = kubectl.get("apiservice", "v1beta1.custom.metrics.k8s.io")
    expected = {"MetricNotFound", "NoMetricData"} if adapter else {"MetricsApiUnavailable"}
    cond = wait_for(
        f"{CONDITION}=False from the HPA's own report ({' or '.join(sorted(expected))})",
        lambda: autoscaling_condition(kubectl, namespace, "tiny-llama"),
        lambda c: c is not None and c["status"] == "False" and c["reason"] in expected,
        timeout=TIMEOUT,
    )
    assert cond is not None
    assert "triton_queue_time_microseconds" in cond["message"], cond
    hpa = kubectl.get("hpa", "tiny-llama", namespace)
    assert hpa is not None
    active = condition(hpa, "ScalingActive")
    assert active is not None and active["status"] == "False"
    assert active["message"] in cond["message"], "the HPA's own words are quoted"
    warnings = [e for e in kubectl.events(namespace, "tiny-llama") if e["reason"] == cond["reason"]]
    assert warnings and warnings[0]["type"] == "Warning"
    # Several HPA syncs (2 s in the test world) later nothing has scaled, up or to zero.
    time.sleep(6)
    ld = get_llmd(kubectl, namespace, "tiny-llama")
    assert ld is not None and ld["spec"]["replicas"] == 1 and ld["status"]["replicas"] == 1
    assert len(kubectl.items("pods", namespace, "llmoperator.io/deployment=tiny-llama")) == 1


def keda_crd() -> Path:
    """KEDA's ScaledObject CRD from its Go module (config/crd/bases), cached outside the repo."""
    cache = Path(os.environ.get("LLMOP_CACHE") or Path.home() / ".cache" / "llm-operator")
    env = {**os.environ, "GOMODCACHE": str(cache / "gomod"), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    try:
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"github.com/kedacore/keda/v2@{KEDA_VERSION}"],
            env=env, cwd=cache, capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as e:
        pytest.fail(
            f"cannot fetch KEDA {KEDA_VERSION}'s CRDs through the Go module proxy: {e}", pytrace=False
        )
    return Path(json.loads(out.stdout)["Dir"]) / "config" / "crd" / "bases" / "keda.sh_scaledobjects.yaml"


@pytest.fixture
def no_keda(kubectl: Kubectl) -> Any:
    """The ScaledObject CRD absent before the test and removed after it (it is cluster-wide)."""
    kubectl.delete("crd", KEDA_CRD, wait=True)
    yield
    kubectl.delete("crd", KEDA_CRD, wait=True)


def test_keda_scaled_object_accepted_by_the_real_crd_and_pruned_on_provider_change(
    operator: None, kubectl: Kubectl, namespace: str, no_keda: None
) -> None:
    doc = example("cpu-reference-keda.yaml")
    name = doc["metadata"]["name"]
    kubectl.apply(doc, namespace=namespace)
    # Without KEDA: a clear condition, no crash loop, the serving objects applied all the same.
    cond = wait_for(
        f"{CONDITION}=False KedaNotInstalled",
        lambda: autoscaling_condition(kubectl, namespace, name),
        lambda c: c is not None and c["reason"] == "KedaNotInstalled",
        timeout=TIMEOUT,
    )
    assert cond is not None and "install KEDA" in cond["message"]
    assert kubectl.get("statefulset", name, namespace) is not None
    assert kubectl.get("hpa", name, namespace) is None, "no HPA stands in for the ScaledObject"

    crd = yaml.safe_load(keda_crd().read_text())
    kubectl.apply(crd)
    wait_for(
        "KEDA's ScaledObject CRD Established",
        lambda: kubectl.get("crd", KEDA_CRD),
        lambda c: is_true(c, "Established"),
    )
    # The operator retries on its own; its server-side apply passes the real CRD's schema.
    scaled = wait_for(
        "the operator's ScaledObject",
        lambda: kubectl.get("scaledobject", name, namespace),
        timeout=TIMEOUT,
    )
    assert scaled is not None
    target = {"apiVersion": "llmoperator.io/v1alpha1", "kind": "LLMDeployment", "name": name}
    assert scaled["spec"]["scaleTargetRef"] == target
    assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (1, 3)
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"]["query"] == (
        f'sum(triton_pending_requests{{namespace="{namespace}",llmoperator_io_deployment="{name}"}})'
    )
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 60
    fields = kubectl.json("get", "scaledobject", name, "--show-managed-fields", namespace=namespace)
    managers = {m["manager"]: m["operation"] for m in fields["metadata"]["managedFields"]}
    assert managers.get("llm-operator") == "Apply", managers
    wait_for(
        "the condition to leave KedaNotInstalled",
        lambda: autoscaling_condition(kubectl, namespace, name),
        lambda c: c is not None and c["reason"] != "KedaNotInstalled",
        timeout=TIMEOUT,
    )
    # KEDA was installed after the operator started: it watches ScaledObjects from then on, so
    # one deleted by hand comes back without anything else happening to the deployment.
    uid = scaled["metadata"]["uid"]
    kubectl.delete("scaledobject", name, namespace, wait=True)
    back = wait_for(
        "the ScaledObject deleted by hand, recreated",
        lambda: kubectl.get("scaledobject", name, namespace),
        lambda o: o is not None and o["metadata"]["uid"] != uid,
        timeout=TIMEOUT,
    )
    assert back is not None

    # hpa <-> keda: the other provider's object is pruned.
    doc["spec"]["autoscaling"]["provider"] = "hpa"
    kubectl.apply(doc, namespace=namespace)
    wait_for("the HPA", lambda: kubectl.get("hpa", name, namespace), timeout=TIMEOUT)
    wait_for("the ScaledObject pruned", lambda: kubectl.get("scaledobject", name, namespace),
             lambda o: o is None, timeout=TIMEOUT)  # fmt: skip
    doc["spec"]["autoscaling"]["provider"] = "keda"
    kubectl.apply(doc, namespace=namespace)
    wait_for("the ScaledObject again", lambda: kubectl.get("scaledobject", name, namespace), timeout=TIMEOUT)
    wait_for("the HPA pruned", lambda: kubectl.get("hpa", name, namespace), lambda o: o is None,
             timeout=TIMEOUT)  # fmt: skip


def test_a_served_metric_makes_autoscaling_active(operator: None, kubectl: Kubectl, namespace: str) -> None:
    """With the test world's monitoring stack (Prometheus, the chart's recording rules,
    prometheus-adapter), a serving pod's metric reaches the HPA and the condition turns True."""
    if kubectl.get("apiservice", "v1beta2.custom.metrics.k8s.io") is None:
        pytest.skip("no custom metrics API in this cluster (the monitoring stack is not running)")
    doc = example("cpu-reference.yaml")
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metric": "pending-requests",
        "target": "4",
    }
    kubectl.apply(doc, namespace=namespace)
    cond = wait_for(
        f"{CONDITION}=True",
        lambda: autoscaling_condition(kubectl, namespace, "tiny-llama"),
        lambda c: c is not None and c["status"] == "True",
        timeout=3 * TIMEOUT,  # the pod starts, is scraped, recorded and relisted
    )
    assert cond is not None and cond["reason"] == "MetricAvailable"
    assert "triton_pending_requests" in cond["message"]
    hpa = kubectl.get("hpa", "tiny-llama", namespace)
    assert hpa is not None and condition(hpa, "ScalingActive")["status"] == "True"  # type: ignore[index]
