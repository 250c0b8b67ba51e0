"""Starts and stops the embedded control plane: real etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok as detached local processes on 127.0.0.1 (see docs/development.md).

State lives in one directory (default: <repo>/.cluster): pki/, kubeconfig, kubeconfigs/, run/*.pid,
logs/*.log, etcd/, bin/ (kubectl and helm links), leases/<pid> (test sessions using the cluster) and
cluster.json (ports, binaries, pinned).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import nodes as node_pools
from e2e.cluster import pki as pki_mod

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".cluster"
BUILD_TOOLS = Path(__file__).with_name("build-tools.sh")
CACHE_DIR = Path(os.environ.get("LLMOP_CACHE", Path.home() / ".cache" / "llm-operator"))

# In start order.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# What build-tools.sh must provide; kubectl and helm are only linked into <state>/bin for people and tests.
BINARIES = (*COMPONENTS, "kubectl", "helm")
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 15.0

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class ClusterError(Exception):
    """A failure to report as one line (which component, what happened, where its log is)."""


@dataclass
class UpReport:
    # Time to start (or verify) the cluster, excluding build-tools.sh.
    seconds: float
    already_running: bool
    # tool -> seconds, for every tool build-tools.sh had to build in this call.
    builds: dict[str, int] = field(default_factory=dict)
    build_seconds: float = 0.0
    rss_kib: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)


def _free_ports(count: int) -> list[int]:
    # Held open together so the kernel hands out distinct ports; a port taken by someone else
    # before the component binds it surfaces as that component's "address already in use".
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _proc_args(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _last_line(path: Path) -> str:
    """The last non-empty line of a log, shortened: the usual place a Go program says why it quit."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_build_tools(log: Log, script: Path = BUILD_TOOLS) -> tuple[dict[str, Path], dict[str, int]]:
    """Run build-tools.sh (reuses cached binaries) -> ({binary name: path}, {tool: build seconds})."""
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    assert proc.stdout is not None
    builds: dict[str, int] = {}
    reason = "see its output above"
    for line in proc.stderr:  # progress goes to the user as it happens; the error becomes ours
        line = line.rstrip()
        if line.startswith("build-tools: error: "):
            reason = line.removeprefix("build-tools: error: ")
            continue
        log(line)
        if m := re.match(r"build-tools: (\S+) built in (\d+) s", line):
            builds[m[1]] = int(m[2])
    dirs = [Path(d) for d in proc.stdout.read().split()]
    if proc.wait() != 0:
        raise ClusterError(f"{script.name} failed (exit {proc.returncode}): {reason}")
    tools = {}
    for name in BINARIES:
        found = [d / name for d in dirs if (d / name).is_file()]
        if not found:
            raise ClusterError(f"{script.name} produced no {name} binary in {', '.join(map(str, dirs))}")
        tools[name] = found[0]
    return tools, builds


class _Api:
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


def _http_ok(url: str) -> bool:
    """GET url (TLS unverified: the component serves a throwaway self-signed cert) and expect 200."""
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    host, port = hostport.rsplit(":", 1)
    conn: http.client.HTTPConnection
    if scheme == "https":
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
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


def _node_ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


class Cluster:
    """The embedded control plane rooted at `state_dir`.

    `up()` is idempotent: on a healthy cluster it only re-checks health (and re-creates missing
    node-pool nodes); on half-dead state it stops whatever is left and starts fresh. `down()` stops
    every process and removes the state directory. Failures raise ClusterError with one line that
    names the component and its log file, after stopping everything this call started.

    `extra_args` appends flags per component (later flags win), `tools` replaces the binaries that
    build-tools.sh would provide ({binary name: path}); both exist for tests and experiments.
    """

    def __init__(
        self,
        state_dir: Path = DEFAULT_STATE_DIR,
        *,
        extra_args: Mapping[str, Sequence[str]] | None = None,
        tools: Mapping[str, Path] | None = None,
        node_pools_file: Path = node_pools.NODE_POOLS_FILE,
        log: Log = _stderr,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.extra_args = {k: list(v) for k, v in (extra_args or {}).items()}
        self.tools = dict(tools) if tools is not None else None
        self.node_pools_file = node_pools_file
        self.log = log
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    # -- paths ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (system:masters) for kubectl, helm and tests."""
        return self.state_dir / "kubeconfig"

    @property
    def bin_dir(self) -> Path:
        """Holds kubectl and helm (links into the build cache)."""
        return self.state_dir / "bin"

    def log_file(self, component: str) -> Path:
        return self.state_dir / "logs" / f"{component}.log"

    def _pid_file(self, component: str) -> Path:
        return self.state_dir / "run" / f"{component}.pid"

    def _rel(self, path: Path) -> str:
        """Path as the user typed it where possible (shorter one-line errors)."""
        with contextlib.suppress(ValueError):
            return str(path.relative_to(Path.cwd()))
        return str(path)

    # -- public API ----------------------------------------------------------------------------
    def up(self, *, session: int | None = None) -> UpReport:
        """Start (or verify) the cluster.

        session: pid of a test session borrowing the cluster; it holds a lease until release().
        A cluster first brought up by a session is stopped when the last live lease is released;
        `up` without a session (a person, `make cluster-up`) pins it until `down`.
        """
        start = time.monotonic()
        with self._lock():
            if self._healthy():
                api = self._api()
                self._create_nodes(api)
                self._wait("node-pool nodes Ready", lambda: self._nodes_ready(api), 30.0)
                self._claim(session)
                return UpReport(time.monotonic() - start, True, rss_kib=self._rss(), ports=self._ports())
            # Half-dead or stopped: start from scratch (no old etcd data), keeping the leases of
            # sessions that were using the old instance and will use this one.
            self._stop_all()
            self._clear_state(keep=("leases",))
            build_start = time.monotonic()
            tools, builds = (self.tools, {}) if self.tools is not None else run_build_tools(self.log)
            build_seconds = time.monotonic() - build_start
            try:
                ports = self._start(tools)
            except BaseException:
                self._stop_all()
                self._clear_state(keep=("logs", "leases"))  # the error names a log: keep it
                raise
            self._claim(session)
            seconds = time.monotonic() - start - build_seconds
            return UpReport(seconds, False, builds, build_seconds, self._rss(), ports)

    def release(self, session: int) -> bool:
        """Drop a session's lease; stop the cluster if it is not pinned and no live session holds
        it any more. Returns True if it was stopped."""
        with self._lock():
            self._lease(session).unlink(missing_ok=True)
            leases = self.state_dir / "leases"
            live = [p for p in leases.iterdir() if _running(int(p.name))] if leases.is_dir() else []
            if self._meta().get("pinned") or live or not self.state_dir.exists():
                return False
            self._stop_all()
            self._clear_state()
            return True

    def stop_demo_operator(self) -> bool:
        """Stop the operator `make demo` left running against this cluster (its pid is in
        operator.pid): a second operator would reconcile the same objects as the one a test session
        or the bench starts. True if one was running."""
        path = self.state_dir / "operator.pid"
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            return False
        path.unlink()
        args = _proc_args(pid)
        if not _running(pid) or "run" not in args or not any(Path(a).name == "llm-operator" for a in args):
            return False  # gone, or the pid now belongs to another process
        self._terminate([pid])
        return True

    def down(self) -> list[str]:
        """Stop everything and remove the state directory; returns the components that were running."""
        with self._lock():
            self.stop_demo_operator()
            stopped = self._stop_all()
            self._clear_state()
            return stopped

    def status(self) -> dict[str, Any]:
        """{'components': {name: {'pid', 'running', 'rss_kib'}}, 'apiserver_ready', 'nodes_ready', ...}."""
        components = {}
        for name in COMPONENTS:
            pid = self._read_pid(name)
            running = pid is not None and self._is_ours(pid)
            components[name] = {
                "pid": pid,
                "running": running,
                "rss_kib": rss_kib(pid) if pid and running else 0,
            }
        result: dict[str, Any] = {"components": components, "apiserver_ready": False, "nodes_ready": 0}
        if components["kube-apiserver"]["running"]:
            with contextlib.suppress(OSError, ClusterError):
                api = self._api()
                result["apiserver_ready"] = api.request("GET", "/readyz")[0] == 200
                code, body = api.request("GET", "/api/v1/nodes")
                if code == 200:
                    result["nodes_ready"] = sum(_node_ready(n) for n in body["items"])
                    result["nodes_total"] = len(body["items"])
        result["kubeconfig"] = str(self.kubeconfig)
        return result

    # -- state -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        # Outside the state dir (which `down` deletes) so concurrent up/down calls serialize.
        key = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:16]
        path = CACHE_DIR / "locks" / f"cluster-{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def _meta(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.state_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return {}
        return data

    def _lease(self, session: int) -> Path:
        return self.state_dir / "leases" / str(session)

    def _claim(self, session: int | None) -> None:
        if session is None:
            meta = self._meta()
            (self.state_dir / "cluster.json").write_text(json.dumps({**meta, "pinned": True}, indent=2))
        else:
            self._lease(session).parent.mkdir(exist_ok=True)
            self._lease(session).touch()

    def _ports(self) -> dict[str, int]:
        ports: dict[str, int] = self._meta().get("ports", {})
        return ports

    def _read_pid(self, component: str) -> int | None:
        try:
            return int(self._pid_file(component).read_text().strip())
        except (OSError, ValueError):
            return None

    def _is_ours(self, pid: int) -> bool:
        """A live process running one of the component binaries with this state dir in its args.

        Checked instead of trusting pid files alone, so a reused pid is never signalled.
        """
        if pid == os.getpid() or not _running(pid):
            return False
        args = _proc_args(pid)
        needle = f"{self.state_dir}/"
        return any(Path(a).name in COMPONENTS for a in args[:2]) and any(needle in a for a in args)

    def _healthy(self) -> bool:
        pids = [self._read_pid(c) for c in COMPONENTS]
        if not all(pid is not None and self._is_ours(pid) for pid in pids):
            return False
        try:
            return self._api().request("GET", "/readyz")[0] == 200
        except (OSError, ClusterError):
            return False

    def _clear_state(self, keep: tuple[str, ...] = ()) -> None:
        """Remove the state dir, or all of it but the entries named in `keep`."""
        if not self.state_dir.exists():
            return
        for child in self.state_dir.iterdir():
            if child.name in keep:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        if not keep:
            self.state_dir.rmdir()

    # -- processes -----------------------------------------------------------------------------
    def _stop_all(self) -> list[str]:
        """Stop every process of this state dir: pid files plus a /proc scan for strays."""
        found: dict[int, str] = {}
        for name in COMPONENTS:
            pid = self._read_pid(name)
            if pid is not None and self._is_ours(pid):
                found[pid] = name
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in found and self._is_ours(int(entry.name)):
                args = _proc_args(int(entry.name))
                found[int(entry.name)] = next(Path(a).name for a in args[:2] if Path(a).name in COMPONENTS)
        # Clients of etcd first, etcd last, so nothing logs a burst of connection errors.
        waves = [[p for p, n in found.items() if n != "etcd"], [p for p, n in found.items() if n == "etcd"]]
        for wave in waves:
            self._terminate(wave)
        self._procs.clear()
        order = {name: i for i, name in enumerate(COMPONENTS)}
        return sorted(set(found.values()), key=order.__getitem__)

    def _terminate(self, pids: list[int]) -> None:
        self._signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and any(self._alive_pid(p) for p in pids):
            time.sleep(0.05)
        self._signal([p for p in pids if self._alive_pid(p)], signal.SIGKILL)
        while any(self._alive_pid(p) for p in pids):
            time.sleep(0.05)

    @staticmethod
    def _signal(pids: list[int], sig: signal.Signals) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                # Each component leads its own session (see _spawn): signal its whole group.
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)

    def _alive_pid(self, pid: int) -> bool:
        for proc in self._procs.values():
            if proc.pid == pid:
                return proc.poll() is None  # reaps our own children so they don't linger as zombies
        return _running(pid)

    def _spawn(
        self, component: str, binary: Path, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        log = self.log_file(component)
        with log.open("wb") as out:
            # New session: survives the launching shell (and its Ctrl-C); logs go to a file.
            proc = subprocess.Popen(
                [str(binary), *args, *self.extra_args.get(component, [])],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=self.state_dir,
            )
        self._procs[component] = proc
        self._pid_file(component).write_text(f"{proc.pid}\n")

    def _check_processes(self) -> None:
        for name, proc in self._procs.items():
            code = proc.poll()
            if code is not None:
                log = self.log_file(name)
                reason = _last_line(log)
                raise ClusterError(
                    f"{name} exited with code {code} during startup"
                    + (f": {reason}" if reason else "")
                    + f" (log: {self._rel(log)})"
                )

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float, component: str = "") -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_processes()
            with contextlib.suppress(OSError):
                if ready():
                    return
            if time.monotonic() > deadline:
                where = f" (log: {self._rel(self.log_file(component))})" if component else ""
                raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}{where}")
            time.sleep(0.1)

    def _rss(self) -> dict[str, int]:
        result = {}
        for name in COMPONENTS:
            pid = self._read_pid(name)
            result[name] = rss_kib(pid) if pid else 0
        return result

    # -- startup -------------------------------------------------------------------------------
    def _api(self) -> _Api:
        port = self._ports().get("kube-apiserver")
        if not port:
            raise ClusterError(f"no apiserver port recorded in {self.state_dir / 'cluster.json'}")
        return _Api(port, self._pki())

    def _pki(self) -> pki_mod.Pki:
        d = self.state_dir / "pki"

        def pair(name: str) -> pki_mod.KeyPair:
            return pki_mod.KeyPair(d / f"{name}.crt", d / f"{name}.key")

        return pki_mod.Pki(
            ca=pair("ca"),
            apiserver=pair("apiserver"),
            front_proxy_ca=pair("front-proxy-ca"),
            front_proxy_client=pair("front-proxy-client"),
            sa_key=d / "sa.key",
            sa_pub=d / "sa.pub",
            clients={name: pair(f"client-{name}") for name in pki_mod.CLIENTS},
        )

    def _write_kubeconfig(self, path: Path, port: int, pki: pki_mod.Pki, client: str) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        pair = pki.clients[client]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "llmop-e2e",
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        "certificate-authority-data": b64(pki.ca.cert),
                    },
                }
            ],
            "users": [
                {
                    "name": client,
                    "user": {"client-certificate-data": b64(pair.cert), "client-key-data": b64(pair.key)},
                }
            ],
            "contexts": [{"name": "llmop-e2e", "context": {"cluster": "llmop-e2e", "user": client}}],
            "current-context": "llmop-e2e",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _start(self, tools: Mapping[str, Path]) -> dict[str, int]:
        sd = self.state_dir
        for sub in ("run", "logs", "kubeconfigs", "bin", "etcd"):
            (sd / sub).mkdir(parents=True, exist_ok=True)
        names = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
        ports = dict(zip(names, _free_ports(len(names)), strict=True))
        (sd / "cluster.json").write_text(
            json.dumps({"ports": ports, "tools": {k: str(v) for k, v in tools.items()}}, indent=2)
        )
        pki = pki_mod.generate(sd / "pki")
        self._write_kubeconfig(self.kubeconfig, ports["kube-apiserver"], pki, "admin")
        kubeconfigs = {}
        for client in ("kube-controller-manager", "kube-scheduler", "kwok"):
            kubeconfigs[client] = sd / "kubeconfigs" / f"{client}.kubeconfig"
            self._write_kubeconfig(kubeconfigs[client], ports["kube-apiserver"], pki, client)
        for name in ("kubectl", "helm"):
            (self.bin_dir / name).symlink_to(tools[name])
        (sd / "env").write_text(
            f'export KUBECONFIG="{self.kubeconfig}"\nexport PATH="{self.bin_dir}:$PATH"\n'
        )

        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        self._spawn(
            "etcd",
            tools["etcd"],
            [
                "--name=llmop",
                f"--data-dir={sd / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=llmop={peer_url}",
                "--unsafe-no-fsync",  # throwaway data: fsync only costs time
            ],
        )
        self._wait("etcd /health", lambda: _http_ok(f"{etcd_url}/health"), STARTUP_TIMEOUT_S, "etcd")

        self._spawn(
            "kube-apiserver",
            tools["kube-apiserver"],
            [
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kube-apiserver']}",
                # Loopback cannot be an Endpoints address, so the `kubernetes` Service gets none.
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={pki_mod.SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                # Front proxy: lets aggregated APIs (custom/external metrics) trust the aggregator.
                f"--requestheader-client-ca-file={pki.front_proxy_ca.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
                f"--proxy-client-key-file={pki.front_proxy_client.key}",
            ],
        )
        api = _Api(ports["kube-apiserver"], pki)
        self._wait(
            "kube-apiserver /readyz",
            lambda: api.request("GET", "/readyz")[0] == 200,
            STARTUP_TIMEOUT_S,
            "kube-apiserver",
        )

        def client_flags(component: str) -> list[str]:
            kc = kubeconfigs[component]
            return [
                f"--kubeconfig={kc}",
                f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports[component]}",
                # Single instance: a leader lease would only delay restarts.
                "--leader-elect=false",
            ]

        self._spawn(
            "kube-controller-manager",
            tools["kube-controller-manager"],
            [
                *client_flags("kube-controller-manager"),
                f"--root-ca-file={pki.ca.cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                "--use-service-account-credentials=false",
                f"--cluster-signing-cert-file={pki.ca.cert}",
                f"--cluster-signing-key-file={pki.ca.key}",
                # Test-speed HPA loops (defaults: 15 s sync, 5 min downscale stabilization).
                "--horizontal-pod-autoscaler-sync-period=2s",
                "--horizontal-pod-autoscaler-downscale-stabilization=10s",
            ],
        )
        self._spawn("kube-scheduler", tools["kube-scheduler"], client_flags("kube-scheduler"))
        self._spawn(
            "kwok",
            tools["kwok"],
            [
                f"--kubeconfig={kubeconfigs['kwok']}",
                "--manage-all-nodes=true",
                # Without a lease duration kwok v0.7.0 renews no node leases and heartbeats node
                # status only every ~10 min: the node lifecycle controller then marks every node
                # NotReady after ~50 s (NodeNotReady events) and kwok flips it back. Measured here.
                "--node-lease-duration-seconds=40",
                "--cidr=10.244.0.0/16",
            ],
            # kwok always loads ~/.kwok/kwok.yaml if present; keep a developer's config out.
            env={**os.environ, "HOME": str(sd)},
        )
        self._create_nodes(api)
        for component in ("kube-controller-manager", "kube-scheduler"):
            self._wait(
                f"{component} /healthz",
                functools.partial(_http_ok, f"https://127.0.0.1:{ports[component]}/healthz"),
                STARTUP_TIMEOUT_S,
                component,
            )
        self._wait(
            "the default ServiceAccount",
            lambda: api.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
            STARTUP_TIMEOUT_S,
            "kube-controller-manager",
        )
        self._wait("node-pool nodes Ready", lambda: self._nodes_ready(api), STARTUP_TIMEOUT_S, "kwok")
        return ports

    def _nodes(self) -> list[dict[str, Any]]:
        return node_pools.build_nodes(node_pools.load_pools(self.node_pools_file))

    def _create_nodes(self, api: _Api) -> None:
        for node in self._nodes():
            code, body = api.request("POST", "/api/v1/nodes", node)
            if code not in (201, 409):  # 409: exists already (idempotent `up`)
                raise ClusterError(f"creating node {node['metadata']['name']} failed: HTTP {code}: {body}")

    def _nodes_ready(self, api: _Api) -> bool:
        wanted = {n["metadata"]["name"] for n in self._nodes()}
        code, body = api.request("GET", "/api/v1/nodes")
        if code != 200:
            return False
        ready = {n["metadata"]["name"] for n in body["items"] if _node_ready(n)}
        return wanted <= ready
