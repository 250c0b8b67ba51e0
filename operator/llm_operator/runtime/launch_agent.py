"""How a multi-node leader's mpirun starts its workers' daemons without sshd (NVIDIA's image has
none): a worker's launcher serves this agent on the group port, and the leader's mpirun calls it as
its remote launch agent (`--mca plm_rsh_agent`), the way it would call ssh: `agent HOST COMMAND...`
(Open MPI's orte/mca/plm/rsh/plm_rsh_module.c `setup_launch`). docs/launcher-and-engines.md.

One connection carries one command. Both ends prove who they are with mutual TLS 1.3 and trust
exactly the other's certificate from the deployment's launch Secret (contract.LEADER_LAUNCH_FILES,
WORKER_LAUNCH_FILES): only this deployment's leaders launch here, a leader talks only to this
deployment's workers, and a worker runs a launch only when the leader meant this pod by its name.
The worker runs the command as `/bin/sh -c` (as sshd runs a session's command through the user's
shell) in its own container's environment, relays its stdout and stderr, and ends with its exit
status; a connection that drops first ends the command's
process group, as sshd hangs up a session.

Standard library only (the serving images).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import selectors
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from llm_operator.contract import ENV, LEADER_CERT, LEADER_KEY, WORKER_CERT, WORKER_KEY

# Each frame: channel (1 byte) and length (4 bytes), then the payload.
FRAME = struct.Struct(">BI")
STDOUT, STDERR, EXIT = 1, 2, 3
# The process title of a session's shell, as `ps` in the worker shows it.
SESSION_TITLE = "llm-operator-launch-session"
PROGRAM = "llm-operator-launch-agent"
# ssh's status when it cannot connect or authenticate: mpirun reads any non-zero as a failed launch.
EXIT_UNREACHED = 255
MAX_REQUEST_BYTES = 1 << 20  # orted's command line is a few KiB
MAX_CONNECTIONS = 32  # a leader opens one per launch
HANDSHAKE_SECONDS = 10.0
CONNECT_SECONDS = 10.0
# After the command exits: how long a process it left behind may keep the output pipes open
# (orted daemonizes and closes them at once).
DRAIN_SECONDS = 2.0


def _context(side: int, identity: Path, cert: str, key: str, peer: str) -> ssl.SSLContext:
    """TLS 1.3 presenting `cert` and trusting only the peer's certificate `peer`: no name check, as
    the trust store holds that one self-signed certificate and nothing else."""
    context = ssl.SSLContext(side)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_cert_chain(identity / cert, identity / key)
    context.load_verify_locations(cafile=str(identity / peer))
    return context


def server_context(identity: Path) -> ssl.SSLContext:
    return _context(ssl.PROTOCOL_TLS_SERVER, identity, WORKER_CERT, WORKER_KEY, LEADER_CERT)


def client_context(identity: Path) -> ssl.SSLContext:
    return _context(ssl.PROTOCOL_TLS_CLIENT, identity, LEADER_CERT, LEADER_KEY, WORKER_CERT)


def _send(conn: ssl.SSLSocket, channel: int, payload: bytes) -> None:
    conn.sendall(FRAME.pack(channel, len(payload)) + payload)


def _recv_exact(conn: ssl.SSLSocket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed mid-frame")
        data += chunk
    return data


def _read_request(conn: ssl.SSLSocket) -> tuple[str, str]:
    """The host the leader meant and the command, from the leader's one request."""
    (size,) = struct.unpack(">I", _recv_exact(conn, 4))
    if size > MAX_REQUEST_BYTES:
        raise ValueError(f"a request of {size} bytes (at most {MAX_REQUEST_BYTES})")
    request = json.loads(_recv_exact(conn, size))
    host, command = request.get("host"), request.get("command")
    if not (isinstance(host, str) and isinstance(command, str)):
        raise ValueError("a request without a host and a command")
    return host, command


def _keepalive(sock: socket.socket) -> None:
    """A peer whose node is gone is noticed in about a minute, not never."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def not_this_pod(host: str, hostname: str) -> str | None:
    """Why a launch meant for `host` must not run on the pod named `hostname`: every leader of the
    deployment holds the same identity, so a leader that reached this pod by a stale DNS record, or
    an address another group's pod now has, would start its world on the wrong worker (and end that
    worker's own, processes.py stale_launches). None when `host` names this pod, or is an address
    (which names no pod)."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host.strip("[]"))
        return None
    meant, mine = host.partition(".")[0], hostname.partition(".")[0]
    if meant == mine:
        return None
    return f"reached {mine}, not {meant} (a stale DNS record, or an address another pod has now): nothing run"


def _peer_closed(conn: ssl.SSLSocket) -> bool:
    """The leader sends nothing after its request: readable means it hung up (a TLS record that
    carries no data, nothing to read yet, means it did not)."""
    conn.setblocking(False)
    try:
        return not conn.recv(1)
    except ssl.SSLWantReadError:
        return False
    except OSError:  # ssl.SSLError is one
        return True
    finally:
        conn.setblocking(True)


def run_session(conn: ssl.SSLSocket, command: str, environ: Mapping[str, str]) -> int:
    """Run one command for the leader on this connection and relay its output; its exit status as
    os.waitstatus_to_exitcode gives it (negative: killed by that signal). Raises ConnectionError
    when the leader hangs up before the command exits, after ending the command's process group."""
    try:
        process = subprocess.Popen(
            [SESSION_TITLE, "-c", command],
            executable="/bin/sh",
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as e:
        _send(conn, STDERR, f"{PROGRAM}: {socket.gethostname()} cannot start the command: {e}\n".encode())
        return EXIT_UNREACHED
    assert process.stdout is not None and process.stderr is not None
    open_pipes, exited_at = 2, None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(conn, selectors.EVENT_READ)
            selector.register(process.stdout, selectors.EVENT_READ, STDOUT)
            selector.register(process.stderr, selectors.EVENT_READ, STDERR)
            while True:
                if exited_at is None and process.poll() is not None:
                    exited_at = time.monotonic()
                if exited_at is not None and (not open_pipes or time.monotonic() - exited_at > DRAIN_SECONDS):
                    return process.wait()
                for key, _ in selector.select(timeout=0.2):
                    if key.data is None:
                        if exited_at is None and _peer_closed(conn):
                            raise ConnectionError("the leader hung up")
                        continue
                    data = os.read(key.fd, 65536)
                    if data:
                        _send(conn, key.data, data)
                    else:
                        selector.unregister(key.fileobj)
                        open_pipes -= 1
    finally:
        process.stdout.close()
        process.stderr.close()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _log(message: str) -> None:
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)


def _handle(raw: socket.socket, context: ssl.SSLContext, environ: Mapping[str, str], port: int) -> None:
    try:
        address = ipaddress.ip_address(raw.getpeername()[0].partition("%")[0])
        peer = str(getattr(address, "ipv4_mapped", None) or address)  # as the leader's pod IP reads
        _keepalive(raw)
        raw.settimeout(HANDSHAKE_SECONDS)
        try:
            conn = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError):
            return  # a port probe (a leader waiting for its workers) or a peer gone: nothing to say
        except OSError as e:
            _log(f"refused a connection from {peer}: {e}")  # no certificate, or not the leader's
            return
        with conn:
            host, command = _read_request(conn)
            conn.settimeout(None)
            wrong = not_this_pod(host, socket.gethostname())
            if wrong:
                _log(f"refused a launch from {peer}: {wrong}")
                _send(conn, STDERR, f"{PROGRAM}: {host}:{port}: {wrong}\n".encode())
                _send(conn, EXIT, struct.pack(">i", EXIT_UNREACHED))
                return
            _log(f"a launch from {peer}: {command[:160]}")
            code = run_session(conn, command, environ)
            if code:
                _log(f"the launch from {peer} ended with status {code}")
            _send(conn, EXIT, struct.pack(">i", code))
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError; json's errors are ValueErrors
        _log(f"a connection ended: {e}")
    finally:
        raw.close()


def _listen(port: int) -> socket.socket:
    if socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):  # a pod without an IPv6 address
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def serve(identity: Path, port: int, environ: Mapping[str, str]) -> int:
    """Accept launches until SIGTERM (the pod stopping: no new launch; running ones get a few seconds
    to end, orted leaving its session at once). A peer that cannot authenticate costs a connection
    slot for at most the handshake's timeout; beyond MAX_CONNECTIONS at once, connections are
    closed unread, and nothing a peer does ends the agent (whose exit would end the worker's world)."""
    context = server_context(identity)
    listener = _listen(port)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    listener.settimeout(0.5)
    _log(f"listening on port {port}: for this deployment's leaders only (mutual TLS)")
    slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def handle(raw: socket.socket) -> None:
        try:
            _handle(raw, context, environ, port)
        finally:
            slots.release()

    sessions: list[threading.Thread] = []
    with listener:
        while not stopping.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError as e:  # out of files, or an error accept(2) says to retry on
                _log(f"accept: {e}")
                time.sleep(0.5)
                continue
            if not slots.acquire(blocking=False):
                raw.close()
                continue
            session = threading.Thread(target=handle, args=(raw,), daemon=True)
            try:
                session.start()
            except RuntimeError:  # no thread to be had (the pod's pids limit)
                slots.release()
                raw.close()
                continue
            sessions = [s for s in sessions if s.is_alive()] + [session]
    deadline = time.monotonic() + HANDSHAKE_SECONDS
    for session in sessions:
        session.join(timeout=max(0.0, deadline - time.monotonic()))
    return 0


def launch(host: str, command: str, identity: Path, port: int) -> int:
    """The leader's side: run `command` on `host`'s agent; its exit status, relaying its output."""

    def fail(why: str) -> int:
        print(f"{PROGRAM}: {host}:{port}: {why}", file=sys.stderr, flush=True)
        return EXIT_UNREACHED

    try:
        context = client_context(identity)
    except OSError as e:
        return fail(f"this leader's identity is unreadable ({e})")
    try:
        raw = socket.create_connection((host, port), timeout=CONNECT_SECONDS)
    except socket.gaierror as e:
        return fail(f"does not resolve ({e.strerror})")
    except ConnectionRefusedError:
        return fail("connection refused (no launch agent listening: the worker is starting or stopping)")
    except OSError as e:
        return fail(f"cannot connect ({e.strerror or e})")
    _keepalive(raw)
    try:
        with context.wrap_socket(raw) as conn:
            request = json.dumps({"host": host, "command": command}).encode()
            conn.sendall(struct.pack(">I", len(request)) + request)
            conn.settimeout(None)
            out = {STDOUT: sys.stdout.buffer, STDERR: sys.stderr.buffer}
            while True:
                channel, size = FRAME.unpack(_recv_exact(conn, FRAME.size))
                data = _recv_exact(conn, size)
                if channel == EXIT:
                    code = int(struct.unpack(">i", data)[0])
                    return code if code >= 0 else 128 - code
                out[channel].write(data)
                out[channel].flush()
    except ssl.SSLCertVerificationError as e:
        return fail(f"did not prove it is one of this deployment's workers ({e.verify_message})")
    except (OSError, ConnectionError, KeyError, struct.error) as e:
        return fail(f"the launch agent ended the connection ({e})")


SERVE = "--serve"


def main(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """`python3 -m llm_operator.runtime.launch_agent HOST COMMAND...`, as mpirun calls ssh (the
    command's words joined with spaces, as ssh joins them for the remote shell); `--serve` on a
    worker. Both read the identity directory and port from the pod's environment (contract.ENV),
    which mpirun passes on to the agents it runs."""
    args = sys.argv[1:] if argv is None else argv
    identity = Path(environ.get("LLMOP_LAUNCH_IDENTITY_DIR") or ENV["LLMOP_LAUNCH_IDENTITY_DIR"])
    port = int(environ.get("LLMOP_LAUNCH_PORT") or ENV["LLMOP_LAUNCH_PORT"])
    if args == [SERVE]:
        return serve(identity, port, environ)
    if len(args) < 2 or args[0].startswith("-"):
        print(f"usage: {PROGRAM} HOST COMMAND... | {PROGRAM} {SERVE}", file=sys.stderr)
        return EXIT_UNREACHED
    return launch(args[0], " ".join(args[1:]), identity, port)


if __name__ == "__main__":
    sys.exit(main())
