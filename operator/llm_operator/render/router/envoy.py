"""The router's two configuration files (routing.mode inference-pool): the endpoint picker's
EndpointPickerConfig and Envoy's bootstrap. Pure text builders; render/router/objects.py puts them in the
router's ConfigMap.

The shape follows the standalone pattern of kubernetes-sigs/gateway-api-inference-extension v1.5.0
(config/charts/standalone/values.yaml: Envoy beside the EPP, ext_proc over TLS to 127.0.0.1:9002,
an ORIGINAL_DST cluster keyed on the header the EPP sets; config/charts/epplib/templates/_config.yaml:
the scorers and the metrics data layer). Written for Triton + TensorRT-LLM, not copied.
"""

from __future__ import annotations

from typing import Any

import yaml

from llm_operator.api.v1alpha1 import FailureMode
from llm_operator.contract import OPENAI_PORT
from llm_operator.render.router.hold import holding
from llm_operator.render.router.limits import HTTP2_MAX_CONCURRENT_STREAMS, RouterLimits

PICKER_GRPC_PORT = 9002  # ext_proc (EPP --grpc-port default, GIE v1.5.0 pkg/epp/server/options.go)
PICKER_HEALTH_PORT = 9003  # gRPC health (--grpc-health-port)
PICKER_METRICS_PORT = 9090  # the EPP's own Prometheus metrics (--metrics-port)
ENVOY_READY_PORT = 19001  # Envoy's /ready listener (the port upstream's standalone chart uses)
# The picker's certificate (controller/secrets/picker_tls.py): Envoy trusts only the authority that signed
# it, and asks for this name, which the certificate carries beside the router Service's.
PICKER_SERVER_NAME = "localhost"
PICKER_CA_MOUNT = "/etc/llm-operator/picker-ca"
PICKING_PORT = 18080  # Envoy's second listener, on 127.0.0.1, where the picker runs
# Set by the EPP on the request it picked an endpoint for (GIE v1.5.0
# docs/proposals/004-endpoint-picker-protocol): `podIP:targetPort`.
DESTINATION_HEADER = "x-gateway-destination-endpoint"
# The triton-tensorrt-llm engine profile of the EPP's core metrics extractor (GIE v1.5.0
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go): queue
# nv_trt_llm_request_metrics{request_type=waiting}, running {request_type=scheduled}, KV use
# nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}. As the default engine, no pod
# label is needed to select it.
ENGINE_PROFILE = "triton-tensorrt-llm"

_TYPES = "type.googleapis.com/envoy.extensions"
_HCM = f"{_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager"
_ROUTER = {
    "name": "envoy.filters.http.router",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "suppress_envoy_headers": True,
    },
}


def epp_config(flow_control: dict[str, Any] | None = None) -> str:
    """EndpointPickerConfig: queue, KV-cache and prefix-cache scorers (upstream's default profile and
    weights, 2/2/3 in v1.5.0 config/charts/epplib/templates/_config.yaml) over the metrics the
    leaders' Triton exports. The metrics port (8002, not the pool's
    target port 8080) is a flag of the EPP in v1.5.0 (render/router/objects.py). `flow_control`: the
    fields that make it hold requests at zero replicas (render/scale_to_zero.py)."""
    config = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "queue-scorer"},
            {"type": "kv-cache-utilization-scorer"},
            {"type": "prefix-cache-scorer"},
            {"type": "metrics-data-source", "parameters": {"scheme": "http", "path": "/metrics"}},
            {"type": "core-metrics-extractor", "parameters": {"defaultEngine": ENGINE_PROFILE}},
        ],
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    {"pluginRef": "queue-scorer", "weight": 2},
                    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
                    {"pluginRef": "prefix-cache-scorer", "weight": 3},
                ],
            }
        ],
        **(flow_control or {}),
    }
    return yaml.safe_dump(config, sort_keys=False)


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _cluster(name: str, host: str, port: int, **fields: Any) -> dict[str, Any]:
    endpoint = {"endpoint": {"address": _address(host, port)}}
    assignment = {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint]}]}
    return {"name": name, "load_assignment": assignment, **fields}


def _ready_listener(bind: str, port: int) -> dict[str, Any]:
    """GET /ready answers 200 while Envoy runs (not draining): the envoy container's readiness."""
    health = {
        "name": "envoy.filters.http.health_check",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck",
            "pass_through_mode": False,
            "headers": [{"name": ":path", "string_match": {"exact": "/ready"}}],
        },
    }
    manager = {
        "@type": _HCM,
        "stat_prefix": "ready",
        "route_config": {"name": "ready", "virtual_hosts": [{"name": "ready", "domains": ["*"]}]},
        "http_filters": [health, _ROUTER],
    }
    return {
        "name": "ready",
        "address": _address(bind, port),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }  # fmt: skip


def _listener(
    name: str, bind: str, port: int, routes: list[dict[str, Any]], filters: list[Any], limits: RouterLimits
) -> dict[str, Any]:
    manager = {
        "@type": _HCM,
        "stat_prefix": name,
        "route_config": {"name": name, "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}]},
        "http_filters": [*filters, _ROUTER],
        "normalize_path": True,
        "merge_slashes": True,
        "request_headers_timeout": f"{limits.headers_timeout_s}s",
        "request_timeout": f"{limits.request_timeout_s}s",
        "max_request_headers_kb": limits.max_headers_kb,
        "common_http_protocol_options": {
            "headers_with_underscores_action": "REJECT_REQUEST",
            "idle_timeout": f"{limits.idle_timeout_s}s",
            "max_headers_count": limits.max_headers_count,
        },
        # Envoy's edge values, as GIE v1.5.0's standalone Envoy sets them (router_limits.py).
        "http2_protocol_options": {
            "max_concurrent_streams": HTTP2_MAX_CONCURRENT_STREAMS,
            "initial_stream_window_size": 65536,
            "initial_connection_window_size": 1048576,
        },
    }
    chain = {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}
    return {
        "name": name,
        "address": _address(bind, port),
        "per_connection_buffer_limit_bytes": 32768,
        "filter_chains": [chain],
    }


def _route(cluster: str, limits: RouterLimits) -> dict[str, Any]:
    """LLM responses stream for as long as generation takes, and an unstreamed one is silent until
    it ends: neither the overall deadline (Envoy's default 15 s) nor the silence allowed (5 min)
    may cut them (router_limits.py)."""
    silent = f"{limits.silent_timeout_s}s"
    return {"cluster": cluster, "timeout": silent, "idle_timeout": silent}


# A client must not choose the pod (or any address) by sending the picker's header itself: removed
# before the picker runs, so only the picker's value is ever routed on.
_STRIP_DESTINATION = {
    "name": "envoy.filters.http.header_mutation",
    "typed_config": {
        "@type": f"{_TYPES}.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": [{"remove": DESTINATION_HEADER}]},
    },
}
_H2 = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": f"{_TYPES}.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    }
}

_ONE_REQUEST_PER_CONNECTION = {
    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": f"{_TYPES}.upstreams.http.v3.HttpProtocolOptions",
        "common_http_protocol_options": {"max_requests_per_connection": 1},
        "explicit_http_config": {"http_protocol_options": {}},
    }
}


def _ext_proc(picker_port: int) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": f"{_TYPES}.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {
                "envoy_grpc": {"cluster_name": "picker", "authority": f"localhost:{picker_port}"},
                # GIE v1.5.0's value (config/charts/standalone/values.yaml), as message_timeout's,
                # where response bodies stream through the picker too. Envoy opens the processing
                # stream without a deadline (envoyproxy/envoy
                # source/extensions/filters/http/ext_proc/client_impl.cc, read, not run past 10 s).
                "timeout": "10s",
            },
            # The EPP answers only streamed body mutations (GIE v1.5.0 pkg/common/envoy/chunking.go),
            # so bodies stream through it (FULL_DUPLEX_STREAMED), and Envoy cannot let a request
            # whose body the picker already took continue without it (failure_mode_allow then
            # still answers 500, seen with Envoy 1.40): FailOpen is decided before, in
            # envoy_config, from the picker's health.
            "failure_mode_allow": False,
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
            # How long one message may wait for the picker's answer (Envoy's default: 200 ms); the
            # picker answers at once unless its flow control (on at minReplicas 0) holds the request
            # back: autoscaling.scaleToZero.holdSeconds stays below this (MAX_HOLD_SECONDS).
            "message_timeout": "1000s",
        },
    }


def envoy_config(
    failure_mode: FailureMode,
    service_host: str,
    *,
    limits: RouterLimits,
    service_port: int = OPENAI_PORT,
    bind: str = "0.0.0.0",
    client_bind: str | None = None,
    listen_port: int = OPENAI_PORT,
    ready_port: int = ENVOY_READY_PORT,
    picker_port: int = PICKER_GRPC_PORT,
    picker_health_port: int = PICKER_HEALTH_PORT,
    picking_port: int = PICKING_PORT,
    picker_ca: str = f"{PICKER_CA_MOUNT}/ca.crt",
) -> dict[str, Any]:
    """Envoy's bootstrap. The OpenAI listener forwards each request to the picking listener
    (127.0.0.1 only), where the picker takes it over ext_proc, sets the destination header, and the
    request goes to that pod (ORIGINAL_DST). The picking listener is reached only while the
    picker's gRPC health check says it serves. FailClose: nothing else, so while it does not, Envoy
    answers 503 (no healthy upstream); a request the picker took and then could not answer is a
    500, one it let through unpicked a 503. FailOpen: while it does not, requests go to the client
    Service (`service_host`, which spreads them over the ready leaders as routing.mode service
    does): an aggregate cluster takes the first of the two with a healthy host. The addresses are
    parameters so a test runs the same configuration on 127.0.0.1 ports; `client_bind`, where the
    OpenAI listener binds if not at `bind` (127.0.0.1 behind the waker, render/router/waker.py)."""
    picked: dict[str, Any] = {
        "match": {"prefix": "/", "headers": [{"name": DESTINATION_HEADER, "present_match": True}]},
        "route": _route("picked", limits),
    }
    unpicked = {
        "match": {"prefix": "/"},
        "direct_response": {
            "status": 503,
            "body": {"inline_string": "the endpoint picker chose no replica for this request"},
        },
    }
    picking = [picked, unpicked]
    clusters: list[dict[str, Any]] = [
        # The EPP serves ext_proc over TLS with the deployment's own certificate, verified here
        # (upstream's standalone chart lets the EPP make a self-signed one and verifies nothing).
        _cluster(
            "picker",
            "127.0.0.1",
            picker_port,
            type="STATIC",
            connect_timeout="1s",
            transport_socket={
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": f"{_TYPES}.transport_sockets.tls.v3.UpstreamTlsContext",
                    "sni": PICKER_SERVER_NAME,
                    "common_tls_context": {
                        "alpn_protocols": ["h2"],
                        "validation_context": {
                            "trusted_ca": {"filename": picker_ca},
                            "match_typed_subject_alt_names": [
                                {"san_type": "DNS", "matcher": {"exact": PICKER_SERVER_NAME}}
                            ],
                        },
                    },
                },
            },
            typed_extension_protocol_options=_H2,
        ),
        {
            "name": "picked",
            "type": "ORIGINAL_DST",
            "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "5s",
            "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        },
    ]
    # Both modes reach the picker through a second listener on 127.0.0.1, behind a cluster that
    # is health-checked with the EPP's own health service (plain gRPC on 9003: SERVING once it has
    # synced its pool). A picker that stops answering is seen within one check, and no request is
    # then sent into it, where it would wait on a picker that never answers: FailClose answers 503
    # (no healthy upstream), FailOpen takes the client Service.
    picking_cluster = _cluster("picking", "127.0.0.1", picking_port, type="STATIC", connect_timeout="1s")
    endpoint = picking_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["health_check_config"] = {"port_value": picker_health_port}
    picking_cluster["health_checks"] = [
        {
            "timeout": "1s",
            "interval": "2s",
            # Envoy checks a cluster that has had no traffic every 60 s by default, and the
            # picking cluster gets none while the picker is down: its recovery must be seen as
            # soon as its failure is.
            "no_traffic_interval": "2s",
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "grpc_health_check": {"service_name": "inference-extension"},
        }
    ]
    # Envoy's panic mode would send requests to the one unhealthy host all the same (under 50 %
    # healthy, health is ignored by default): an unhealthy picker gets none.
    picking_cluster["common_lb_config"] = {"healthy_panic_threshold": {"value": 0}}
    picking_cluster["typed_extension_protocol_options"] = _H2
    clusters.append(picking_cluster)
    to = "picking"
    if failure_mode == FailureMode.FAIL_OPEN:
        to = "pick-or-service"
        clusters += [
            # One request per connection: kube-proxy picks a replica per connection, and Envoy
            # would otherwise send request after request down one kept-alive connection to the
            # same replica (seen on the real node: all of them to the straggler).
            _cluster(
                "service",
                service_host,
                service_port,
                type="STRICT_DNS",
                connect_timeout="5s",
                typed_extension_protocol_options=_ONE_REQUEST_PER_CONNECTION,
            ),
            {
                "name": to,
                "connect_timeout": "1s",
                "lb_policy": "CLUSTER_PROVIDED",
                "cluster_type": {
                    "name": "envoy.clusters.aggregate",
                    "typed_config": {
                        "@type": f"{_TYPES}.clusters.aggregate.v3.ClusterConfig",
                        "clusters": ["picking", "service"],
                    },
                },
            },
        ]
    forward = [{"match": {"prefix": "/"}, "route": _route(to, limits)}]
    listeners = [
        _ready_listener(bind, ready_port),
        _listener("openai", client_bind or bind, listen_port, forward, [_STRIP_DESTINATION], limits),
        _listener("picking", "127.0.0.1", picking_port, picking, [_ext_proc(picker_port)], limits),
    ]
    if limits.hold_s:
        manager = listeners[2]["filter_chains"][0]["filters"][0]["typed_config"]
        holding(manager, limits.hold_s, limits.request_timeout_s, limits.silent_timeout_s)
    # Only client connections count against the cap: the kubelet's probes and Envoy's own
    # connections to the picking listener are always accepted.
    for listener in (listeners[0], listeners[2]):
        listener["ignore_global_conn_limit"] = True
    # Every request passes through each cluster on its way: none may overflow before the pool is
    # full (Envoy's default of 1,024 would: circuit_breaker.proto).
    for cluster in clusters:
        cluster["circuit_breakers"] = {"thresholds": [{
            "max_connections": limits.requests, "max_pending_requests": limits.requests,
            "max_requests": limits.requests,
        }]}  # fmt: skip
    overload = {
        "resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": f"{_TYPES}.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                "max_active_downstream_connections": limits.connections,
            },
        }]
    }  # fmt: skip
    return {"static_resources": {"listeners": listeners, "clusters": clusters}, "overload_manager": overload}


class _Plain(yaml.SafeDumper):
    """Every shared piece written out in full (no &anchors): the file reads as Envoy's docs do."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def envoy_yaml(config: dict[str, Any]) -> str:
    return yaml.dump(config, Dumper=_Plain, sort_keys=False, width=100)
