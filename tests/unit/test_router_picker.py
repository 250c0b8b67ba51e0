"""The picker's configuration (render/router/envoy.py epp_config) loaded by the real endpoint
picker of gateway-api-inference-extension v1.5.0, as the router's epp container runs it.

The EPP reads its configuration after connecting to no API yet: pointed at an API server that
does not answer (127.0.0.1:1), it loads and logs the file, then stops. The binary is the one
e2e/cluster/build-tools.sh builds (LLMOP_EPP_BIN or ~/.cache/llm-operator/bin/epp-v1.5.0-*/epp);
absent, the test skips and says so.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from llm_operator.api.v1alpha1 import FailureMode
from llm_operator.controller.config import OperatorConfig
from llm_operator.render.router.objects import limits_for, router_config, router_deployment

from tests.unit.test_router_envoy import _deployment
from tests.unit.test_router_hold import zero_deployment


def _epp() -> Path | None:
    if configured := os.environ.get("LLMOP_EPP_BIN"):
        return Path(configured)
    cache = Path(os.environ.get("LLMOP_CACHE", Path.home() / ".cache" / "llm-operator")) / "bin"
    found = sorted(cache.glob("epp-v1.5.0-*/epp"))
    return found[-1] if found else None


EPP = _epp()

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: none, user: {}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
"""


@pytest.mark.skipif(
    EPP is None or not EPP.is_file(),
    reason="no EPP binary: set LLMOP_EPP_BIN, or let e2e/cluster/build-tools.sh build it",
)
def test_the_picker_loads_the_rendered_config_with_the_rendered_flags(tmp_path: Path) -> None:
    ld = _deployment(FailureMode.FAIL_CLOSE)
    limits = limits_for(ld)
    config = router_config(ld, limits)
    (tmp_path / "epp.yaml").write_text(config["data"]["epp.yaml"])
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    deployment = router_deployment(ld, OperatorConfig.from_env().images, config, limits)
    (epp,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "epp"]
    args = [str(tmp_path / "epp.yaml") if a == "/config/epp.yaml" else a for a in epp["args"]]
    env = {"KUBECONFIG": str(tmp_path / "kubeconfig"), "NAMESPACE": "team", "POD_NAME": "router-0"}
    run = subprocess.run([str(EPP), *args], capture_output=True, text=True, timeout=60, env=env)
    log = run.stdout + run.stderr
    assert "loaded configuration from file/text successfully" in log, log[-3000:]
    # Pods need no engine label: Triton + TensorRT-LLM's metric names are the default profile.
    assert r"{\"defaultEngine\":\"triton-tensorrt-llm\"}" in log, log[-3000:]
    assert '"model-server-metrics-port":8002' in log, "Triton's metrics port, not the pool's target port"


@pytest.mark.skipif(
    EPP is None or not EPP.is_file(),
    reason="no EPP binary: set LLMOP_EPP_BIN, or let e2e/cluster/build-tools.sh build it",
)
def test_the_picker_loads_the_flow_control_of_a_deployment_at_zero(tmp_path: Path) -> None:
    """At autoscaling.minReplicas 0 the configuration turns on the flowControl feature gate with the
    hold and the bound (render/scale_to_zero.py): the picker accepts them as it reads its file."""
    ld = zero_deployment()
    config = router_config(ld, limits_for(ld))
    (tmp_path / "epp.yaml").write_text(config["data"]["epp.yaml"])
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    env = {"KUBECONFIG": str(tmp_path / "kubeconfig"), "NAMESPACE": "team", "POD_NAME": "router-0"}
    args = ["--pool-name", "tiny", "--pool-namespace", "team", "--config-file", str(tmp_path / "epp.yaml")]
    run = subprocess.run([str(EPP), *args], capture_output=True, text=True, timeout=60, env=env)
    log = run.stdout + run.stderr
    assert "loaded configuration from file/text successfully" in log, log[-3000:]
    # The picker's own reading of them (its effective configuration, logged before it connects).
    assert "FeatureGates: {flowControl}" in log, log[-3000:]
    held = "MaxRequests: 20, DefaultRequestTTL: 11s, DefaultPriorityBand: {Priority: 0, MaxRequests: 20}"
    assert held in log, log[-3000:]
