"""The test world's Gateway (e2e/cluster/gateway.py): Traefik routes real requests by HTTPRoute
weights and reports, in the route's status, whether it accepted the route.

Two busybox web servers on the real node answer their own names behind their own Services; an
HTTPRoute on Gateway gateway-system/llmop splits them 80/20, then 20/80. Requests are sent from
inside the cluster's network namespace (as a pod's would be) to the Gateway's listener, bounded in
number, and from a pod through the Gateway's Service name. Each route has its own hostname so
routes of concurrent tests never share a match.
"""

from __future__ import annotations

import collections
import functools
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from e2e.cluster import busybox_image, gateway, netns
from e2e.cluster.pki import NODE_NAME
from e2e.cluster.testing import E2ECluster, Kubectl, condition, is_true, pod_ready, wait_for
from e2e.generate import connection

pytestmark = pytest.mark.e2e

IMAGE = "localhost/llm-operator/busybox:e2e"
BACKENDS = ("blue", "green")
REQUESTS = 100  # per measured split
TOLERANCE = 8  # percentage points
# Traefik applies provider changes at most every 2 s (its providersThrottleDuration).
FOLLOW_S = 10.0


@dataclass
class World:
    namespace: str
    netns: str
    host_url: str  # the Gateway through its 127.0.0.1 forwarder


def backend(name: str) -> list[dict[str, Any]]:
    """busybox httpd on the real node answering its own name, behind Service `name`."""
    labels = {"app": name}
    serve = f"mkdir -p /tmp/www && echo {name} > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
    container = {
        "name": "web",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", serve],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "containers": [container],
                "terminationGracePeriodSeconds": 1,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        },
    ]


def parent_ref(**override: str) -> dict[str, str]:
    return {
        "name": gateway.GATEWAY,
        "namespace": gateway.NAMESPACE,
        "sectionName": gateway.LISTENER,
        **override,
    }


def route(
    name: str, namespace: str, weights: dict[str, int], parents: list[dict[str, str]]
) -> dict[str, Any]:
    refs = [{"name": svc, "port": 80, "weight": w} for svc, w in weights.items()]
    return {
        "apiVersion": f"{gateway.GROUP}/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name},
        "spec": {
            "parentRefs": parents,
            "hostnames": [host(name, namespace)],
            "rules": [{"backendRefs": refs}],
        },
    }


def host(route_name: str, namespace: str) -> str:
    return f"{route_name}.{namespace}.test"


def get(ns: str, host_header: str) -> str:
    """One GET through the Gateway's listener from inside the cluster's network namespace."""
    conn = connection(netns.NODE_IP, gateway.PORT, inside=ns, timeout=5.0)
    try:
        conn.request("GET", "/", headers={"Host": host_header})
        response = conn.getresponse()
        body = response.read().decode().strip()
        return body if response.status == 200 else f"HTTP {response.status}: {body}"
    finally:
        conn.close()


def split(ns: str, host_header: str, count: int = REQUESTS) -> dict[str, float]:
    """Share of `count` sequential requests answered by each backend, in percent."""
    answers = collections.Counter(get(ns, host_header) for _ in range(count))
    return {name: 100.0 * n / count for name, n in answers.items()}


def near(shares: dict[str, float], weights: dict[str, int]) -> bool:
    total = sum(weights.values())
    return set(shares) <= set(weights) and all(
        abs(shares.get(name, 0.0) - 100.0 * w / total) <= TOLERANCE for name, w in weights.items()
    )


def parents(kubectl: Kubectl, name: str, namespace: str) -> list[dict[str, Any]]:
    obj = kubectl.get("httproute", name, namespace) or {}
    found: list[dict[str, Any]] = obj.get("status", {}).get("parents", [])
    return found


@pytest.fixture(scope="module")
def world(cluster: E2ECluster, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if cluster.launcher is None:
        pytest.skip("needs the embedded cluster: its Gateway, real node and network namespace")
    archive = busybox_image.write(tmp_path_factory.mktemp("img") / "web.oci.tar", IMAGE, ["/bin/sh"])
    cluster.launcher.import_image(archive)
    ns = kubectl.create_namespace("gateway", pod_security="baseline")  # busybox web pods run as root
    try:
        kubectl.apply([obj for name in BACKENDS for obj in backend(name)], namespace=ns)
        for name in BACKENDS:
            wait_for(f"pod {name} Ready", functools.partial(kubectl.get, "pod", name, ns), pod_ready)
        yield World(ns, cluster.launcher.netns, cluster.launcher.gateway_url)
    finally:
        kubectl.delete("namespace", ns)


def test_the_gateway_is_programmed_by_traefik(kubectl: Kubectl, world: World) -> None:
    klass = kubectl.get("gatewayclass", gateway.GATEWAY_CLASS)
    assert klass is not None and klass["spec"]["controllerName"] == gateway.CONTROLLER_NAME
    assert (condition(klass, "Accepted") or {}).get("status") == "True"
    gw = kubectl.get("gateway", gateway.GATEWAY, gateway.NAMESPACE)
    assert gw is not None
    assert (condition(gw, "Programmed") or {}).get("status") == "True"
    assert gw["status"]["addresses"] == [{"type": "IPAddress", "value": netns.NODE_IP}]
    (listener,) = gw["status"]["listeners"]
    assert listener["name"] == gateway.LISTENER


def test_weights_split_requests_and_a_change_is_followed(kubectl: Kubectl, world: World) -> None:
    ns, name = world.namespace, "split"
    parent = [parent_ref()]
    kubectl.apply(route(name, ns, {"blue": 80, "green": 20}, parent), namespace=ns)

    statuses = wait_for(
        "HTTPRoute split Accepted and ResolvedRefs by Traefik",
        lambda: parents(kubectl, name, ns),
        lambda ps: (
            len(ps) == 1
            and is_true({"status": ps[0]}, "Accepted")
            and is_true({"status": ps[0]}, "ResolvedRefs")
        ),
        timeout=30,
    )
    assert statuses[0]["controllerName"] == gateway.CONTROLLER_NAME
    assert statuses[0]["parentRef"]["name"] == gateway.GATEWAY

    # Traefik programs the route a moment after writing its status.
    wait_for(
        "the route serving", lambda: get(world.netns, host(name, ns)), lambda b: b in BACKENDS, timeout=15
    )
    shares = split(world.netns, host(name, ns))
    assert near(shares, {"blue": 80, "green": 20}), shares

    changed = time.monotonic()
    kubectl.apply(route(name, ns, {"blue": 20, "green": 80}, parent), namespace=ns)
    followed = wait_for(
        "the split following the new weights 20/80",
        lambda: split(world.netns, host(name, ns), 50),
        lambda s: near(s, {"blue": 20, "green": 80}),
        timeout=FOLLOW_S,
        interval=0.2,
    )
    seconds = time.monotonic() - changed
    shares = split(world.netns, host(name, ns))
    assert near(shares, {"blue": 20, "green": 80}), (shares, followed)
    print(f"weights 80/20 -> 20/80 followed in {seconds:.1f} s")

    # The host's way in: the 127.0.0.1 forwarder (no address of the namespace in the host).
    req = urllib.request.Request(world.host_url + "/", headers={"Host": host(name, ns)})
    with urllib.request.urlopen(req, timeout=5) as response:
        assert response.read().decode().strip() in BACKENDS


def test_pods_reach_the_gateway_by_its_service_name(kubectl: Kubectl, world: World) -> None:
    """What an in-cluster client (a load generator pod) uses: http://llmop.gateway-system.svc."""
    ns, name = world.namespace, "by-name"
    kubectl.apply(route(name, ns, {"green": 1}, [parent_ref()]), namespace=ns)
    wait_for(
        "the route serving", lambda: get(world.netns, host(name, ns)), lambda b: b == "green", timeout=15
    )
    wget = ["/bin/wget", "-q", "-O", "-", "--header", f"Host: {host(name, ns)}", gateway.URL + "/"]
    kubectl.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "client"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "restartPolicy": "Never",
                "containers": [
                    {"name": "wget", "image": IMAGE, "imagePullPolicy": "IfNotPresent", "command": wget}
                ],
            },
        },
        namespace=ns,
    )
    wait_for(
        "pod client Succeeded",
        lambda: (kubectl.get("pod", "client", ns) or {}).get("status", {}).get("phase"),
        lambda phase: phase == "Succeeded",
        timeout=60,
    )
    assert kubectl("logs", "client", namespace=ns).stdout.strip() == "green"


def test_a_route_the_gateway_cannot_take_says_so_in_its_status(kubectl: Kubectl, world: World) -> None:
    """A missing listener: Traefik's own Accepted=False, reason NoMatchingParent (no message). A
    missing Gateway: no controller owns that parent, so nobody writes a status (Gateway API rule)."""
    ns = world.namespace
    weights = {"blue": 1}
    kubectl.apply(route("orphan", ns, weights, [parent_ref(name="missing")]), namespace=ns)
    kubectl.apply(route("no-listener", ns, weights, [parent_ref(sectionName="missing")]), namespace=ns)

    (status,) = wait_for(
        "HTTPRoute no-listener with Traefik's status",
        lambda: parents(kubectl, "no-listener", ns),
        lambda ps: len(ps) == 1,
        timeout=30,
    )
    accepted = condition({"status": status}, "Accepted")
    assert status["controllerName"] == gateway.CONTROLLER_NAME
    assert accepted is not None and accepted["status"] == "False"
    assert accepted["reason"] == "NoMatchingParent"
    # Traefik reconciles every route at once, and the orphan was created first: it has seen it.
    assert parents(kubectl, "orphan", ns) == []


def test_traefik_stays_small(cluster: E2ECluster) -> None:
    assert cluster.launcher is not None
    rss = cluster.launcher.status()["components"]["traefik"]["rss_kib"]
    print(f"traefik RSS {rss / 1024:.0f} MiB")
    assert 0 < rss < 256 * 1024
