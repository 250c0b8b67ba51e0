"""The router's Envoy limits and timeouts (routing.mode inference-pool), sized from the deployment.

Envoy's defaults suit a service mesh, not an LLM front: a cluster's circuit breakers allow 1,024
connections, pending and active requests (envoyproxy/envoy v1.40.0
api/envoy/config/cluster/v3/circuit_breaker.proto), which caps concurrent streams; a response
silent for 5 minutes is ended (HttpConnectionManager.stream_idle_timeout, http_connection_manager.proto),
which cuts an unstreamed answer still generating; downstream connections and the time to send
headers are unbounded. docs/routing.md ("The router's limits") says what a client sees at each.

Pure: the same spec and hold give the same limits (the router's ConfigMap, whose change restarts it).
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_operator.api.v1alpha1 import Backend, LLMDeploymentSpec
from llm_operator.profiles import PROFILES

# Both slots' leaders are in the pool while a rollout runs (render/router/objects.py leader_selector),
# each up to the replica ceiling.
LIVE_REVISIONS = 2
# Client connections per request the pool holds: one carrying it (HTTP/1.1 has one request per
# connection at a time) and one kept alive idle by a client's connection pool between requests.
CONNECTIONS_PER_REQUEST = 2
# Streams per HTTP/2 client connection: Envoy's edge recommendation, as GIE v1.5.0's standalone
# Envoy sets it (config/charts/standalone/values.yaml; envoyproxy/envoy
# docs/root/configuration/best_practices/edge.rst). Envoy's default is 2^31 - 1, which would let
# one connection carry every request past the connection cap.
HTTP2_MAX_CONCURRENT_STREAMS = 100


@dataclass(frozen=True)
class RouterLimits:
    """What envoy_config writes (render/router/envoy.py); tests shrink them to reach them."""

    # Circuit breakers of every cluster (connections, pending and active requests): the requests
    # the pool can hold at once, so Envoy's 1,024 never caps streams below what the engines take.
    requests: int
    # Client connections at once (overload manager): beyond it Envoy closes new ones unanswered.
    connections: int
    # A request's headers must arrive within this (slow loris); Envoy's default is none, and its
    # edge guide (best_practices/edge.rst) asks for one without a value: a client sends a few
    # hundred bytes of headers in far less.
    headers_timeout_s: int = 10
    # The whole request must arrive within this (a body sent byte by byte), Envoy's edge example's
    # 300 s; it ends once the request is upstream or a response starts, so it never cuts generation.
    request_timeout_s: int = 300
    # A kept-alive connection without a request is closed after this (Envoy's default: 1 hour): an
    # idle connection holds one of `connections`.
    idle_timeout_s: int = 300
    # How long a response may stay silent, and the longest one: an unstreamed answer sends nothing
    # until generation ends. GIE v1.5.0's standalone Envoy (config/charts/standalone/values.yaml)
    # sets a route timeout and idle_timeout of 86400 s.
    silent_timeout_s: int = 86_400
    # Request headers at most this size and count (Envoy's defaults, written out): 431 beyond.
    max_headers_kb: int = 60
    max_headers_count: int = 100
    # Scale to zero: seconds the picker holds a request (its flow control's TTL), 0 for none; the
    # picking listener then waits that long on top of its own timeouts (render/router/hold.py).
    hold_s: int = 0


def engine_queue_bound(spec: LLMDeploymentSpec) -> int:
    """Requests one replica's engine queues beyond its batch, 0 for no bound: the spec's
    runtime.batching.maxQueueSize, else the profile's for TensorRT-LLM's engines and none for
    cpu-reference (as modelrepo renders config.pbtxt); the pytorch backend queues inside the LLM
    API, without a bound the operator sets."""
    if spec.engine.backend == Backend.PYTORCH:
        return 0
    configured = spec.runtime.batching.max_queue_size
    if configured is not None:
        return configured
    if spec.engine.backend == Backend.CPU_REFERENCE:
        return 0
    return PROFILES[spec.runtime.profile].max_queue_size


def replica_ceiling(spec: LLMDeploymentSpec) -> int:
    """The most replicas the deployment runs without an edit of its limits: the autoscaler's
    maxReplicas, else spec.replicas, rounded up to a power of two so that scaling within it leaves
    the router's configuration, and so the router, as they are."""
    replicas = spec.autoscaling.max_replicas if spec.autoscaling is not None else spec.replicas
    return 1 << max(replicas - 1, 0).bit_length()


def replica_capacity(spec: LLMDeploymentSpec) -> int:
    """Requests one replica takes at once: a full batch and its engine's queue bound (with no bound,
    one more batch waiting: the router's is then the only bound)."""
    batch = spec.engine.max_batch_size
    return batch + (engine_queue_bound(spec) or batch)


def router_limits(spec: LLMDeploymentSpec, hold_s: int = 0) -> RouterLimits:
    """Requests the pool can hold: each replica's capacity, for the replica ceiling and both
    revisions of a rollout; at minReplicas 0 also the requests the picker may hold
    (autoscaling.scaleToZero.maxHeldRequests), each on its own client connection. `hold_s`: the
    picker's hold at minReplicas 0 (render/scale_to_zero.py router_hold), 0 for none."""
    requests = replica_capacity(spec) * replica_ceiling(spec) * LIVE_REVISIONS
    zero = spec.autoscaling.zero if spec.autoscaling is not None else None
    if zero is not None:
        requests += zero.max_held_requests
    return RouterLimits(requests=requests, connections=requests * CONNECTIONS_PER_REQUEST, hold_s=hold_s)
