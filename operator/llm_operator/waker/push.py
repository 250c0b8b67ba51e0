"""KEDA's external-push scaler, served by the waker: the direct wake-up signal at minReplicas 0.

The waker sees each generation request the moment it arrives, before the picker holds it; KEDA's
prometheus `wake` trigger sees it only after a Prometheus scrape and its own poll (2 s each). So the
waker also answers KEDA's `externalscaler.ExternalScaler` gRPC service (KEDA v2.21.0
pkg/scalers/externalscaler/externalscaler.proto; its client, pkg/scalers/external_scaler.go), as
KEDA's HTTP add-on does: `StreamIsActive` pushes `result: true` the moment a request is held, and
KEDA scales from zero on that push at once (pkg/scaling/scale_handler.go startPushScalers: an active
push goes straight to the scale executor, no poll). The `wake` trigger stays as the fallback: a
waker KEDA cannot reach leaves the wake-up as it was (docs/autoscaling.md, "The direct wake-up").

The messages are built at import from field tables (descriptor_pb2, message_factory): no generated
or fetched source in the repository. tests/unit/test_waker_push.py checks them against upstream's
proto field by field. The methods are served by a generic handler.

StreamMetricSpec (optional upstream) sends the one spec when KEDA opens it: KEDA then caches it and
reconciles the ScaledObject, which lists the push trigger's metric. Without it, a ScaledObject that
KEDA reconciled before the router was up would lack that metric, and KEDA would ignore every push
(scale_handler.go: "Could not resolve metric name for push scaler") until something else made it
reconcile the ScaledObject again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from llm_operator.waker.activity import CAPACITY_KEY, Activity

PACKAGE = "externalscaler"
SERVICE = f"{PACKAGE}.ExternalScaler"
# Field tables, as upstream's proto declares them: name -> [(field, number, type)]; "[]T" is
# repeated, "map" is map<string, string>.
MESSAGES: dict[str, list[tuple[str, int, str]]] = {
    "ScaledObjectRef": [("name", 1, "string"), ("namespace", 2, "string"), ("scalerMetadata", 3, "map")],
    "IsActiveResponse": [("result", 1, "bool")],
    "GetMetricSpecResponse": [("metricSpecs", 1, "[]MetricSpec")],
    "MetricSpec": [("metricName", 1, "string"), ("targetSize", 2, "int64"), ("targetSizeFloat", 3, "double")],
    "GetMetricsRequest": [("scaledObjectRef", 1, "ScaledObjectRef"), ("metricName", 2, "string")],
    "GetMetricsResponse": [("metricValues", 1, "[]MetricValue")],
    "MetricValue": [("metricName", 1, "string"), ("metricValue", 2, "int64"),
                    ("metricValueFloat", 3, "double")],
}  # fmt: skip
# The methods served: name -> (request, response, server-streaming).
METHODS = {
    "IsActive": ("ScaledObjectRef", "IsActiveResponse", False),
    "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", True),
    "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False),
    "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False),
    "StreamMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", True),
}
F = descriptor_pb2.FieldDescriptorProto
SCALARS = {"string": F.TYPE_STRING, "bool": F.TYPE_BOOL, "int64": F.TYPE_INT64, "double": F.TYPE_DOUBLE}

# The HPA metric of the trigger: requests held now. KEDA names it s<trigger index>-held.
METRIC = "held"
# HTTP/2 pings on KEDA's long-lived stream, so that a connection that died silently (a node gone)
# ends and KEDA reconnects.
KEEPALIVE = [("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000)]


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """externalscaler.proto's messages (proto3), from MESSAGES."""
    proto = descriptor_pb2.FileDescriptorProto(name="externalscaler.proto", package=PACKAGE, syntax="proto3")
    for name, fields in MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field, number, kind in fields:
            f = message.field.add(name=field, number=number, label=F.LABEL_OPTIONAL, json_name=field)
            if kind == "map":  # map<string, string>: a repeated nested entry message
                entry = message.nested_type.add(name=field[0].upper() + field[1:] + "Entry")
                entry.options.map_entry = True
                for key, number_in_entry in (("key", 1), ("value", 2)):
                    entry.field.add(name=key, number=number_in_entry, label=F.LABEL_OPTIONAL,
                                    type=F.TYPE_STRING, json_name=key)  # fmt: skip
                f.label, f.type = F.LABEL_REPEATED, F.TYPE_MESSAGE
                f.type_name = f".{PACKAGE}.{name}.{entry.name}"
                continue
            if kind.startswith("[]"):
                f.label, kind = F.LABEL_REPEATED, kind[2:]
            if kind in SCALARS:
                f.type = SCALARS[kind]
            else:
                f.type, f.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    return proto


def _classes() -> dict[str, Any]:
    pool = descriptor_pool.DescriptorPool()  # its own pool: nothing else registered can clash
    pool.Add(file_descriptor())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in MESSAGES}  # fmt: skip


MESSAGE = _classes()


def _capacity(ref: Any) -> int:
    """The trigger's requests per replica (scalerMetadata, render/scale_to_zero.py), at least 1."""
    text = str(ref.scalerMetadata.get(CAPACITY_KEY, "1"))
    return max(1, int(text)) if text.isdigit() else 1


class Scaler:
    """The five methods, on one deployment's activity (the waker serves its own deployment only:
    the ScaledObjectRef is not used to choose)."""

    def __init__(self, activity: Activity) -> None:
        self.activity = activity

    async def is_active(self, ref: Any, context: Any) -> Any:
        return MESSAGE["IsActiveResponse"](result=self.activity.active)

    async def stream_is_active(self, ref: Any, context: Any) -> AsyncIterator[Any]:
        async for active in self.activity.changes():
            yield MESSAGE["IsActiveResponse"](result=active)

    async def get_metric_spec(self, ref: Any, context: Any) -> Any:
        capacity = _capacity(ref)
        spec = MESSAGE["MetricSpec"](metricName=METRIC, targetSize=capacity, targetSizeFloat=float(capacity))
        return MESSAGE["GetMetricSpecResponse"](metricSpecs=[spec])

    async def stream_metric_spec(self, ref: Any, context: Any) -> AsyncIterator[Any]:
        """The spec at once (it never changes: its capacity is the trigger's own metadata), then
        the stream stays open until shutdown (KEDA would reopen a stream that ends, 2 s later)."""
        yield await self.get_metric_spec(ref, context)
        async for _ in self.activity.changes():
            pass

    async def get_metrics(self, request: Any, context: Any) -> Any:
        held = self.activity.held
        value = MESSAGE["MetricValue"](metricName=METRIC, metricValue=held, metricValueFloat=float(held))
        return MESSAGE["GetMetricsResponse"](metricValues=[value])

    def handler(self) -> grpc.GenericRpcHandler:
        behaviours = {"IsActive": self.is_active, "StreamIsActive": self.stream_is_active,
                      "GetMetricSpec": self.get_metric_spec, "GetMetrics": self.get_metrics,
                      "StreamMetricSpec": self.stream_metric_spec}  # fmt: skip
        handlers = {}
        for name, (request, response, streaming) in METHODS.items():
            make = grpc.unary_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
            handlers[name] = make(behaviours[name], request_deserializer=MESSAGE[request].FromString,
                                  response_serializer=MESSAGE[response].SerializeToString)  # fmt: skip
        return grpc.method_handlers_generic_handler(SERVICE, handlers)


async def serve(activity: Activity, address: str) -> tuple[grpc.aio.Server, int]:
    """The scaler on `address` (host:port; port 0 picks one), started; and the port bound."""
    server = grpc.aio.server(options=KEEPALIVE)
    server.add_generic_rpc_handlers((Scaler(activity).handler(),))
    port = server.add_insecure_port(address)
    await server.start()
    return server, port
