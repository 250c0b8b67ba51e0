"""The cluster's add-ons: what the core cluster (control plane, registry, real node: what `make
demo` and `make cluster-up` start) leaves out, started by name (`python -m e2e.cluster up --with
NAME`, a test session asks for ALL) and built the first time something asks for them.

Each add-on names the build-tools.sh groups it needs, the binaries and processes it adds, and how it
starts in two parts: `begin` needs only the API server (it may spawn processes and start background
work) and returns `finish`, which runs once the real node is Ready and waits until the add-on serves.
A fresh `up` begins every add-on while the node starts and finishes them at the end; `up --with` on
a running cluster does both at once."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from e2e.cluster import artifacts, enforcer, gateway, monitoring, netns, registry, routing
from e2e.cluster import containerd_images as images_mod
from e2e.cluster.processes import free_port
from e2e.cluster.readiness import ClusterError, create_rbac, http_ok
from e2e.cluster.starter import Starter, node_layout

Finish = Callable[[], None]


@dataclass(frozen=True)
class Addon:
    name: str  # also its build-tools.sh group
    what: str  # for people: what it is for
    binaries: tuple[str, ...]
    components: tuple[str, ...]  # its processes (pid files, status, stop)
    begin: Callable[[Starter], Finish]


def _fail(what: str, e: BaseException) -> ClusterError:
    return ClusterError(f"{what} failed: {e}")


def _monitoring(s: Starter) -> Finish:
    try:
        args = monitoring.prepare(s.state, s.pki, s.api.request)
    except (RuntimeError, OSError) as e:
        raise _fail("preparing the monitoring stack", e) from None
    s.spawn("prometheus", args["prometheus"])
    s.ports["prometheus"] = free_port()
    s.forward("prometheus-forwarder", s.ports["prometheus"], f"{netns.NODE_IP}:{monitoring.PROMETHEUS_PORT}")
    s.spawn("prometheus-adapter", args["prometheus-adapter"])

    def finish() -> None:  # Prometheus and the adapter started early; the custom metrics API now
        try:
            monitoring.finish(s.api.request, s.pki, s.inside, s.wait_ready)
        except RuntimeError as e:
            raise _fail("registering the custom metrics API", e) from None

    return finish


def _gateway(s: Starter) -> Finish:
    try:  # the CRDs are created while the rest starts; Traefik's informers need them served
        install = gateway.Install(s.api.request, s.tools["traefik"])
        args = gateway.prepare(s.state, s.pki)
    except (RuntimeError, OSError) as e:
        raise _fail("preparing the Gateway API", e) from None

    def finish() -> None:
        try:
            s.wait_ready("the Gateway API CRDs served", install.done, "kube-apiserver")
            s.spawn("traefik", args, env={**os.environ, **gateway.env(s.state)})
            s.ports["gateway"] = free_port()
            s.forward("gateway-forwarder", s.ports["gateway"], f"{netns.NODE_IP}:{gateway.PORT}")
            gateway.finish(s.api.request, s.inside, s.wait_ready)
        except RuntimeError as e:
            raise _fail("starting the Gateway", e) from None

    return finish


def _routing(s: Starter) -> Finish:
    try:
        crds = routing.crd_files(s.tools["epp"])
        install = gateway.Install(s.api.request, s.tools["epp"], crds, [], "the Inference Extension")
    except (RuntimeError, OSError) as e:
        raise _fail("preparing the Inference Extension", e) from None

    def finish() -> None:
        try:  # the router's images, as the node has the others: pushed to the registry, pulled
            archives = routing.archives(s.tools, list(routing.IMAGES), s.log)
            registry.push_images(s.state, s.tools["crane"], archives, s.log)
            refs = {name: digest for a in archives for name, digest in images_mod.archive_refs(a).items()}
            images_mod.pull_missing(node_layout(s.state), s.netns, refs, s.log)
        except (ImportError, RuntimeError, OSError, ValueError, subprocess.CalledProcessError) as e:
            raise _fail("putting the router's images on the real node", e) from None
        try:
            s.wait_ready("the Inference Extension CRDs served", install.done, "kube-apiserver")
        except RuntimeError as e:
            raise ClusterError(str(e)) from None

    return finish


def _enforcer(s: Starter) -> Finish:
    create_rbac(s.api, enforcer.RBAC)

    def finish() -> None:  # kube-router identifies its node by the Node object the kubelet registered
        s.spawn("kube-router", enforcer.prepare(s.state, s.pki))
        health = s.inside(f"http://127.0.0.1:{enforcer.HEALTH_PORT}/healthz")
        s.wait_ready("kube-router /healthz", health, "kube-router")

    return finish


def _stores(s: Starter) -> Finish:
    try:  # they need nothing of the cluster: started now, seeded at the end
        stores = artifacts.start(s.state, s.tools, s.children)
    except (ImportError, RuntimeError, OSError, subprocess.CalledProcessError) as e:
        raise _fail("preparing the model stores", e) from None

    def finish() -> None:
        s.wait_ready(
            "the model stores",
            lambda: artifacts.ready(lambda u: http_ok(u, s.netns), stores),
            "versitygw",
        )
        try:
            artifacts.seed_in(s.netns, stores, s.state.node_cache)
        except RuntimeError as e:
            raise ClusterError(str(e)) from None

    return finish


ADDONS = {
    a.name: a
    for a in (
        Addon("monitoring", "Prometheus and prometheus-adapter: the custom metrics API the HPA reads",
              monitoring.BINARIES, monitoring.COMPONENTS, _monitoring),
        Addon("gateway", "Traefik: a Gateway API gateway (HTTPRoutes, weighted canaries)",
              gateway.BINARIES, gateway.COMPONENTS, _gateway),
        Addon("routing", "the Inference Extension's CRDs and the router's images (endpoint picker, Envoy)",
              routing.BINARIES, (), _routing),
        Addon("enforcer", "kube-router: NetworkPolicies enforced on the real node",
              enforcer.BINARIES, enforcer.COMPONENTS, _enforcer),
        Addon("stores", "versitygw (S3) and olah (Hugging Face mirror): models to fetch",
              artifacts.BINARIES, artifacts.COMPONENTS, _stores),
    )
}  # fmt: skip
ALL = tuple(ADDONS)


def named(names: Sequence[str]) -> list[Addon]:
    """The add-ons `names` (in start order), or ClusterError naming the unknown ones."""
    unknown = [n for n in names if n not in ADDONS]
    if unknown:
        raise ClusterError(f"unknown add-on {', '.join(unknown)} (add-ons: {', '.join(ALL)})")
    return [a for a in ADDONS.values() if a.name in names]


def components(names: Sequence[str]) -> tuple[str, ...]:
    return tuple(c for a in named(names) for c in a.components)
