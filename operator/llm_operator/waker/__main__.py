"""`python3 -m llm_operator.waker`: the router pod's waker container (render/router/waker.py), from the
operator image. Its bounds are flags the operator renders from the router's limits
(render/router/limits.py); exits 64 on a flag it cannot use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import resource
import signal
import sys

from llm_operator.frontdoor import http1 as H
from llm_operator.waker import push
from llm_operator.waker.activity import QUIET_S
from llm_operator.waker.exchange import FIRST_WAIT_S, INTERVAL_S, Settings, log
from llm_operator.waker.server import Waker, serve
from llm_operator.waker.stall import Watch, kube_reader

NAME = "llm-operator-waker"
# After SIGTERM (the router pod's termination grace is 60 s): open requests get this long to end.
DRAIN_S = 50.0
SPARE_FDS = 64  # descriptors kept for what is not a client's: the listening socket, the log


def parse(argv: list[str]) -> tuple[Settings, int, int]:
    parser = argparse.ArgumentParser(prog=NAME, description="SSE comments for streamed requests held at zero")
    parser.add_argument("--port", type=int, required=True, help="the OpenAI port clients reach")
    parser.add_argument("--envoy-port", type=int, required=True, help="Envoy's OpenAI listener on 127.0.0.1")
    parser.add_argument("--first-wait-seconds", type=float, default=FIRST_WAIT_S)
    parser.add_argument("--interval-seconds", type=float, default=INTERVAL_S)
    parser.add_argument("--max-connections", type=int, default=H.HttpLimits.max_connections)
    parser.add_argument("--max-headers", type=int, default=H.HttpLimits.max_headers)
    parser.add_argument("--max-head-bytes", type=int, default=H.HttpLimits.max_head_bytes)
    parser.add_argument("--inspect-bytes", type=int, default=H.MAX_BODY,
                        help="the most of a body read for `stream` (the front door's body cap)")  # fmt: skip
    parser.add_argument("--head-timeout-seconds", type=float, default=H.HttpLimits.head_timeout_s)
    parser.add_argument("--body-timeout-seconds", type=float, default=H.HttpLimits.body_timeout_s)
    parser.add_argument("--idle-timeout-seconds", type=float, default=H.HttpLimits.idle_timeout_s)
    parser.add_argument("--send-timeout-seconds", type=float, default=H.HttpLimits.send_timeout_s)
    parser.add_argument("--silence-seconds", type=float, default=Settings.silence_s)
    parser.add_argument("--retry-after-seconds", type=int, default=Settings.retry_after_s)
    parser.add_argument("--deployment", default="",
                        help="the LLMDeployment whose status can end held requests")  # fmt: skip
    parser.add_argument("--push-port", type=int, default=0,
                        help="KEDA's external-push scaler (gRPC) on this port; 0: none")  # fmt: skip
    args = parser.parse_args(argv)
    values = [v for k, v in vars(args).items() if k not in ("port", "deployment", "push_port")]
    if any(v <= 0 for v in values):
        parser.error("every value must be above 0")
    http = H.HttpLimits(
        max_head_bytes=args.max_head_bytes,
        max_headers=args.max_headers,
        max_body_bytes=args.inspect_bytes,
        head_timeout_s=args.head_timeout_seconds,
        body_timeout_s=args.body_timeout_seconds,
        idle_timeout_s=args.idle_timeout_seconds,
        send_timeout_s=args.send_timeout_seconds,
        max_connections=args.max_connections,
    )
    settings = Settings(
        envoy_port=args.envoy_port,
        http=http,
        first_wait_s=args.first_wait_seconds,
        interval_s=args.interval_seconds,
        silence_s=args.silence_seconds,
        retry_after_s=args.retry_after_seconds,
        deployment=args.deployment,
    )
    return settings, args.port, args.push_port


def watch(settings: Settings) -> Watch | None:
    if not settings.deployment:
        return None
    read, namespace = kube_reader(settings.deployment)
    print(f"{NAME}: a held request ends at once when LLMDeployment {namespace}/{settings.deployment} "
          "cannot start a replica", file=sys.stderr, flush=True)  # fmt: skip
    return Watch(read, log=log)


async def run(settings: Settings, port: int, push_port: int = 0) -> None:
    waker = Waker(settings, watch(settings))
    server = await serve(waker, None, port)
    scaler = None
    if push_port:
        scaler, _ = await push.serve(waker.activity, f"[::]:{push_port}")
        print(f"{NAME}: KEDA's external-push scaler on port {push_port}: active from the first held "
              f"request, inactive {QUIET_S:g} s after the last", file=sys.stderr, flush=True)  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    h = settings.http
    print(f"{NAME}: on port {port} for Envoy on 127.0.0.1:{settings.envoy_port}; a streamed request "
          f"unanswered after {settings.first_wait_s:g} s gets ': waking' every {settings.interval_s:g} s; "
          f"at most {h.max_connections} connections", file=sys.stderr, flush=True)  # fmt: skip
    await stop.wait()
    server.close()  # no new connection; the open ones end as their requests do
    waker.stop()
    if scaler is not None:  # KEDA's streams end cleanly: it reconnects (to the next router) in 2 s
        waker.activity.close()
        await scaler.stop(grace=1.0)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(DRAIN_S):
            await waker.idle.wait()
    waker.pool.close()


def fd_cap(http: H.HttpLimits) -> H.HttpLimits:
    """The connection cap within the file limit, raised to its hard limit first (as the front door
    does: frontdoor/__main__.py): a client's connection takes two descriptors, its own and Envoy's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        want = 2**20 if hard == resource.RLIM_INFINITY else hard
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    fits = max(1, (soft - SPARE_FDS) // 2)
    return dataclasses.replace(http, max_connections=min(http.max_connections, fits))


def main(argv: list[str] | None = None) -> int:
    settings, port, push_port = parse(sys.argv[1:] if argv is None else argv)
    asyncio.run(run(dataclasses.replace(settings, http=fd_cap(settings.http)), port, push_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
