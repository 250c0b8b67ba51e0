"""Reach a deployment's OpenAI API the way an application does: the official `openai` SDK, at the
base URL the LLMDeployment's status names (status.endpoints.openai).

That URL (`http://SERVICE.NAMESPACE.svc:8080/v1`) resolves inside the cluster only. This machine
reaches the cluster's Services only from sockets made inside its network namespace, and the SDK
makes its own sockets: a relay on 127.0.0.1 hands each of the SDK's connections to a socket made in
the namespace and connected to the Service's ClusterIP, so every request goes through kube-proxy
as a pod's would. Nothing else changes: the SDK speaks HTTP to the relay as it would to the Service.

CLI (`make demo` ends with it): `python -m e2e.chat [--namespace NS] DEPLOYMENT PROMPT`: a chat
completion, streamed, printed token by token.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from llm_operator.contract import OPENAI_PORT

from e2e.cluster import netns
from e2e.cluster.forwarder import splice
from e2e.cluster.launcher import Cluster
from e2e.generate import GenerateError, service_ip


def _serve(client: socket.socket, namespace: str, host: str, port: int) -> None:
    try:
        upstream = netns.connect(namespace, host, port, timeout=10)
    except OSError:
        client.close()  # the SDK sees a refused connection, as it would from the Service
        return
    splice(client, upstream)


@contextlib.contextmanager
def relay(namespace: str, host: str, port: int) -> Iterator[int]:
    """A port on 127.0.0.1 whose connections go on to host:port from inside `namespace`."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: the relay is done
                return
            threading.Thread(target=_serve, args=(client, namespace, host, port), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def status_url(cluster: Cluster, namespace: str, deployment: str) -> str:
    """status.endpoints.openai of the LLMDeployment."""
    kubectl = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace]
    jsonpath = "jsonpath={.status.endpoints.openai}"
    got = subprocess.run([*kubectl, "get", "llmdeployment", deployment, "-o", jsonpath],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    if got.returncode != 0 or not got.stdout:
        raise GenerateError(
            f"LLMDeployment {namespace}/{deployment}: {got.stderr.strip() or 'no status.endpoints.openai'}"
        )
    return got.stdout


@contextlib.contextmanager
def base_url(cluster: Cluster, url: str) -> Iterator[str]:
    """`url` (http://SERVICE.NAMESPACE.svc:PORT/PATH, as status names it) as a base URL this
    machine's SDK can use: the same path, through a relay to the Service's ClusterIP."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    service, namespace, suffix = [*host.split(".", 2), "", ""][:3]
    if parts.scheme != "http" or suffix != "svc" or parts.port is None:
        raise GenerateError(f"{url} is not http://SERVICE.NAMESPACE.svc:PORT/...")
    with relay(cluster.netns, service_ip(cluster, namespace, service), parts.port) as port:
        yield f"http://127.0.0.1:{port}{parts.path}"


@contextlib.contextmanager
def at_pod(cluster: Cluster, pod: dict[str, Any]) -> Iterator[str]:
    """An OpenAI base URL on this machine that reaches `pod`'s front door, and only that pod (not
    through its Service)."""
    with relay(cluster.netns, pod["status"]["podIP"], OPENAI_PORT) as port:
        yield f"http://127.0.0.1:{port}/v1"


def main(argv: list[str] | None = None) -> int:
    import openai  # the dev environment's; the cluster tooling above runs without it

    parser = argparse.ArgumentParser(prog="python -m e2e.chat", description=__doc__.split("\n\n")[0])
    parser.add_argument("deployment", help="the LLMDeployment (its status names the URL)")
    parser.add_argument("prompt")
    parser.add_argument("--namespace", "-n", default="default")
    parser.add_argument("--model", help="a served name (default: the first /v1/models lists)")
    parser.add_argument("--max-tokens", type=int, default=60)
    # The API's default is OpenAI's 1.0 (sampled); the demo shows the model's greedy answer.
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    cluster = Cluster()
    try:
        url = status_url(cluster, args.namespace, args.deployment)
        with base_url(cluster, url) as local:
            client = openai.OpenAI(base_url=local, api_key="unused", max_retries=0, timeout=120)
            served = [m.id for m in client.models.list()]
            model = args.model or served[0]
            print(f"openai.OpenAI(base_url={url!r}) (from inside {cluster.netns}): models {served}")
            print(f"  user:      {args.prompt}\n  assistant: ", end="", flush=True)
            start, first, tokens, usage = time.monotonic(), 0.0, 0, None
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": args.prompt}],
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                stream=True,
                stream_options={"include_usage": True},
            )
            for chunk in stream:
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    if choice.delta.content:
                        first = first or time.monotonic() - start
                        tokens += 1
                        print(choice.delta.content, end="", flush=True)
    except (GenerateError, OSError, openai.OpenAIError) as e:
        print(f"\nchat failed: {e}", file=sys.stderr)
        return 1
    took = time.monotonic() - start
    counted = (
        f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens" if usage else "no usage"
    )
    print(f"\n  {tokens} chunks streamed: first after {first * 1000:.0f} ms, "
          f"all in {took * 1000:.0f} ms ({counted})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
