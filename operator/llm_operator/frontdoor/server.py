"""The OpenAI-compatible HTTP server of a leader pod: /v1/models, /v1/completions and
/v1/chat/completions, translated to Triton's generate API on localhost (upstream.py).

asyncio on the standard library rather than http.server's threads: a generation is a task, so a
client that goes away is seen at once (its socket reaches EOF while we wait on Triton) and the task
is cancelled, which closes the connection to Triton, which cancels the request there; a thread
blocked reading Triton would notice only at its next write. One event loop also adds no thread
hand-off to each streamed token. HTTP/1.1 is h11's (http1.py), with its bounds: keep-alive,
pipelining, Content-Length or chunked bodies, `Expect: 100-continue` (curl sends it for bodies over
1 KiB). A request's CPU work (its JSON, the chat template, tokenization) runs on a worker thread
once its body passes INLINE_BYTES, after its size is checked: the `tokenizers` library lets go of
the GIL while it encodes, so a megabyte prompt does not hold up the streams of others.

Every refusal is one line in the log (status, request, client, why), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from llm_operator.frontdoor import choices as C
from llm_operator.frontdoor import http1 as H
from llm_operator.frontdoor import protocol as P
from llm_operator.frontdoor import responses as R
from llm_operator.frontdoor import structured
from llm_operator.frontdoor import triton_inputs as T
from llm_operator.frontdoor.api_keys import ApiKeys
from llm_operator.frontdoor.chat import ChatTemplateError, render_chat
from llm_operator.frontdoor.sampling import OPENAI, Defaults
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.tools import parsers as TP
from llm_operator.frontdoor.tools.messages import template_messages
from llm_operator.frontdoor.upstream import Answer, Upstream, UpstreamError


@dataclass(frozen=True)
class Settings:
    names: list[str]  # what /v1/models lists; the first is the deployment's spec.model.name
    triton_model: str  # tensorrt_llm: the engine contract's (ids) or the LLM API contract's (text)
    backend: str  # contract.ENV LLMOP_BACKEND; pytorch: the LLM API contract
    limits: P.Limits
    api_keys: ApiKeys | None = None  # spec.routing.apiKeys: every request but /health needs one
    defaults: Defaults = OPENAI  # what a request leaves out of its sampling (sampling.py)
    tool_parser: str = ""  # spec.model.toolCallParser (tools/parsers.py; "": tool_choice auto refused)
    unguided: str = ""  # why the engine has no guided decoder ("": it has one; structured.py)
    http: H.HttpLimits = field(default_factory=H.HttpLimits)  # body cap: H.body_limit(maxInputLen)


# What Triton generates for: cancelled there when the client's connection ends (EOF) midway.
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions")
# Requests prepared at once (JSON, template, tokens); tokenizers encodes without the GIL.
PREPARE_THREADS = 4
# A body this small is prepared on the event loop: a few thousand tokens at most, well under a
# millisecond for a model's tokenizer (5 ms for the cpu-reference's byte tokenizer on a loaded
# machine), where the hop to a worker thread and back added about 2 ms to bench P8's p50 (two
# cores at a load of 6: each hand-off waits for the scheduler). P8's requests are ~150 bytes.
INLINE_BYTES = 2048
Result = TypeVar("Result")


class FrontDoor:
    def __init__(self, settings: Settings, tokenizer: Tokenizer, upstream: Upstream) -> None:
        self.settings, self.tokenizer, self.upstream = settings, tokenizer, upstream
        self.created = int(time.time())
        # The client connections' handlers, held: asyncio keeps tasks only weakly, and a handler
        # whose socket is paused (its read-ahead full) while its answer waits is otherwise
        # garbage, collected mid-answer ("Task was destroyed but it is pending!").
        self.handlers: set[asyncio.Task[Any]] = set()
        self.prepare = ThreadPoolExecutor(PREPARE_THREADS, thread_name_prefix="frontdoor-prepare")
        # The parser's marker where the tokenizer has it as a special token, which decoding would
        # skip: kept as text on requests the parser reads (engine contract; the LLM API contract
        # detokenizes in the engine, which skips it).
        marker = TP.FORMATS[settings.tool_parser].marker if settings.tool_parser in TP.FORMATS else ""
        self.markers = tokenizer.special_ids([marker] if marker else [])

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if (open_now := len(self.handlers)) >= self.settings.http.max_connections:
            H.log(f"503 to {H.client(writer)}: {open_now} connections open, the limit")
            await H.refuse(reader, writer, open_now)
            return
        handler = asyncio.current_task()
        assert handler is not None
        self.handlers.add(handler)
        peer = H.Peer(reader, writer, self.settings.http)
        try:
            while await self._one(peer):
                pass
        # The stop cancels the handler of a kept-alive connection: it ends like a client that went
        # away, not with a traceback in the pod's log (nothing awaits this task).
        except (H.Gone, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.handlers.discard(handler)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, peer: H.Peer) -> bool:
        """Serve one request; False when the connection is to be closed."""
        peer.request_id = ""  # a request that cannot be read has none
        request = None
        try:
            request = await peer.request()
            if request is None:
                return False
            peer.request_id = H.request_id(request.headers)
            self._authorize(request.path, request.headers)  # before the body: a stranger's bytes are not read
            body = await peer.body(request, self.settings.http.max_body_bytes)
        except P.ApiError as e:
            await self._error(peer, request, e, close=True)
            await peer.linger()  # the rest of a head or body may be on its way
            return False
        close = request.close
        task = asyncio.create_task(self._route(peer, request, body, close))
        if request.path not in GENERATION_ROUTES:
            # Cheap, and answered even to a client that half-closed after its request (`printf |
            # nc`, HTTP/1.0 tools): an EOF cannot tell that from a client gone, and only a
            # generation is worth cancelling on a guess.
            return await task and not close
        watch = asyncio.create_task(peer.until_gone())
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            return task.result() and not close
        task.cancel()  # EOF: the client left, cancel its generation in Triton
        with contextlib.suppress(asyncio.CancelledError, H.Gone, ConnectionError):
            await task
        return False

    async def _error(self, peer: H.Peer, request: H.Request | None, e: P.ApiError, close: bool,
                     why: str = "") -> bool:  # fmt: skip
        """A refusal: one line in the log (`why`, else the message), and the error as the answer
        while none has started."""
        what = f"{request.method} {request.path[:100]}" if request else "a request"
        rid = f" [{peer.request_id}]" if peer.request_id else ""
        H.log(f"{e.status} to {what} from {H.client(peer.writer)}{rid}: {why or e.message[:300]}")
        if not peer.can_answer():
            raise H.Gone  # a response is under way: the connection can only end
        await peer.json(e.status, e.body(), close)
        return True

    async def _route(self, peer: H.Peer, request: H.Request, body: bytes, close: bool) -> bool:
        routes = {"/v1/models": "GET", "/v1/completions": "POST", "/v1/chat/completions": "POST",
                  "/health": "GET"}  # fmt: skip
        method, path = request.method, request.path
        try:
            if path.startswith("/v1/models/") and method == "GET":
                name = urllib.parse.unquote(path.removeprefix("/v1/models/"))
                self._model(name)
                listing = R.models_list([name], self.created)["data"][0]
                return await _json(peer, 200, listing, close)
            if path not in routes:
                raise P.ApiError(404, f"no such endpoint {path}; this server serves /v1/models, "
                                 "/v1/completions and /v1/chat/completions", code="not_found")  # fmt: skip
            if method != routes[path]:
                raise P.ApiError(405, f"{path} takes {routes[path]}, not {method}")
            if path == "/v1/models":
                return await _json(peer, 200, R.models_list(self.settings.names, self.created), close)
            if path == "/health":
                ready = await self._ready()
                return await _json(peer, 200 if ready else 503, {"ready": ready}, close)
            kind = "chat" if path == "/v1/chat/completions" else "completion"
            return await self._generate(peer, kind, body, close)
        except P.ApiError as e:
            return await self._error(peer, request, e, close)
        except (H.Gone, ConnectionError, asyncio.CancelledError):
            raise
        except Exception as e:  # a defect, before any byte of the response: a 500, one line logged
            error = P.ApiError(500, f"the front door failed ({type(e).__name__})", kind="server_error")
            await self._error(peer, request, error, close=True, why=H.defect(e))
            return False

    def _authorize(self, path: str, headers: dict[str, str]) -> None:
        keys = self.settings.api_keys
        if keys is None or path.split("?", 1)[0] == "/health":
            return
        if not keys.accepts(headers.get("authorization", "")):
            raise P.ApiError(401, "a valid API key is required: send it as `Authorization: Bearer KEY` "
                             "(the openai SDK's api_key)", code="invalid_api_key")  # fmt: skip

    async def _ready(self) -> bool:
        try:
            await self.upstream.json("GET", "/v2/health/ready")
        except UpstreamError:
            return False
        return True

    def _model(self, name: object) -> None:
        if name not in self.settings.names:
            raise P.ApiError(404, f"the model {name} does not exist here; this server serves "
                             f"{', '.join(self.settings.names)}", param="model",
                             code="model_not_found")  # fmt: skip

    def _prompt(self, gen: P.Generation, body: dict[str, Any]) -> str:
        """The prompt as the engine gets it: on the LLM API contract the text it tokenizes, else
        the text whose ids (gen.prompt_ids) the engine gets."""
        if gen.kind == "completion":
            return P.completion_prompt(body)
        messages = template_messages(P.chat_messages(body))
        template = self.tokenizer.chat_template
        if not template:
            raise P.bad("this model has no chat template (tokenizer_config.json); use /v1/completions",
                        "messages")  # fmt: skip
        try:
            tok = self.tokenizer
            tools: dict[str, Any] = {"tools": gen.extras.tools} if gen.extras.tools else {}
            rendered = render_chat(template, messages, bos_token=tok.bos_token, eos_token=tok.eos_token,
                                   **gen.template_kwargs, **tools)  # fmt: skip
            return tok.chat_prompt(rendered) if self.settings.backend == "pytorch" else rendered
        except ChatTemplateError as e:
            raise P.bad(e.message, "messages") from None

    def _prepare(self, kind: str, raw: bytes, request_id: str) -> tuple[P.Generation, int]:
        """The request checked, its prompt rendered and counted (a worker thread's CPU work)."""
        s = self.settings
        body = P.parse_json(raw)
        gen = P.check(body, kind, s.limits, backend=s.backend, defaults=s.defaults)
        gen.extras = structured.extras(body, kind, s.backend, s.tool_parser, s.unguided)
        gen.id = request_id  # the response's id carries it: chatcmpl-<X-Request-Id>
        self._model(gen.model)
        gen.prompt = self._prompt(gen, body)
        ids = s.backend != "pytorch"  # the engine contract: token ids cross the boundary
        if ids:
            gen.prompt_ids = self.tokenizer.prompt_ids(gen.prompt, chat=gen.kind == "chat")
        prompt_tokens = len(gen.prompt_ids) if ids else self.tokenizer.count(gen.prompt)
        P.fit(gen, prompt_tokens, s.limits)
        return gen, prompt_tokens

    async def _offload(self, size: int, fn: Callable[..., Result], *args: Any) -> Result:
        """fn(*args) on a worker thread, or here for an input of at most INLINE_BYTES."""
        if size <= INLINE_BYTES:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.prepare, fn, *args)

    async def _generate(self, peer: H.Peer, kind: str, raw: bytes, close: bool) -> bool:
        s = self.settings
        gen, prompt_tokens = await self._offload(len(raw), self._prepare, kind, raw, peer.request_id)
        ids = s.backend != "pytorch"
        try:
            decoupled = await self.upstream.decoupled(s.triton_model)
        except UpstreamError as e:
            raise P.ApiError(503, f"the model is not ready yet ({e.message}); retry shortly",
                             kind="server_error", code="model_not_ready") from None  # fmt: skip
        if gen.stream and not decoupled:
            raise P.bad("this deployment does not stream (runtime.streaming: false); send stream: false",
                        "stream")  # fmt: skip
        if gen.extras.n > 1 and not decoupled:  # its model answers once per request: one sequence
            raise P.bad("n > 1 needs a deployment that streams (runtime.streaming: true)", "n")
        end_id = self.tokenizer.end_id
        inputs = T.triton_inputs(gen, s.backend, decoupled, end_id=end_id)
        sequences = 0 if ids else gen.extras.n  # the llmapi model: an answer per sequence
        pieces = self.upstream.generate(s.triton_model, inputs, decoupled, sequences)
        pieces = (
            C.texts(
                pieces,
                self.tokenizer,
                None if gen.ignore_eos else end_id,
                self.markers if gen.extras.parser in TP.PARSERS else None,
            )
            if ids
            else _deltas(pieces, self._token)
        )
        try:
            first = await C.next_answer(pieces)
        except UpstreamError as e:
            raise _refusal(e) from None

        def usage(answer: list[C.Choice]) -> dict[str, int]:
            return self._usage(prompt_tokens, "".join(c.text for c in answer), sum(c.count for c in answer))

        if not gen.stream:
            try:
                answer = await C.whole(gen, first, pieces)
            except UpstreamError as e:
                raise _refusal(e) from None
            finally:
                await pieces.aclose()
            counts = usage(answer)
            whole = [(c.tools.content if c.tools else c.text, C.finish(c, gen),
                      C.logprobs(gen, c.entries, self._token), C.tool_calls(c)) for c in answer]  # fmt: skip
            return await _json(peer, 200, R.response(gen, whole, counts), close)
        peer.start_stream(close)
        try:
            await C.stream(peer, gen, first, pieces, usage, self._token)
        except UpstreamError as e:  # headers are sent: the error is an event, then [DONE]
            await peer.event(_refusal(e).body())
        except P.ApiError as e:  # the engine's finish reason is no answer (R.finish_reason)
            await peer.event(e.body())
        except (H.Gone, ConnectionError):
            raise
        except Exception as e:  # a defect here: the client still gets an ending, the log one line
            H.log(f"500 in the stream of {peer.request_id} to {H.client(peer.writer)}: {H.defect(e)}")
            await peer.event(P.ApiError(500, f"the front door failed ({type(e).__name__})",
                                        kind="server_error").body())  # fmt: skip
        finally:
            await pieces.aclose()  # closes Triton's stream: a stop sequence ends the generation there
        await peer.end_stream()
        return True

    def _token(self, id_: int) -> str:
        """A log-probability entry's token: the id decoded alone, as vLLM shows it."""
        token: str = self.tokenizer.backend.decode([id_], skip_special_tokens=False)
        return token

    def _usage(self, prompt_tokens: int, text: str, ids: int) -> dict[str, int]:
        """The engine's ids counted (engine contract); the LLM API contract returns text only,
        which is counted with the model's tokenizer."""
        if self.settings.backend != "pytorch":
            return R.usage(prompt_tokens, ids)
        return R.usage(prompt_tokens, self.tokenizer.count(text, add_special_tokens=False))


async def _json(peer: H.Peer, status: int, body: dict[str, Any], close: bool) -> bool:
    await peer.json(status, body, close)
    return True


def _refusal(e: UpstreamError) -> P.ApiError:
    """Triton's answer in OpenAI's terms: its 400s are the request's fault, the rest the server's."""
    if e.status == 400:
        return P.ApiError(400, f"the model refused the request: {e.message}")
    if e.status in (502, 503):
        return P.ApiError(503, f"{e.message}; retry shortly", kind="server_error", code="model_not_ready")
    return P.ApiError(500, f"the model failed: {e.message}", kind="server_error")


async def _deltas(
    answers: AsyncGenerator[Answer, None], token: Callable[[int], str]
) -> AsyncGenerator[Answer, None]:
    """The new text, ids and log-probabilities of each sequence of Triton's llmapi model, which
    sends each sequence's whole so far in every response (NVIDIA/TensorRT-LLM triton_backend/
    all_models/llmapi/tensorrt_llm/1/model.py, _create_response: `output.text`, the LLM API's whole
    text, not its `text_diff`). The new ids' entries ride with the new text: each id's piece is
    token(id) where those spell the new text, else the text is the last id's."""
    sent: dict[int, tuple[str, int]] = {}  # sequence -> (its text, its ids) sent so far
    try:
        async for answer in answers:
            text, (before, ids) = answer.text, sent.get(answer.index, ("", 0))
            # The LLM API's text only grows (a C-level prefix check per response, not a Python loop
            # over the whole text); were an earlier part revised, what was sent stays sent.
            if text.startswith(before):
                common = len(before)
            else:
                common = next((i for i, (a, b) in enumerate(zip(before, text, strict=False)) if a != b),
                              min(len(before), len(text)))  # fmt: skip
            new_ids = answer.ids[ids:]
            pieces = tuple(token(i) for i in new_ids)
            if "".join(pieces) != text[common:]:
                pieces = ("",) * (len(new_ids) - 1) + (text[common:],) if new_ids else ()
            yield Answer(text[common:], answer.finish_reason, new_ids, answer.index,
                         answer.log_probs[ids:], pieces)  # fmt: skip
            sent[answer.index] = text, max(ids, len(answer.ids))
    finally:
        await answers.aclose()


async def serve(door: FrontDoor, host: str | None, port: int) -> asyncio.Server:
    # Nagle would hold small SSE chunks back; asyncio sets TCP_NODELAY on its sockets already.
    # asyncio's default backlog (100), which is also how many connections one turn of the loop
    # accepts: 1,024 at once held every stream for 177 ms (tests/triton/test_frontdoor_limits.py).
    return await asyncio.start_server(door.connection, host, port, limit=H.CHUNK, reuse_address=True)
