"""The router's waker container at autoscaling.minReplicas 0 (llm_operator/waker/): clients reach it on
the router Service's OpenAI port, and it passes each request to Envoy, which then listens on
127.0.0.1 only, so that no request bypasses it. A streamed request held while the first replica
starts gets `: waking` SSE comments from it (docs/autoscaling.md, "Progress while held"). It also
serves KEDA's external-push scaler, which wakes the deployment the moment a request is held
(docs/autoscaling.md, "The direct wake-up").

It runs `python3 -m llm_operator.waker` from the operator's own image (LLMOP_WAKER_IMAGE, which the
chart sets to the operator's), with h11 as the front door has it; its bounds are the router's
(render/router/limits.py), so it refuses nothing Envoy would let through.

Pure: the same spec renders the same container (golden files pin it).
"""

from __future__ import annotations

import copy
from typing import Any

from llm_operator.api.v1alpha1 import GROUP, PLURAL, LLMDeployment
from llm_operator.contract import OPENAI_PORT
from llm_operator.frontdoor.http1 import body_limit
from llm_operator.modelrepo import sequence_limits
from llm_operator.render.router.limits import RouterLimits
from llm_operator.render.scale_to_zero import PUSH_PORT, PUSH_PORT_NAME, RETRY_AFTER_SECONDS
from llm_operator.waker.exchange import FIRST_WAIT_S, INTERVAL_S

# Envoy's OpenAI listener behind the waker: on 127.0.0.1, beside the picking listener (18080).
ENVOY_BEHIND_WAKER_PORT = 18081
# Above Envoy's header size cap (60 KiB of fields): Envoy answers its own 431 first.
HEAD_BYTES = 64 * 1024
# How long an answer may stay silent beyond Envoy's own limit: Envoy's 504 comes first.
SILENCE_MARGIN_S = 60
RESTRICTED: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


def waking(ld: LLMDeployment) -> bool:
    """Whether the router has a waker: only where the picker holds requests (minReplicas 0)."""
    return ld.spec.autoscaling is not None and ld.spec.autoscaling.zero is not None


def waker_args(ld: LLMDeployment, limits: RouterLimits) -> list[str]:
    """When to send comments and how often (llm_operator/waker/exchange.py); the waker's bounds, as
    Envoy's: its connection cap and header count, its header, request and
    idle timeouts, its silence; the body kept to read `stream` from is the front door's cap for the
    model (a larger body is refused there, streamed or not); the port KEDA's stream is served on."""
    max_input_len, _ = sequence_limits(ld.spec)
    flags = {
        "port": OPENAI_PORT,
        "envoy-port": ENVOY_BEHIND_WAKER_PORT,
        "first-wait-seconds": f"{FIRST_WAIT_S:g}",
        "interval-seconds": f"{INTERVAL_S:g}",
        "max-connections": limits.connections,
        "max-headers": limits.max_headers_count,
        "max-head-bytes": HEAD_BYTES,
        "inspect-bytes": body_limit(max_input_len),
        "head-timeout-seconds": limits.headers_timeout_s,
        "body-timeout-seconds": limits.request_timeout_s,
        "idle-timeout-seconds": limits.idle_timeout_s,
        "silence-seconds": limits.silent_timeout_s + SILENCE_MARGIN_S,
        "retry-after-seconds": RETRY_AFTER_SECONDS,
        # Its status, read while requests are held, ends them when no replica can start.
        "deployment": ld.name,
        "push-port": PUSH_PORT,
    }
    return [part for name, value in flags.items() for part in (f"--{name}", str(value))]


# The waker's only API request: its own LLMDeployment, by name (the router's Role, objects.py).
WAKER_RULE: dict[str, Any] = {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get"]}


def waker_rule(ld: LLMDeployment) -> dict[str, Any]:
    return {**copy.deepcopy(WAKER_RULE), "resourceNames": [ld.name]}


def waker_container(ld: LLMDeployment, image: str, limits: RouterLimits,
                    token: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """`token`: the mount of the router's ServiceAccount credentials (its Role lets the waker get
    its own LLMDeployment, and what the picker reads)."""
    # A TCP probe: an HTTP one would pass through to Envoy and the picker, which would hold it.
    probe = {"tcpSocket": {"port": "openai"}, "periodSeconds": 5}
    return {
        "name": "waker",
        "image": image,
        "command": ["python3", "-m", "llm_operator.waker"],
        "args": waker_args(ld, limits),
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "ports": [
            {"name": "openai", "containerPort": OPENAI_PORT, "protocol": "TCP"},
            {"name": PUSH_PORT_NAME, "containerPort": PUSH_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": probe,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
        "securityContext": copy.deepcopy(RESTRICTED),
        "volumeMounts": [copy.deepcopy(token)],
    }
