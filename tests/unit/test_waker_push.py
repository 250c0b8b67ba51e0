"""The waker's KEDA external-push scaler (llm_operator/waker/push.py) on real sockets, called by a real
gRPC client as KEDA calls it: StreamIsActive pushes true within 100 ms of a held generation request
and false QUIET_S after the last; IsActive and GetMetrics answer from the same state;
StreamMetricSpec sends the spec at once; both streams end cleanly at shutdown. Its messages match
KEDA v2.21.0's externalscaler.proto, field by field, and encode as protobuf's wire format says; and
KEDA's own generated Go client (keda_client/main.go) reads each answer as KEDA's operator would."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from llm_operator.waker.activity import CAPACITY_KEY, QUIET_S
from llm_operator.waker.push import MESSAGE, MESSAGES, METHODS, METRIC, SERVICE

from e2e.cluster.keda import RELEASE
from tests.unit.waker_fixtures import exchange, request_bytes, running

REPO = Path(__file__).resolve().parents[2]
UNSTREAMED = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 2}


def _call(channel: grpc.Channel, method: str, streaming: bool = False) -> Any:
    request, response, _ = METHODS[method]
    make = channel.unary_stream if streaming else channel.unary_unary
    return make(f"/{SERVICE}/{method}", request_serializer=MESSAGE[request].SerializeToString,
                response_deserializer=MESSAGE[response].FromString)  # fmt: skip


class Stream:
    """StreamIsActive read on a thread: (monotonic time, result) per message, and how it ended."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.pushed: list[tuple[float, bool]] = []
        self.ended: str | None = None
        self.call = _call(channel, "StreamIsActive", streaming=True)(MESSAGE["ScaledObjectRef"](name="tl"))
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for message in self.call:
                self.pushed.append((time.monotonic(), message.result))
            self.ended = "ok"
        except grpc.RpcError as e:
            self.ended = str(e.code())

    def wait_for(self, count: int, within: float) -> None:
        deadline = time.monotonic() + within
        while len(self.pushed) < count and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(self.pushed) >= count, self.pushed


@pytest.fixture
def channel_to() -> Iterator[Any]:
    channels: list[grpc.Channel] = []

    def connect(port: int) -> grpc.Channel:
        channels.append(grpc.insecure_channel(f"127.0.0.1:{port}"))
        return channels[-1]

    yield connect
    for channel in channels:
        channel.close()


def test_a_held_request_is_pushed_active_at_once_and_inactive_after_the_quiet_time(channel_to: Any) -> None:
    with running(push=True) as r:
        channel = channel_to(r.push_port)
        stream = Stream(channel)
        stream.wait_for(1, within=5)
        assert not _call(channel, "IsActive")(MESSAGE["ScaledObjectRef"]()).result
        sent = time.monotonic()
        held = threading.Thread(target=exchange, args=(r.port, request_bytes(UNSTREAMED, "json:1.5")),
                                kwargs={"until": b"}"}, daemon=True)  # fmt: skip
        held.start()
        stream.wait_for(2, within=1)
        during = _call(channel, "IsActive")(MESSAGE["ScaledObjectRef"]()).result
        metrics = _call(channel, "GetMetrics")(MESSAGE["GetMetricsRequest"](metricName=METRIC))
        held.join(10)
        answered = time.monotonic()
        stream.wait_for(3, within=QUIET_S + 1)
        after = _call(channel, "IsActive")(MESSAGE["ScaledObjectRef"]()).result
    assert [active for _, active in stream.pushed] == [False, True, False], stream.pushed
    assert stream.pushed[1][0] - sent < 0.1, "true is pushed within 100 ms of the held request"
    assert during and not after
    values = [(v.metricName, v.metricValue, v.metricValueFloat) for v in metrics.metricValues]
    assert values == [(METRIC, 1, 1.0)]
    assert QUIET_S - 0.1 <= stream.pushed[2][0] - answered <= QUIET_S + 0.5, stream.pushed


def test_other_requests_push_nothing(channel_to: Any) -> None:
    with running(push=True) as r:
        stream = Stream(channel_to(r.push_port))
        stream.wait_for(1, within=5)
        exchange(r.port, request_bytes(None, "json:0.5", path="/v1/models", method="GET"), until=b"}")
        time.sleep(0.2)
    assert [active for _, active in stream.pushed] == [False]


def test_the_metric_spec_asks_a_replica_per_capacity(channel_to: Any) -> None:
    with running(push=True) as r:
        ask = _call(channel_to(r.push_port), "GetMetricSpec")
        spec = ask(MESSAGE["ScaledObjectRef"](name="tl", namespace="ns", scalerMetadata={CAPACITY_KEY: "12"}))
        default = ask(MESSAGE["ScaledObjectRef"](name="tl"))
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [(METRIC, 12, 12.0)]
    assert [(s.metricName, s.targetSize) for s in default.metricSpecs] == [(METRIC, 1)]


def test_the_metric_spec_is_streamed_at_once_and_the_streams_end_cleanly_at_shutdown(channel_to: Any) -> None:
    with running(push=True) as r:
        channel = channel_to(r.push_port)
        stream = Stream(channel)
        stream.wait_for(1, within=5)
        specs = _call(channel, "StreamMetricSpec", streaming=True)(
            MESSAGE["ScaledObjectRef"](name="tl", scalerMetadata={CAPACITY_KEY: "3"}))  # fmt: skip
        first = next(iter(specs))
    stream.thread.join(5)
    # KEDA reads a stream that ends OK as io.EOF: it reconnects in 2 s, its backoff reset.
    assert stream.ended == "ok"
    assert list(specs) == []  # ended OK too (an error would raise)
    assert [(s.metricName, s.targetSize) for s in first.metricSpecs] == [(METRIC, 3)]


def test_the_messages_encode_as_the_wire_format_says() -> None:
    assert MESSAGE["IsActiveResponse"](result=True).SerializeToString() == b"\x08\x01"
    ref = MESSAGE["ScaledObjectRef"](name="a", namespace="b", scalerMetadata={"k": "v"})
    assert ref.SerializeToString() == b"\x0a\x01a\x12\x01b\x1a\x06\x0a\x01k\x12\x01v"
    value = MESSAGE["MetricValue"](metricName="m", metricValue=300, metricValueFloat=1.5)
    assert value.SerializeToString() == b"\x0a\x01m\x10\xac\x02\x19" + struct.pack("<d", 1.5)
    request = MESSAGE["GetMetricsRequest"](scaledObjectRef=ref, metricName="m")
    assert request.SerializeToString() == b"\x0a\x0e" + ref.SerializeToString() + b"\x12\x01m"


def _go() -> tuple[Path, dict[str, str]]:
    """The Go module cache build-tools.sh and the e2e tier use (outside the repo), and go's env."""
    if shutil.which("go") is None:
        pytest.skip("no Go toolchain to fetch KEDA's module with")
    cache = Path(os.environ.get("LLMOP_CACHE") or Path.home() / ".cache" / "llm-operator")
    env = {**os.environ, "GOMODCACHE": str(cache / "gomod"), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    return cache, env


def _upstream_proto() -> str:
    """KEDA's externalscaler.proto from its Go module."""
    cache, env = _go()
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"github.com/kedacore/keda/v2@v{RELEASE}"],
        env=env, cwd=cache, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    module = Path(json.loads(out.stdout)["Dir"])
    return (module / "pkg/scalers/externalscaler/externalscaler.proto").read_text()


def test_kedas_own_client_reads_the_push(tmp_path: Path) -> None:
    """keda_client/main.go, built with KEDA v2.21.0's generated client (the test world's KEDA
    module, e2e/cluster/tools/keda/go.mod), calls each method as KEDA's operator does."""
    _, env = _go()
    for name in ("go.mod", "go.sum"):
        text = (REPO / "e2e/cluster/tools/keda" / name).read_text()
        (tmp_path / name).write_text(re.sub(r"(?m)^module .*$", "module kedaclient", text))
    shutil.copy(Path(__file__).parent / "keda_client" / "main.go", tmp_path / "main.go")
    subprocess.run(["go", "build", "-o", "keda_client", "."], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    with running(push=True) as r:
        argv = [str(tmp_path / "keda_client"), f"127.0.0.1:{r.push_port}", f"127.0.0.1:{r.port}"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    # Go's protobuf text format puts one or two spaces between fields, chosen per binary on purpose
    # (google.golang.org/protobuf internal/detrand): compare with single spaces.
    lines = [line.split() for line in out.splitlines()]
    said = {words[0]: " ".join(words[1:]) for words in lines}
    spec = 'metricSpecs:{metricName:"held" targetSize:16 targetSizeFloat:16} <nil>'
    assert said["GetMetricSpec"] == spec and said["StreamMetricSpec"] == spec, out
    assert said["IsActive"] == "false <nil>", out
    held = 'metricValues:{metricName:"held" metricValue:1 metricValueFloat:1} <nil>'
    assert said["GetMetrics"] == held, out
    pushed = [(w[1], float(w[3]) if len(w) > 3 else 0.0) for w in lines if w[0] == "StreamIsActive"]
    assert [active for active, _ in pushed] == ["false", "true", "false"], out
    assert pushed[1][1] < 0.1, "true within 100 ms of the request"
    assert 1.5 + QUIET_S - 0.1 <= pushed[2][1] <= 1.5 + QUIET_S + 1.0, out


def test_the_messages_and_methods_are_upstreams() -> None:
    text = re.sub(r"//[^\n]*", "", _upstream_proto())
    assert re.search(r"^syntax\s*=\s*\"proto3\";", text, re.M) and "package externalscaler;" in text
    upstream: dict[str, list[tuple[str, int, str]]] = {}
    for name, body in re.findall(r"message\s+(\w+)\s*\{([^}]*)\}", text):
        fields = re.findall(r"(repeated\s+)?(map<\s*string\s*,\s*string\s*>|\w+)\s+(\w+)\s*=\s*(\d+)\s*;",
                            body)  # fmt: skip
        upstream[name] = [
            (field, int(number), "map" if kind.startswith("map<") else ("[]" if rep else "") + kind)
            for rep, kind, field, number in fields
        ]
    assert upstream == MESSAGES
    rpcs = {name: (request, response, bool(stream)) for name, request, stream, response in re.findall(
        r"rpc\s+(\w+)\s*\(\s*(\w+)\s*\)\s*returns\s*\(\s*(stream\s+)?(\w+)\s*\)", text)}  # fmt: skip
    assert rpcs == METHODS
