"""The engine contract's text: the `tensorrt_llm` model's output ids, decoded here, once per request.

TensorRT-LLM's inflight_batcher_llm `tensorrt_llm` model answers with `output_ids` [batch, beam,
length] and `sequence_length` [batch, beam] (triton_backend/inflight_batcher_llm/src/
model_instance_state.cc, fillTritonResponse, stored copy c8c6df08). Streaming, each response
holds only the ids produced since the previous one (the executor's LlmRequest::createResult sends
`maxNbTokens - getMaxSentTokenLen()` of them unless returnAllGeneratedTokens, which it sets only
for beam search: cpp/tensorrt_llm/batch_manager/llmRequest.cpp, stored copy 89fd9b74); the last
response of a request carries Triton's final flag, which generate_stream shows as the end of the
event stream. Not streaming, the one response holds every generated id (exclude_input_in_output).

The stock postprocessing model decodes each response's ids on their own (`batch_decode` of that
response alone: triton_backend/all_models/inflight_batcher_llm/postprocessing/1/model.py, stored
copy 2e2327b9): SentencePiece's leading spaces vanish and a character split across tokens becomes
U+FFFD. Here one `DecodeStream` per request sees every id in order, so the text streamed is the
text of all the ids together, whatever the pieces.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from tokenizers.decoders import DecodeStream

from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.frontdoor.upstream import Answer


async def texts(
    answers: AsyncGenerator[Answer, None], tokenizer: Tokenizer, end_id: int | None
) -> AsyncGenerator[Answer, None]:
    """Each response's text (maybe "" while a character is incomplete), its ids kept; the
    response whose last id is `end_id` says "stop" (the engine ended the sequence itself)."""
    stream = DecodeStream(skip_special_tokens=True)
    try:
        async for answer in answers:
            text = "".join(stream.step(tokenizer.backend, i) or "" for i in answer.ids)
            ended = end_id is not None and bool(answer.ids) and answer.ids[-1] == end_id
            yield Answer(text, "stop" if ended else None, answer.ids)
    finally:
        await answers.aclose()
