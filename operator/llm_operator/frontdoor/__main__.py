"""`python3 -m llm_operator.frontdoor`: the OpenAI-compatible API of a leader pod, started and
supervised by the launcher beside Triton (runtime/launcher.py). Configured by the pod's
environment (contract.ENV); exits 78 with one line naming the variable or file that is wrong.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import resource
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from llm_operator.contract import (
    CPU_REFERENCE_TOKENIZER_DIR,
    ENV,
    XGRAMMAR_TOKENIZER_INFO,
    tokenizer_info_problem,
)
from llm_operator.frontdoor import sampling, structured
from llm_operator.frontdoor.api_keys import ApiKeys
from llm_operator.frontdoor.http1 import HttpLimits, body_limit
from llm_operator.frontdoor.protocol import Limits
from llm_operator.frontdoor.server import FrontDoor, Settings, serve
from llm_operator.frontdoor.stall import EXIT_STALLED, StallWatch
from llm_operator.frontdoor.tokenizer import Tokenizer, TokenizerError
from llm_operator.frontdoor.tools.parsers import PARSERS
from llm_operator.frontdoor.upstream import Upstream

EXIT_CONFIG = 78
NAME = "llm-operator-frontdoor"


class ConfigError(ValueError):
    pass


def _get(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name) or ENV[name]


def _int(environ: Mapping[str, str], name: str) -> int:
    raw = _get(environ, name) or "0"
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must be >= 0")
    return value


def settings(environ: Mapping[str, str]) -> Settings:
    backend = _get(environ, "LLMOP_BACKEND")
    if environ.get("LLMOP_CONTRACT") == "pytorch":  # a CPU runtime speaking the LLM API contract
        backend = "pytorch"
    # Either contract's `tensorrt_llm` model: the engine contract's takes token ids (the ensemble's
    # text path decodes each response alone), the LLM API contract's text.
    triton_model = "tensorrt_llm"
    names = [n.strip() for n in _get(environ, "LLMOP_SERVED_MODEL_NAMES").split(",") if n.strip()]
    if not names:
        raise ConfigError("LLMOP_SERVED_MODEL_NAMES is not set: name the model(s) the API serves")
    limits = Limits(_int(environ, "LLMOP_MAX_INPUT_LEN"), _int(environ, "LLMOP_MAX_SEQ_LEN"))
    tool_parser = _get(environ, "LLMOP_TOOL_CALL_PARSER")
    if tool_parser and tool_parser not in PARSERS:
        raise ConfigError(f"LLMOP_TOOL_CALL_PARSER={tool_parser!r} is not one of {', '.join(PARSERS)}")
    return Settings(
        names=names,
        triton_model=triton_model,
        backend=backend,
        limits=limits,
        api_keys=api_keys(environ),
        http=HttpLimits(max_body_bytes=body_limit(limits.max_input_len)),
        tool_parser=tool_parser,
        unguided=unguided(environ, backend),
    )


def unguided(environ: Mapping[str, str], backend: str) -> str:
    """Why the engine has no guided decoder, "" when it has one: a tensorrt-engine pod's engine
    without a tokenizer info file the decoder can load, for which the launcher turned it off by
    the same check (runtime/launcher.py)."""
    if backend != "tensorrt-engine":
        return ""
    engine_dir = _get(environ, "LLMOP_ENGINE_DIR")
    if engine_dir and not tokenizer_info_problem(Path(engine_dir, XGRAMMAR_TOKENIZER_INFO)):
        return ""
    return structured.NO_TOKENIZER_INFO


# File descriptors kept for what is not a client: Triton's connections beside each client's
# request (one each), the listening socket, the log, the tokenizer's files.
SPARE_FDS = 64


def connection_cap(http: HttpLimits) -> HttpLimits:
    """The connection cap within the process's file limit, raised to its hard limit first (as Go
    does at start): containerd 2 and Docker 25 give containers a soft limit of 1,024, which would
    refuse every client once ~1,000 connections are open, the cap long before. A client's
    connection takes two descriptors while it generates (its own and Triton's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        want = 2**20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    fits = max(1, (soft - SPARE_FDS) // 2)
    return dataclasses.replace(http, max_connections=min(http.max_connections, fits))


def api_keys(environ: Mapping[str, str]) -> ApiKeys | None:
    """spec.routing.apiKeys' Secret, mounted: it must hold a key, or nobody could be let in."""
    directory = _get(environ, "LLMOP_API_KEYS_DIR")
    if not directory:
        return None
    try:
        keys = ApiKeys(Path(directory))
    except OSError as e:
        raise ConfigError(
            f"LLMOP_API_KEYS_DIR={directory}: cannot read the API keys ({e.strerror})"
        ) from None
    if not keys.count:
        raise ConfigError(
            f"LLMOP_API_KEYS_DIR={directory} holds no key: put at least one in the Secret that "
            "spec.routing.apiKeys.secretRef names"
        )
    return keys


def tokenizer_dir(environ: Mapping[str, str]) -> str:
    found = _get(environ, "LLMOP_TOKENIZER_DIR")
    if not found and _get(environ, "LLMOP_BACKEND") == "cpu-reference":
        found = CPU_REFERENCE_TOKENIZER_DIR
    if not found:
        raise ConfigError(
            "LLMOP_TOKENIZER_DIR is not set: the front door counts tokens with the model's tokenizer"
        )
    return found


async def run(door: FrontDoor, port: int) -> None:
    server = await serve(door, None, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    keys = door.settings.api_keys
    auth = f", {keys.count} API key(s) accepted" if keys is not None else ", no API key required"
    d = door.settings.defaults
    h = door.settings.http
    print(f"{NAME}: serving {', '.join(door.settings.names)} on port {port} "
          f"(Triton model {door.settings.triton_model}{auth}; sampling defaults from {d.source}: "
          f"temperature {d.temperature:g}, top_p {d.top_p:g}, top_k {d.top_k or 'off'}, "
          f"repetition_penalty {d.repetition_penalty or 'off'}; at most {h.max_connections} "
          f"connections, bodies of {h.max_body_bytes // 1024} KiB)", file=sys.stderr, flush=True)  # fmt: skip
    watching = asyncio.create_task(watch_stall(door.upstream.watch)) if door.upstream.watch.timeout else None
    await stop.wait()
    if watching is not None:
        watching.cancel()
    # The launcher stops us once Triton is gone: nothing is left to finish.
    server.close()


async def watch_stall(watch: StallWatch, period: float = 1.0) -> None:
    """A stalled group (stall.py): say why on one line and exit at once, requests in flight and
    all (they could only hang); the launcher then stops the world and the pod fails."""
    while True:
        await asyncio.sleep(period)
        why = watch.stalled(time.monotonic())
        if why is not None:
            print(f"{NAME}: {why}", file=sys.stderr, flush=True)
            os._exit(EXIT_STALLED)


def main(environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    # One request's encode stays on the thread that asked for it: tokenizers' default hands even a
    # batch of one to its rayon pool, two thread hand-offs more on each request's path (bench P8:
    # added TTFT p50 17 ms with them on a loaded 2-core machine, 6 ms without).
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        s = settings(env)
        port, triton_port = _int(env, "LLMOP_OPENAI_PORT"), _int(env, "LLMOP_HTTP_PORT")
        stall_timeout = _int(env, "LLMOP_STALL_TIMEOUT_SECONDS")
        tokenizer = Tokenizer.load(tokenizer_dir(env))
        s = dataclasses.replace(s, defaults=sampling.load(tokenizer.directory), http=connection_cap(s.http))
    except (ConfigError, TokenizerError, ValueError) as e:
        print(f"{NAME}: {e}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    upstream = Upstream("127.0.0.1", triton_port, stall_timeout)
    asyncio.run(run(FrontDoor(s, tokenizer, upstream), port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
