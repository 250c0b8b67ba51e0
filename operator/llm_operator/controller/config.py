"""Operator settings from the environment (the Helm chart sets them), read once at start."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from llm_operator import releases
from llm_operator.api.v1alpha1 import DNS_LABEL
from llm_operator.controller.cluster.lease import ElectionConfig
from llm_operator.controller.rollout.prometheus_urls import Endpoint, parse_list
from llm_operator.images import (
    DEFAULT_ENVOY_IMAGE,
    DEFAULT_FETCH_IMAGE,
    DEFAULT_LAUNCHER_REPOSITORY,
    DEFAULT_OPERATOR_IMAGE,
    DEFAULT_PICKER_IMAGE,
    LAUNCHER_REPOSITORY_VARIABLE,
    Images,
    launcher_image,
)
from llm_operator.render.autoscaling import DEFAULT_PROMETHEUS_URL
from llm_operator.render.network import DEFAULT_KEDA_NAMESPACE, DEFAULT_METRICS_PEERS, parse_peers

# The version table's default release (releases.py): NVIDIA's image and its TensorRT-LLM.
DEFAULT_RUNTIME_IMAGE = releases.DEFAULT.image
DEFAULT_TRTLLM_VERSION = releases.DEFAULT.trtllm
# In a pod: the namespace of its ServiceAccount, i.e. the operator's own.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class OperatorConfig:
    images: Images
    workers: int
    metrics_port: int
    health_port: int
    namespaces: tuple[str, ...]  # empty: all namespaces
    leader_election: ElectionConfig | None  # None: this process reconciles alone
    prometheus_url: str = DEFAULT_PROMETHEUS_URL  # what KEDA ScaledObjects' triggers query
    # Who may scrape serving pods' metrics port: namespace names and CIDRs (render/network.py).
    metrics_peers: tuple[str, ...] = DEFAULT_METRICS_PEERS
    # Where KEDA's operator runs: the one client of the router's waker at minReplicas 0.
    keda_namespace: str = DEFAULT_KEDA_NAMESPACE
    # What canary analysis may query (controller/rollout/prometheus_urls.py); empty: no analysis runs.
    analysis_prometheus_urls: tuple[Endpoint, ...] = parse_list(DEFAULT_PROMETHEUS_URL, "default")
    # The model fetch Jobs' bandwidth cap (chart value fetch.maxBytesPerSecond); None: no cap.
    fetch_max_bytes_per_second: int | None = None

    @classmethod
    def from_env(cls, namespaces: tuple[str, ...] = ()) -> OperatorConfig:
        env = os.environ.get
        prometheus_url = env("LLMOP_PROMETHEUS_URL", DEFAULT_PROMETHEUS_URL)
        trtllm_version = env("LLMOP_TRTLLM_VERSION", DEFAULT_TRTLLM_VERSION)
        return cls(
            images=Images(
                runtime=env("LLMOP_RUNTIME_IMAGE", DEFAULT_RUNTIME_IMAGE),
                cpu_runtime=env(
                    "LLMOP_CPU_RUNTIME_IMAGE", "ghcr.io/llm-operator/llm-operator/cpu-runtime:0.1.0"
                ),
                # "": NVIDIA's image of the release (desired.py); set it to use a mirror.
                engine_builder=env("LLMOP_ENGINE_BUILDER_IMAGE", ""),
                trtllm_version=trtllm_version,
                # Tagged with the content hash of the files this operator's package injects.
                launcher=launcher_image(env(LAUNCHER_REPOSITORY_VARIABLE, DEFAULT_LAUNCHER_REPOSITORY)),
                fetch=env("LLMOP_FETCH_IMAGE", DEFAULT_FETCH_IMAGE),
                picker=env("LLMOP_PICKER_IMAGE", DEFAULT_PICKER_IMAGE),
                envoy=env("LLMOP_ENVOY_IMAGE", DEFAULT_ENVOY_IMAGE),
                waker=env("LLMOP_WAKER_IMAGE", DEFAULT_OPERATOR_IMAGE),
            ),
            workers=int(env("LLMOP_WORKERS", "16")),
            metrics_port=int(env("LLMOP_METRICS_PORT", "8000")),
            health_port=int(env("LLMOP_HEALTH_PORT", "8080")),
            namespaces=namespaces,
            leader_election=election_from_env(),
            prometheus_url=prometheus_url,
            metrics_peers=parse_peers(env("LLMOP_METRICS_PEERS", ",".join(DEFAULT_METRICS_PEERS))),
            keda_namespace=keda_namespace(env("LLMOP_KEDA_NAMESPACE", DEFAULT_KEDA_NAMESPACE)),
            analysis_prometheus_urls=parse_list(
                env("LLMOP_ANALYSIS_PROMETHEUS_URLS", prometheus_url), "LLMOP_ANALYSIS_PROMETHEUS_URLS"
            ),
            fetch_max_bytes_per_second=positive_int(env("LLMOP_FETCH_MAX_BYTES_PER_SECOND", "")),
        )


def keda_namespace(text: str) -> str:
    """LLMOP_KEDA_NAMESPACE: one namespace name."""
    if len(text) > 63 or not re.fullmatch(DNS_LABEL, text):
        raise ValueError(f"LLMOP_KEDA_NAMESPACE: {text!r} is not a namespace name")
    return text


def positive_int(text: str) -> int | None:
    """LLMOP_FETCH_MAX_BYTES_PER_SECOND: "" is unset; anything else a positive integer."""
    if not text:
        return None
    if not text.isdigit() or int(text) <= 0:
        raise ValueError(f"LLMOP_FETCH_MAX_BYTES_PER_SECOND must be a positive integer, not {text!r}")
    return int(text)


def election_from_env() -> ElectionConfig | None:
    env = os.environ.get
    enabled = env("LLMOP_LEADER_ELECTION", "false")
    if enabled not in ("true", "false"):
        raise ValueError(f"LLMOP_LEADER_ELECTION must be true or false, not {enabled!r}")
    if enabled == "false":
        return None
    own_namespace = POD_NAMESPACE_FILE.read_text().strip() if POD_NAMESPACE_FILE.exists() else "default"
    return ElectionConfig(
        lease=env("LLMOP_LEADER_ELECTION_LEASE", "llm-operator"),
        namespace=env("LLMOP_LEADER_ELECTION_NAMESPACE", own_namespace),
        identity=env("LLMOP_LEADER_ELECTION_IDENTITY") or socket.gethostname(),
        lease_duration_seconds=int(env("LLMOP_LEASE_DURATION_SECONDS", "15")),
        renew_deadline_seconds=int(env("LLMOP_RENEW_DEADLINE_SECONDS", "10")),
        retry_period_seconds=int(env("LLMOP_RETRY_PERIOD_SECONDS", "2")),
    )
