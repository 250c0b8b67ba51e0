"""Send a prompt to a served LLMDeployment and get the text back as it is generated.

The OpenAI API's streamed /v1/completions (the serving pods' front door, port 8080) answers with
server-sent events, one per token, whichever GPU contract the pods speak (the ensemble's or the
llmapi model's). Triton's admin and generate APIs (port 8000) are asked directly. The client
reaches the embedded cluster's Services the only way this machine allows: from a socket made inside
the cluster's network namespace (so the ClusterIP goes through kube-proxy, as any pod's request
does), or through 127.0.0.1 (`kubectl port-forward`).

CLI (`make demo` uses it): `python -m e2e.generate [--namespace NS] SERVICE PROMPT`: the Service's
ClusterIP, from inside the namespace, asking for the model `SERVICE` (the deployment's name; pass
`--model` for another served name); the text is printed as it arrives.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from llm_operator.contract import HTTP_PORT, OPENAI_PORT

from e2e.cluster import netns
from e2e.cluster.launcher import Cluster


class GenerateError(Exception):
    pass


@dataclass(frozen=True)
class Chunk:
    text: str
    at: float  # seconds after the request was sent


def connection(host: str, port: int = HTTP_PORT, *, inside: str | None = None, timeout: float = 60.0) -> (
    http.client.HTTPConnection
):  # fmt: skip
    """A connection to host:port; `inside`: the network namespace to connect from."""
    if inside is None:
        return http.client.HTTPConnection(host, port, timeout=timeout)
    return netns.HTTPConnection(inside, host, port, timeout)


def stream(conn: http.client.HTTPConnection, model: str, prompt: str, max_tokens: int, **params: Any) -> (
    Iterator[Chunk]
):  # fmt: skip
    """The generated text of a streamed /v1/completions, one Chunk per event that carries text, as
    the events arrive (the last event, with the finish_reason, carries none). Raises GenerateError
    for an HTTP error or an error event (the front door's words).

    Greedy unless `params` say otherwise: a request without a temperature samples at OpenAI's 1
    (frontdoor/sampling.py), and callers compare texts and count tokens."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "temperature": 0, **params})  # fmt: skip
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise GenerateError(f"HTTP {response.status}: {response.read().decode(errors='replace')[:500]}")
    # readline() returns each event as its chunk arrives (chunked encoding), not at the end.
    for line in iter(response.readline, b""):
        if not line.startswith(b"data:") or line[len(b"data:") :].strip() == b"[DONE]":
            continue
        event = json.loads(line[len(b"data:") :])
        if "error" in event:
            raise GenerateError(str(event["error"]))
        text = "".join(str(c.get("text") or "") for c in event.get("choices") or [])
        if text:
            yield Chunk(text, time.monotonic() - start)


# What each of Triton's admin APIs answers to one request (method, path, JSON body or None), and
# the open requests that must keep working beside them (runtime/commands.py RESTRICTED_APIS).
ADMIN_REQUESTS = {
    "model-repository": ("POST", "/v2/repository/index", "{}"),
    "model-repository (GET)": ("GET", "/v2/repository/index", None),
    "logging": ("GET", "/v2/logging", None),
    "shared-memory": ("GET", "/v2/systemsharedmemory/status", None),
}


def open_requests(model: str) -> dict[str, tuple[str, str, str | None]]:
    """Triton's generate and model config of the deployment's client model (modelrepo.client_model):
    the ensemble takes max_tokens, the llmapi model `tensorrt_llm` sampling_param_max_tokens."""
    tokens = "sampling_param_max_tokens" if model == "tensorrt_llm" else "max_tokens"
    return {
        "generate": ("POST", f"/v2/models/{model}/generate", json.dumps({"text_input": "Hello", tokens: 4})),
        "model-config": ("GET", f"/v2/models/{model}/config", None),
    }


def answers(
    connect: Callable[[], http.client.HTTPConnection],
    requests: dict[str, tuple[str, str, str | None]],
    headers: dict[str, str] | None = None,
) -> dict[str, int]:
    """The HTTP status of each request, each on a fresh connection from `connect`."""
    out = {}
    for name, (method, path, body) in requests.items():
        conn = connect()
        try:
            conn.request(method, path, body, {"Content-Type": "application/json", **(headers or {})})
            response = conn.getresponse()
            response.read()
            out[name] = response.status
        finally:
            conn.close()
    return out


def service_ip(cluster: Cluster, namespace: str, service: str) -> str:
    kubectl = [str(cluster.bin_dir / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace]
    got = subprocess.run([*kubectl, "get", "service", service, "-o", "jsonpath={.spec.clusterIP}"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    if got.returncode != 0 or not got.stdout:
        raise GenerateError(f"Service {namespace}/{service}: {got.stderr.strip() or 'no ClusterIP'}")
    return got.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("service", help="the LLMDeployment's client Service (its name)")
    parser.add_argument("prompt")
    parser.add_argument("--namespace", "-n", default="default")
    parser.add_argument("--model", help="the served name to ask for (default: the Service's name)")
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args(argv)
    cluster = Cluster()
    try:
        ip = service_ip(cluster, args.namespace, args.service)
        conn = connection(ip, OPENAI_PORT, inside=cluster.netns)
        print(f"POST http://{ip}:{OPENAI_PORT}/v1/completions, streamed (Service "
              f"{args.namespace}/{args.service}, from inside {cluster.netns}): {args.prompt!r}")  # fmt: skip
        chunks = []
        sys.stdout.write("  > ")
        for chunk in stream(conn, args.model or args.service, args.prompt, args.max_tokens):
            chunks.append(chunk)
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        conn.close()
    except (GenerateError, OSError) as e:
        print(f"\ngenerate failed: {e}", file=sys.stderr)
        return 1
    if chunks:
        first, last = chunks[0].at, chunks[-1].at
        rate = (len(chunks) - 1) / (last - first) if last > first else 0.0
        print(f"\n  {len(chunks)} chunks streamed: first after {first * 1000:.0f} ms, last after "
              f"{last * 1000:.0f} ms ({rate:.0f} tokens/s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
