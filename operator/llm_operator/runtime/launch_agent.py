"""How a multi-node leader's mpirun starts its workers' daemons without sshd (NVIDIA's image has
none): a worker's launcher serves this agent on the group port, and the leader's mpirun calls it as
its remote launch agent (`--mca plm_rsh_agent`), the way it would call ssh: `agent HOST COMMAND...`
(Open MPI's orte/mca/plm/rsh/plm_rsh_module.c `setup_launch`). docs/launcher-and-engines.md.

One connection carries one command. Both ends prove who they are with mutual TLS 1.3 and trust
exactly the other's certificate from the deployment's launch Secret (contract.LEADER_LAUNCH_FILES,
WORKER_LAUNCH_FILES): only this deployment's leader launches here, and the leader talks only to its
own workers, whatever name it reaches them by. The worker runs the command as `/bin/sh -c` (as sshd
runs a session's command through the user's shell) in its own container's environment, relays its
stdout and stderr, and ends with its exit status; a connection that drops first ends the command's
process group, as sshd hangs up a session.

Standard library only (the serving images).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import select
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
# The process title of a session's shell: how the supervisor tells a launch still in its session
# from one that has left it (processes.py stale_launches).
SESSION_TITLE = "llm-operator-launch-session"
PROGRAM = "llm-operator-launch-agent"
# ssh's status when it cannot connect or authenticate: mpirun reads any non-zero as a failed launch.
EXIT_UNREACHED = 255
MAX_COMMAND_BYTES = 1 << 20  # orted's command line is a few KiB
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


def _read_command(conn: ssl.SSLSocket) -> str:
    (size,) = struct.unpack(">I", _recv_exact(conn, 4))
    if size > MAX_COMMAND_BYTES:
        raise ValueError(f"a command of {size} bytes (at most {MAX_COMMAND_BYTES})")
    return _recv_exact(conn, size).decode()


def _peer_closed(conn: ssl.SSLSocket) -> bool:
    """The leader sends nothing after its command: readable means it hung up."""
    try:
        return not conn.recv(1)
    except (ssl.SSLError, OSError):
        return True


def run_session(conn: ssl.SSLSocket, command: str, environ: Mapping[str, str]) -> int:
    """Run one command for the leader on this connection and relay its output; its exit status as
    os.waitstatus_to_exitcode gives it (negative: killed by that signal). Raises ConnectionError
    when the leader hangs up first, after ending the command's process group."""
    process = subprocess.Popen(
        [SESSION_TITLE, "-c", command],
        executable="/bin/sh",
        env=dict(environ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None and process.stderr is not None
    channels = {process.stdout.fileno(): STDOUT, process.stderr.fileno(): STDERR}
    exited_at: float | None = None
    try:
        while channels:
            if exited_at is None and process.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > DRAIN_SECONDS:
                break
            readable, _, _ = select.select([*channels, conn.fileno()], [], [], 0.2)
            if conn.fileno() in readable and _peer_closed(conn):
                raise ConnectionError("the leader hung up")
            for fd in readable:
                if fd in channels:
                    data = os.read(fd, 65536)
                    if data:
                        _send(conn, channels[fd], data)
                    else:
                        del channels[fd]
        return process.wait()
    finally:
        process.stdout.close()
        process.stderr.close()
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _log(message: str) -> None:
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)


def _handle(raw: socket.socket, context: ssl.SSLContext, environ: Mapping[str, str]) -> None:
    address = ipaddress.ip_address(raw.getpeername()[0].partition("%")[0])
    peer = str(getattr(address, "ipv4_mapped", None) or address)  # as the leader's pod IP reads
    try:
        raw.settimeout(HANDSHAKE_SECONDS)
        with context.wrap_socket(raw, server_side=True) as conn:
            command = _read_command(conn)
            conn.settimeout(None)
            _log(f"a launch from {peer}: {command[:160]}")
            code = run_session(conn, command, environ)
            if code:
                _log(f"the launch from {peer} ended with status {code}")
            _send(conn, EXIT, struct.pack(">i", code))
    except (OSError, ValueError, UnicodeDecodeError) as e:  # ssl.SSLError is an OSError
        _log(f"a connection from {peer} ended: {e}")
    finally:
        raw.close()


def serve(identity: Path, port: int, environ: Mapping[str, str]) -> int:
    """Accept launches until SIGTERM (the pod stopping: no new launch; running ones finish)."""
    context = server_context(identity)
    try:
        listener = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    except OSError:  # a pod without IPv6
        listener = socket.create_server(("", port))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    listener.settimeout(0.5)
    _log(f"listening on port {port}: for this group's leader only (mutual TLS)")
    sessions: list[threading.Thread] = []
    with listener:
        while not stopping.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            session = threading.Thread(target=_handle, args=(raw, context, environ), daemon=True)
            session.start()
            sessions = [s for s in sessions if s.is_alive()] + [session]
    for session in sessions:
        session.join(timeout=HANDSHAKE_SECONDS)
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
    try:
        with context.wrap_socket(raw) as conn:
            payload = command.encode()
            conn.sendall(struct.pack(">I", len(payload)) + payload)
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
