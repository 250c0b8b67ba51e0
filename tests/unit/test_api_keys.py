"""API keys on the OpenAI port (spec.routing.apiKeys): the key store the front door reads from the
Secret's volume, the front door's 401 before it reads a body, and what the operator renders (the
leader's volume and variable, NetworkPolicy and HTTPRoute closed to Triton's own ports). On a
real pod, with the openai SDK and a rotated Secret: tests/e2e/test_api_keys.py."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from llm_operator import contract
from llm_operator.frontdoor import __main__ as frontdoor_main
from llm_operator.frontdoor.api_keys import ApiKeys
from llm_operator.frontdoor.protocol import Limits
from llm_operator.frontdoor.server import FrontDoor, Settings, serve
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.upstream import Upstream
from llm_operator.render import rollout
from llm_operator.rollout.revision import revision_of
from llm_operator.runtime.cpu_reference import tokenizer_files

from tests.unit.test_render_rollout import IMAGES, deployment
from tests.unit.test_routing import all_rendered

KEY, OTHER = "sk-first-3f9a", "sk-second-77c1"


def kubelet_volume(root: Path, keys: dict[str, str], generation: int) -> None:
    """A Secret volume as the kubelet's atomic writer lays it out: files in a timestamped
    directory, `..data` pointing at it, each key a link through `..data`; an update swaps the link."""
    data = root / f"..2026_11_28_{generation}"
    data.mkdir()
    for name, value in keys.items():
        (data / name).write_text(value)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    for name in keys:
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")
    for stale in [p for p in root.iterdir() if p.is_symlink() and p.name not in keys and p.name != "..data"]:
        stale.unlink()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_key_of_the_secret_is_accepted_as_a_bearer_token_and_nothing_else(tmp_path: Path) -> None:
    kubelet_volume(tmp_path, {"first": KEY, "second": OTHER + "\n"}, 1)
    keys = ApiKeys(tmp_path)
    assert keys.count == 2
    assert keys.accepts(f"Bearer {KEY}") and keys.accepts(f"bearer {OTHER}"), "a trailing newline is no part"
    wrong = ("", KEY, f"Basic {KEY}", "Bearer ", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer \udcff")
    for refused in wrong:
        assert not keys.accepts(refused), refused


def test_a_rotated_secret_is_followed_without_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    kubelet_volume(tmp_path, {"first": KEY}, 1)
    keys = ApiKeys(tmp_path, clock)
    assert keys.accepts(f"Bearer {KEY}") and not keys.accepts(f"Bearer {OTHER}")
    kubelet_volume(tmp_path, {"first": KEY, "second": OTHER}, 2)  # the new key added
    clock.now += 2
    assert keys.accepts(f"Bearer {OTHER}") and keys.accepts(f"Bearer {KEY}")
    kubelet_volume(tmp_path, {"second": OTHER}, 3)  # then the old one removed
    clock.now += 2
    assert not keys.accepts(f"Bearer {KEY}") and keys.accepts(f"Bearer {OTHER}")
    kubelet_volume(tmp_path, {}, 4)  # emptied: nobody, rather than everybody
    clock.now += 2
    assert not keys.accepts(f"Bearer {OTHER}") and keys.count == 0


def test_the_front_door_refuses_to_start_with_no_key_and_says_where(tmp_path: Path) -> None:
    env = {"LLMOP_SERVED_MODEL_NAMES": "m", "LLMOP_API_KEYS_DIR": str(tmp_path)}
    with pytest.raises(frontdoor_main.ConfigError, match="holds no key: put at least one in the Secret"):
        frontdoor_main.settings(env)
    (tmp_path / "first").write_text(KEY)
    assert frontdoor_main.settings(env).api_keys is not None
    assert frontdoor_main.settings({**env, "LLMOP_API_KEYS_DIR": ""}).api_keys is None


async def request(port: int, head: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(head.encode() + body)
    raw = await asyncio.wait_for(r.read(), 10)
    w.close()
    status = int(raw.split(b" ", 2)[1])
    return status, json.loads(raw.split(b"\r\n\r\n", 1)[1] or b"{}")


def test_the_front_door_answers_401_in_openais_format_before_reading_a_body(tmp_path: Path) -> None:
    tokenizer_files.write(tmp_path / "tokenizer")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "first").write_text(KEY)

    async def go() -> None:
        settings = Settings(["m"], "ensemble", "cpu-reference", Limits(64, 128), ApiKeys(tmp_path / "keys"))
        door = FrontDoor(settings, Tokenizer.load(tmp_path / "tokenizer"), Upstream("127.0.0.1", 9))
        server = await serve(door, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            # A stranger announces 16 MiB and sends none of it: answered at once, connection closed.
            status, body = await request(port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                         "Content-Length: 16777216\r\n\r\n")  # fmt: skip
            assert status == 401 and body["error"]["code"] == "invalid_api_key", body
            assert body["error"]["type"] == "invalid_request_error" and KEY not in json.dumps(body)
            models = (
                "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {}\r\n\r\n"
            )
            assert (await request(port, models.format(OTHER)))[0] == 401
            status, body = await request(port, models.format(KEY))
            assert status == 200 and [m["id"] for m in body["data"]] == ["m"]
            # /health carries nothing but readiness: probes and routers need no key.
            status, _ = await request(port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert status == 503, "unauthenticated, and not ready (no Triton on port 9)"
        finally:
            server.close()

    asyncio.run(go())


def with_keys(triton_ports: str | None = None) -> dict[str, Any]:
    keys: dict[str, Any] = {"secretRef": {"name": "llm-api-keys"}}
    if triton_ports:
        keys["tritonPorts"] = triton_ports
    return {"apiKeys": keys}


def rendered(kind: str, objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def render_all(routing: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object of the cpu-reference example, shared ones (policy, Services) included."""
    return all_rendered(deployment("cpu-reference", **({"routing": routing} if routing else {})))


def test_the_leader_mounts_the_keys_secret_and_the_policy_admits_clients_to_the_openai_port_only() -> None:
    objs = render_all(with_keys())
    (sts,) = rendered("StatefulSet", objs)
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "LLMOP_API_KEYS_DIR", "value": contract.API_KEYS_DIR} in container["env"]
    mount = {"name": contract.API_KEYS_VOLUME, "mountPath": contract.API_KEYS_DIR, "readOnly": True}
    assert mount in container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == contract.API_KEYS_VOLUME]
    assert volume["secret"] == {"secretName": "llm-api-keys", "defaultMode": 0o440}, "every key, no items"
    assert pod["securityContext"]["fsGroup"], "the group that may read the 0440 files"
    (policy,) = rendered("NetworkPolicy", objs)
    client_rule = policy["spec"]["ingress"][0]
    assert client_rule["ports"] == [{"protocol": "TCP", "port": contract.OPENAI_PORT}]

    opened = render_all(with_keys("Open"))
    (policy,) = rendered("NetworkPolicy", opened)
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == {8000, 8001, 8080}
    plain = render_all()
    (container,) = rendered("StatefulSet", plain)[0]["spec"]["template"]["spec"]["containers"]
    assert "LLMOP_API_KEYS_DIR" not in json.dumps(container)
    (policy,) = rendered("NetworkPolicy", plain)
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} == {8000, 8001, 8080}


def test_a_canary_route_keeps_only_the_openai_rule_when_tritons_ports_are_closed() -> None:
    canary = {"strategy": "canary", "canary": {"trafficRouting": "gateway-api", "steps": [{"weight": 10}]}}
    for routing, rules in ((None, 2), (with_keys(), 1), (with_keys("Open"), 2)):
        ld = deployment("cpu-reference", rollout=canary, **({"routing": routing} if routing else {}))
        route = rollout.http_route(ld, {"stable": 90, "canary": 10}, "r1", "r2")
        assert len(route["spec"]["rules"]) == rules, routing
        assert route["spec"]["rules"][-1]["matches"][0]["path"]["value"] == "/v1"


def test_the_keys_secret_is_part_of_the_revision_and_the_keys_in_it_are_not() -> None:
    """The leaders mount the Secret: naming one rolls the pods (or starts a canary); rotating keys
    inside it, or opening Triton's ports, does not."""
    plain = revision_of(deployment("cpu-reference").spec, IMAGES)
    keyed = revision_of(deployment("cpu-reference", routing=with_keys()).spec, IMAGES)
    assert keyed != plain
    assert revision_of(deployment("cpu-reference", routing=with_keys("Open")).spec, IMAGES) == keyed
    other = {"apiKeys": {"secretRef": {"name": "other-keys"}}}
    assert revision_of(deployment("cpu-reference", routing=other).spec, IMAGES) not in (plain, keyed)
