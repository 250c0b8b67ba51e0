"""One cpu-reference model split over processes: pipeline-parallel stages exchanging activations
with torch.distributed over gloo, one stage per rank of an MPI world (launch.py starts them).

Rank r runs layers stage_layers(r) and keeps the KV cache of those only. Rank 0 (the llmapi model
inside rank 0's tritonserver) embeds the tokens, runs its layers and sends the hidden states on;
each rank runs its own and passes them to the next; the last applies the final norm and the LM head
and sends the logits back to rank 0, which samples. Before each step rank 0 broadcasts what the
step is (a new batch's prompts, or the tokens its sequences advance with), so every stage mirrors
the same batch. Rank 0 decodes one batch at a time (engine.CpuLLM), so one batch is in flight.

The ranks meet at a TCPStore on rank 0, port LLMOP_PIPELINE_PORT (default DEFAULT_PORT): the
other ranks reach it at their pod's LLMOP_LEADER_HOST (LWS: LWS_LEADER_ADDRESS), the address the
operator gives worker pods for the leader.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroupGloo, TCPStore

from llm_operator.runtime.cpu_reference.tiny_lm import Batch, Decoder

PORT_ENV = "LLMOP_PIPELINE_PORT"
# The world's size, as launch.py hands it to rank 0's tritonserver (whose MPI variables it clears).
WORLD_ENV = "LLMOP_PIPELINE_WORLD"
DEFAULT_PORT = 29500  # torch.distributed's usual MASTER_PORT
# How long rank 0 waits for the others to join, and any rank for a step's tensors: a stage that
# stops answering fails its requests instead of hanging them (mpirun then ends the world).
TIMEOUT = timedelta(seconds=300)
START, ADVANCE, STOP = 1, 2, 3


def stage_layers(layers: int, rank: int, world: int) -> range:
    """Rank `rank`'s consecutive layers, the first `layers % world` ranks taking one more."""
    if not 0 < world <= layers:
        raise ValueError(f"{layers} layers cannot be split into {world} pipeline stages")
    base, extra = divmod(layers, world)
    first = rank * base + min(rank, extra)
    return range(first, first + base + (rank < extra))


def leader_host(environ: Mapping[str, str]) -> str:
    host = environ.get("LLMOP_LEADER_HOST") or environ.get("LWS_LEADER_ADDRESS")
    if not host:
        raise ValueError("LLMOP_LEADER_HOST is not set: a pipeline stage cannot find rank 0")
    return host


def port(environ: Mapping[str, str]) -> int:
    return int(environ.get(PORT_ENV) or DEFAULT_PORT)


class Link:
    """This rank's gloo group (its own, not torch.distributed's default one)."""

    def __init__(self, rank: int, world: int, host: str, port: int) -> None:
        self.rank, self.world = rank, world
        # Rank 0's store listens on every address; its own client reaches it locally.
        self._store = TCPStore(host, port, world, rank == 0, timeout=TIMEOUT)
        self._group = ProcessGroupGloo(self._store, rank, world, TIMEOUT)

    @property
    def last(self) -> bool:
        return self.rank == self.world - 1

    def send(self, tensor: torch.Tensor, to: int) -> None:
        self._group.send([tensor.contiguous()], to, 0).wait()

    def receive(self, shape: Sequence[int], dtype: torch.dtype, source: int) -> torch.Tensor:
        tensor = torch.empty(*shape, dtype=dtype)
        self._group.recv([tensor], source, 0).wait()
        return tensor

    def _broadcast(self, tensor: torch.Tensor) -> torch.Tensor:
        self._group.broadcast(tensor, 0).wait()
        return tensor

    def command(self, op: int, rows: torch.Tensor | None = None) -> None:
        """Rank 0: the next step for every stage, with its int64 [B, W] payload."""
        shape = (0, 0) if rows is None else tuple(rows.shape)
        self._broadcast(torch.tensor([op, *shape], dtype=torch.int64))
        if rows is not None:
            self._broadcast(rows.to(torch.int64).contiguous())

    def next_command(self) -> tuple[int, torch.Tensor]:
        """The other ranks: rank 0's next step."""
        op, rows, width = (int(v) for v in self._broadcast(torch.zeros(3, dtype=torch.int64)))
        payload = torch.zeros(rows, width, dtype=torch.int64)
        return op, self._broadcast(payload) if rows else payload

    def share(self, value: dict[str, Any]) -> dict[str, Any]:
        """Rank 0's `value`, on every rank."""
        data = json.dumps(value).encode() if self.rank == 0 else b""
        size = int(self._broadcast(torch.tensor([len(data)], dtype=torch.int64)))
        buffer = torch.tensor(list(data), dtype=torch.uint8) if data else torch.zeros(size, dtype=torch.uint8)
        shared: dict[str, Any] = json.loads(bytes(self._broadcast(buffer).tolist()))
        return shared

    def stop(self) -> None:
        """Rank 0: the other stages' loops end."""
        self.command(STOP)


def _prompt_rows(prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """[B, 1 + W]: each prompt's length, then the prompt left-padded to the longest."""
    width = max(len(p) for p in prompts)
    return torch.tensor([[len(p), *([0] * (width - len(p))), *p] for p in prompts])


def _prompts(rows: torch.Tensor) -> list[list[int]]:
    return [row[row.shape[0] - int(row[0]) :].tolist() for row in rows]


class LeaderBatch(Batch):
    """Rank 0's batch: the first stage, whose logits come back from the last."""

    def __init__(self, lm: Decoder, prompts: Sequence[Sequence[int]], link: Link) -> None:
        self.link = link
        link.command(START, _prompt_rows(prompts))
        super().__init__(lm, prompts, stage_layers(len(lm.layers), 0, link.world))

    def advance(self, tokens: Sequence[int]) -> None:
        self.link.command(ADVANCE, torch.tensor([tokens]))
        super().advance(tokens)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.link.send(self.run_layers(self.lm.embed[ids], positions), 1)
        return self.link.receive((ids.shape[0], self.lm.lm_head.shape[1]), self.lm.dtype, self.link.world - 1)


class StageBatch(Batch):
    """A later rank's batch: hidden states in from the rank before, out to the next (or logits to
    rank 0 from the last)."""

    def __init__(self, lm: Decoder, prompts: Sequence[Sequence[int]], link: Link) -> None:
        self.link = link
        super().__init__(lm, prompts, stage_layers(len(lm.layers), link.rank, link.world))

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.link.receive((*ids.shape, self.lm.config.hidden), self.lm.dtype, self.link.rank - 1)
        x = self.run_layers(x, positions)
        if self.link.last:
            self.link.send(self.head(x), 0)
        else:
            self.link.send(x, self.link.rank + 1)
        return torch.empty(0)  # only rank 0 picks tokens


class LeaderDecoder(Decoder):
    """The model as rank 0 serves it: the same decoder (weights, vocabulary, end token), whose
    batches run split over the pipeline."""

    def __init__(self, inner: Decoder, link: Link) -> None:
        for name in Decoder.__annotations__:
            setattr(self, name, getattr(inner, name))
        stage_layers(len(self.layers), 0, link.world)  # refuse a split the model cannot take
        self.link = link

    def start(self, prompts: Sequence[Sequence[int]]) -> Batch:
        return LeaderBatch(self, prompts, self.link)


def serve_stage(lm: Decoder, link: Link) -> None:
    """A later rank's loop: mirror each of rank 0's batches on this stage's layers until it stops."""
    batch: Batch | None = None
    while True:
        op, rows = link.next_command()
        if op == STOP:
            return
        if op == START:
            batch = StageBatch(lm, _prompts(rows), link)
        elif op == ADVANCE and batch is not None:
            batch.advance(rows[0].tolist())


def lead(lm: Decoder, world: int, identity: dict[str, Any], environ: Mapping[str, str]) -> LeaderDecoder:
    """Rank 0: wait for the other stages, tell them which model to load (`identity`: served.load's
    arguments), and serve `lm` split over them."""
    link = Link(0, world, "127.0.0.1", port(environ))
    link.share(identity)
    return LeaderDecoder(lm, link)
