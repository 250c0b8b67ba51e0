"""TCP relay from the host's 127.0.0.1 into the cluster's network namespace.

`python e2e/cluster/forwarder.py --netns NAME --listen PORT --to HOST:PORT --state-dir DIR`

Listens on 127.0.0.1:PORT in the host namespace, then enters the cluster namespace (setns on the
main thread before any other thread exists, so every relay thread is inside too) and relays each
connection to HOST:PORT there. Stand-alone (stdlib only): the launcher starts it as a detached
process; --state-dir only marks it as that state dir's process.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000


def _setns(path: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        # Half-close: the other direction may still carry data (exec/port-forward streams).
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def splice(client: socket.socket, upstream: socket.socket) -> None:
    """Relay both ways until both directions are done, then close both (e2e/chat.py's relay too)."""
    upstream.settimeout(None)
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(client: socket.socket, target: tuple[str, int]) -> None:
    try:
        upstream = socket.create_connection(target, timeout=10)
    except OSError as e:
        print(f"forwarder: connecting to {target[0]}:{target[1]}: {e}", file=sys.stderr, flush=True)
        client.close()
        return
    splice(client, upstream)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--netns", required=True)
    parser.add_argument("--listen", type=int, required=True)
    parser.add_argument("--to", required=True)
    parser.add_argument("--state-dir", required=True)
    args = parser.parse_args()
    host, port = args.to.rsplit(":", 1)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.listen))
    listener.listen(128)
    _setns(f"/run/netns/{args.netns}")
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"forwarder: 127.0.0.1:{args.listen} -> {args.netns} {host}:{port}", flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, (host, int(port))), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
