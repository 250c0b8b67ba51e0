"""Waiting for the cluster's components: the minimal apiserver client, HTTP probes (from inside
the cluster's network namespace too), node readiness, and the poll that fails as soon as a
component exits."""

from __future__ import annotations

import contextlib
import http.client
import json
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from e2e.cluster import netns
from e2e.cluster import pki as pki_mod
from e2e.cluster.processes import Children, last_line
from e2e.cluster.state import shown


class ClusterError(Exception):
    """A failure to report as one line (which component, what happened, where its log is)."""


class Api:
    """Minimal HTTPS client for the apiserver, authenticated as the admin client."""

    def __init__(self, port: int, pki: pki_mod.Pki) -> None:
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        admin = pki.clients["admin"]
        self.ctx.load_cert_chain(str(admin.cert), str(admin.key))

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=10)
        try:
            payload = json.dumps(body) if body is not None else None
            conn.request(method, path, payload, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(data)
        except ValueError:
            return resp.status, data.decode(errors="replace")


def http_ok(url: str, ns: str | None = None) -> bool:
    """GET url (TLS unverified: the component serves a throwaway self-signed cert) and expect 200;
    from inside network namespace `ns` if given."""
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    host, port = hostport.rsplit(":", 1)
    ctx = None
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    conn: http.client.HTTPConnection
    if ns is not None:
        conn = netns.HTTPConnection(ns, host, int(port), 2.0, ctx)
    elif ctx is not None:
        conn = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=2)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=2)
    try:
        conn.request("GET", "/" + path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def create_nodes(api: Api, nodes: Sequence[dict[str, Any]]) -> None:
    for node in nodes:
        code, body = api.request("POST", "/api/v1/nodes", node)
        if code not in (201, 409):  # 409: exists already (idempotent `up`)
            raise ClusterError(f"creating node {node['metadata']['name']} failed: HTTP {code}: {body}")


def create_rbac(api: Api, objects: Sequence[dict[str, Any]]) -> None:
    """ClusterRoles and ClusterRoleBindings (existing ones are fine)."""
    for obj in objects:
        kind = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
        code, body = api.request("POST", f"/apis/rbac.authorization.k8s.io/v1/{kind}", obj)
        if code not in (201, 409):
            name = obj["metadata"]["name"]
            raise ClusterError(f"creating {obj['kind']} {name} failed: HTTP {code}: {body}")


def nodes_ready(api: Api, nodes: Sequence[dict[str, Any]], real: Sequence[str] = ()) -> bool:
    """Every node of `nodes` (manifests) is Ready; every node named in `real` too, and rid of the
    node.kubernetes.io/not-ready taint (the node lifecycle controller lifts it a moment after
    Ready; until then nothing schedules there)."""
    code, body = api.request("GET", "/api/v1/nodes")
    if code != 200:
        return False
    ready = {n["metadata"]["name"] for n in body["items"] if node_ready(n)}
    untainted = {
        n["metadata"]["name"]
        for n in body["items"]
        if not any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints", []))
    }
    return {n["metadata"]["name"] for n in nodes} <= ready and set(real) <= ready & untainted


def wait(
    what: str, ready: Callable[[], bool], timeout: float, children: Children, log: Path | None = None
) -> None:
    """Poll `ready` until true; fail with one line when it times out (naming `log`) or as soon as
    one of `children` exits (with the last line of its log: usually why)."""
    deadline = time.monotonic() + timeout
    while True:
        if exited := children.exited():
            reason = last_line(exited.log)
            raise ClusterError(
                f"{exited.name} exited with code {exited.code} during startup"
                + (f": {reason}" if reason else "")
                + f" (log: {shown(exited.log)})"
            )
        with contextlib.suppress(OSError):
            if ready():
                return
        if time.monotonic() > deadline:
            where = f" (log: {shown(log)})" if log else ""
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{where}")
        time.sleep(0.1)
