"""What starting a component needs, for the core (components.py) and the add-ons (addons.py)
alike: spawn a process inside the cluster's namespace, forward a host port into it, wait until
a probe passes (failing with the component's name and log if it exits first)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from e2e.cluster import netns
from e2e.cluster import node as node_mod
from e2e.cluster import pki as pki_mod
from e2e.cluster.processes import Children
from e2e.cluster.readiness import Api, http_ok, wait
from e2e.cluster.state import StateDir

FORWARDER = Path(__file__).with_name("forwarder.py")
STARTUP_TIMEOUT_S = 90.0

Log = Callable[[str], None]


@dataclass
class Starter:
    state: StateDir
    tools: Mapping[str, Path]
    children: Children
    pki: pki_mod.Pki
    api: Api
    log: Log
    extra_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    # Host ports (name -> 127.0.0.1 port) the forwarders listen on; recorded in cluster.json.
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def netns(self) -> str:
        return self.state.netns

    def spawn(self, component: str, args: list[str], env: Mapping[str, str] | None = None) -> None:
        """`component`'s binary with `args` (then extra_args, which win) inside the namespace."""
        argv = [str(self.tools[component]), *args, *self.extra_args.get(component, [])]
        log = self.state.log_file(component)
        pid = self.children.spawn(component, netns.command(self.netns, argv), log, self.state.root, env)
        self.state.write_pid(component, pid)

    def forward(self, name: str, port: int, to: str) -> None:
        """The host's 127.0.0.1:`port` relayed to `to` inside the namespace (forwarder.py)."""
        argv = [sys.executable, str(FORWARDER), f"--netns={self.netns}", f"--listen={port}", f"--to={to}",
                f"--state-dir={self.state.root}/"]  # fmt: skip
        pid = self.children.spawn(name, argv, self.state.log_file(name), self.state.root)
        self.state.write_pid(name, pid)

    def wait_ready(self, what: str, ready: Callable[[], bool], component: str) -> None:
        wait(what, ready, STARTUP_TIMEOUT_S, self.children, self.state.log_file(component))

    def inside(self, url: str) -> Callable[[], bool]:
        """A probe of `url` from inside the namespace."""
        return functools.partial(http_ok, url, self.netns)


def node_layout(state: StateDir) -> node_mod.NodeLayout:
    return node_mod.NodeLayout(state.node_dir, state.run_dir, state.cgroup, state.node_cache / "containerd")
