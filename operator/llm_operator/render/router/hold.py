"""The router's Envoy while the picker holds requests (autoscaling.minReplicas 0, render/scale_to_zero.py):
the picking listener waits out the hold, and the picker's refusals reach the client as OpenAI errors.

The picker ends a held request with an ext_proc ImmediateResponse and a plain-text body (GIE v1.5.0
pkg/common/error/error.go BuildErrResponse: 503 once the hold (its flow control's TTL) is over,
429 when its queue is full). Envoy sends an ImmediateResponse as a local reply (envoyproxy/envoy
source/extensions/filters/http/ext_proc/ext_proc.cc, sendImmediateResponse), so the listener's
local_reply_config rewrites it (api/envoy/extensions/filters/network/http_connection_manager/v3/
http_connection_manager.proto, LocalReplyConfig): OpenAI's error object (type, code, message with
the picker's words) and Retry-After. tests/unit/test_router_hold.py runs both through Envoy 1.40.
"""

from __future__ import annotations

from typing import Any

from llm_operator.render.scale_to_zero import RETRY_AFTER_SECONDS

# OpenAI's error object; the front door answers its own 503 the same way
# (frontdoor/server.py: server_error, model_not_ready).
REFUSALS = {
    503: (
        "server_error",
        "model_not_ready",
        "no replica could take the request within the router's hold of {hold} s "
        "(autoscaling.scaleToZero.holdSeconds; at zero replicas the first one was still starting)",
    ),
    429: (
        "requests",
        "rate_limit_exceeded",
        "the router already holds as many requests as it may (autoscaling.scaleToZero.maxHeldRequests) "
        "while the deployment starts or its replicas are busy",
    ),
}


def _mapper(status: int, hold_s: int) -> dict[str, Any]:
    kind, code, words = REFUSALS[status]
    message = words.format(hold=hold_s) + ": %LOCAL_REPLY_BODY%"
    return {
        "filter": {
            "status_code_filter": {
                "comparison": {
                    "op": "EQ",
                    "value": {"default_value": status, "runtime_key": f"llm_operator.refusal_{status}"},
                }
            }
        },
        "headers_to_add": [
            {
                "header": {"key": "retry-after", "value": str(RETRY_AFTER_SECONDS)},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
        ],
        "body_format_override": {
            "json_format": {"error": {"message": message, "type": kind, "param": None, "code": code}},
            "content_type": "application/json",
        },
    }


def local_reply_config(hold_s: int) -> dict[str, Any]:
    """The picking listener's local replies: its 503s and 429s as OpenAI errors with Retry-After."""
    return {"mappers": [_mapper(status, hold_s) for status in REFUSALS]}


def holding(manager: dict[str, Any], hold_s: int, request_timeout_s: int, silent_s: int) -> None:
    """The picking listener's connection manager, changed to hold requests: the whole request may take
    the hold on top of the time to send it (request_timeout runs until the request is upstream, which
    a held one is not); the stream may stay silent while held, where Envoy's default stream idle
    timeout (5 minutes) would cut it (the route matched before the picker sets its destination header
    sets none of its own); and the local replies above."""
    manager["request_timeout"] = f"{request_timeout_s + hold_s}s"
    manager["stream_idle_timeout"] = f"{silent_s}s"
    manager["local_reply_config"] = local_reply_config(hold_s)
