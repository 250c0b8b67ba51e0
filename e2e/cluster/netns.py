"""The cluster's private network namespace: created by `up`, deleted by `down`.

Everything of the test world (control plane, kubelet, kube-proxy, CoreDNS, pods) lives in it; the
host reaches it only through forwarders bound to 127.0.0.1 (forwarder.py). Only the network
namespace is entered (`nsenter --net=...`): `ip netns exec` also unshares the mount namespace and
remounts /sys, which hides /sys/fs/cgroup from the kubelet and runc.

The namespace holds the node address NODE_IP on its loopback (no dummy module in this kernel); the
API server, the kubelet, CoreDNS and the `kubernetes` Service's endpoint use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import ipaddress
import os
import socket
import ssl
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
# The node's address inside the namespace (10.240.0.0/24 is the cluster's node network).
NODE_IP = "10.240.0.10"


class NetnsError(Exception):
    pass


def path(name: str) -> Path:
    return NETNS_DIR / name


def exists(name: str) -> bool:
    return path(name).exists()


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def create(name: str) -> None:
    """A fresh namespace `name` with lo up and NODE_IP on it (an old one of that name is replaced)."""
    if exists(name):
        delete(name)
    _ip("netns", "add", name)
    inside = ("-n", name)
    _ip(*inside, "link", "set", "lo", "up")
    _ip(*inside, "addr", "add", f"{NODE_IP}/32", "dev", "lo")
    # Routes for the node network through lo: the namespace has no other interface until the CNI
    # bridge appears, and the kubelet wants a default route to pick its node address.
    _ip(*inside, "route", "add", "default", "dev", "lo", "src", NODE_IP)


def delete(name: str) -> None:
    if exists(name):
        _ip("netns", "delete", name)


def command(name: str, argv: Sequence[str]) -> list[str]:
    """`argv` run inside the namespace (nsenter execs it: the pid stays the program's)."""
    return ["nsenter", f"--net={path(name)}", "--", *argv]


_libc = ctypes.CDLL(None, use_errno=True)


def setns(name: str) -> None:
    """Move the calling thread into the namespace (Python 3.11 has no os.setns)."""
    fd = os.open(path(name), os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path(name)}): {os.strerror(err)}")
    finally:
        os.close(fd)


def socket_in(name: str, family: int = socket.AF_INET, type_: int = socket.SOCK_STREAM) -> socket.socket:
    """A socket that belongs to the namespace: made by a helper thread that entered it (a socket
    keeps the namespace it was created in; the calling thread stays where it is)."""
    result: list[socket.socket | BaseException] = []

    def make() -> None:
        try:
            setns(name)
            result.append(socket.socket(family, type_))
        except BaseException as e:  # handed to the caller
            result.append(e)

    thread = threading.Thread(target=make, daemon=True)
    thread.start()
    thread.join()
    made = result[0]
    if isinstance(made, BaseException):
        raise made
    return made


def connect(name: str, host: str, port: int, timeout: float = 2.0) -> socket.socket:
    """A TCP connection to host:port as seen from inside the namespace."""
    sock = socket_in(name)
    sock.settimeout(timeout)
    try:
        sock.connect((host, port))
    except BaseException:
        with contextlib.suppress(OSError):
            sock.close()
        raise
    return sock


class HTTPConnection(http.client.HTTPConnection):
    """An HTTP connection, over TLS when given a context, whose socket belongs to the namespace."""

    def __init__(
        self, name: str, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None
    ) -> None:
        super().__init__(host, port, timeout=timeout)
        self.netns, self.tls = name, tls

    def connect(self) -> None:
        sock = connect(self.netns, self.host, self.port, self.timeout or 60.0)
        self.sock = self.tls.wrap_socket(sock, server_hostname=self.host) if self.tls else sock


def private_in_host() -> list[str]:
    """Addresses and routes of the host's own namespace in 10/8, 172.16/12 or 192.168/16 (the
    machine's rule: the test world keeps those inside its namespace, so this must stay empty)."""
    private = [ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")]
    found = []
    for args in (["-4", "-o", "addr"], ["-4", "route"]):
        out = subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            for word in line.split():
                with contextlib.suppress(ValueError):
                    net = ipaddress.ip_network(word, strict=False)
                    if isinstance(net, ipaddress.IPv4Network) and any(net.subnet_of(p) for p in private):
                        found.append(line.strip())
    return found
