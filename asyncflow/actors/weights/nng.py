"""The nng weight transport: the replica pulls the staged chunks over the actor
transport (``GetLatestWeights``, then ``GetWeightChunk`` per chunk). Tensors travel
as ``dtype, shape, raw bytes`` views of the staged snapshot (no copy on this side).

A tensor larger than a chunk travels cut along its first dimension into pieces of at
most ``chunk_bytes`` (``pieces``), under its own name each; the receiver joins the
consecutive pieces of a name. A chunk's frame is then never much larger than
``chunk_bytes``, whatever the model: a real embedding in float32 (Qwen2.5-7B's:
2.18 GB) sent whole would pass ``max_message_bytes`` (2 GiB), and the replica's
socket would drop every version."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights._base import NamedTensors, WeightReceiver, WeightSender
from asyncflow.core.errors import RemoteError
from asyncflow.core.tensors import nbytes, to_torch, to_wire

if TYPE_CHECKING:
    import torch

NUM_KEPT = 2
"""Versions kept staged: the newest and the one before (a replica may be mid-fetch)."""


def pieces(named_tensors: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Each (name, tensor); one of more than ``chunk_bytes`` as consecutive slices of
    its first dimension (views), each of at most ``chunk_bytes`` (at least one row)."""
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if nbytes <= chunk_bytes or t.dim() == 0 or t.shape[0] < 2:
            yield name, t
            continue
        rows = max(1, chunk_bytes // (nbytes // t.shape[0]))
        for start in range(0, t.shape[0], rows):
            yield name, t[start : start + rows]


def joined(named_pieces: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """The tensors ``pieces`` cut, whole again: consecutive pieces of one name
    concatenated along the first dimension (each tensor as soon as its pieces are in,
    so only one tensor's pieces are held twice at a time)."""
    import torch

    out: list[tuple[str, torch.Tensor]] = []
    parts: list[torch.Tensor] = []
    for name, t in named_pieces:
        if out and out[-1][0] == name:
            parts.append(t)
            continue
        if len(parts) > 1:
            out[-1] = (out[-1][0], torch.cat(parts))
        out.append((name, t))
        parts = [t]
    if len(parts) > 1:
        out[-1] = (out[-1][0], torch.cat(parts))
    return out


class NngSender(WeightSender):
    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes
        self._chunks: dict[int, list[messages.WeightChunk]] = {}
        self._named: dict[int, NamedTensors] = {}  # the snapshots themselves (the chunks are views of them)
        self._ready: dict[int, messages.WeightsReady] = {}
        self._latest = -1
        self.num_bytes_served = 0  # tensor bytes of the chunks served (GetWeightSyncStats)
        self.num_chunks_served = 0

    def publish(self, version: int, named_tensors: NamedTensors, digest: int) -> messages.WeightsReady:
        from asyncflow.engines.base import chunk_by_bytes

        chunks = [
            messages.WeightChunk(version=version, index=i, names=[n for n, _ in chunk], tensors=[to_wire(t) for _, t in chunk])
            for i, chunk in enumerate(chunk_by_bytes(pieces(named_tensors, self.chunk_bytes), self.chunk_bytes))
        ]
        num_bytes = sum(len(t.data) for c in chunks for t in c.tensors)
        self._chunks[version] = chunks
        self._named[version] = list(named_tensors)
        self._ready[version] = messages.WeightsReady(version=version, num_chunks=len(chunks), num_bytes=num_bytes, digest=digest)
        self._latest = max(self._latest, version)
        for old in sorted(self._chunks)[:-NUM_KEPT]:
            self._forget(old)
        return self._ready[version]

    def _forget(self, version: int) -> None:
        del self._chunks[version]
        self._named.pop(version, None)
        self._ready.pop(version, None)

    def latest(self) -> messages.WeightsReady:
        if self._latest < 0:
            return messages.WeightsReady(version=-1, num_chunks=0, num_bytes=0)
        return self._ready[self._latest]

    def serve(self, msg: messages.WeightRequest) -> messages.WeightChunk | messages.WeightStream:
        if not isinstance(msg, messages.GetWeightChunk):
            raise TypeError(
                f"the nng weight transport does not serve {type(msg).__name__}: the replica and the trainer "
                "must use the same [workflow] weight_transport"
            )
        if msg.version not in self._chunks:
            raise KeyError(f"weights v{msg.version} are no longer staged (latest v{self._latest}); fetch the latest")
        chunk = self._chunks[msg.version][msg.index]
        self.num_chunks_served += 1
        self.num_bytes_served += sum(nbytes(t) for t in chunk.tensors)
        return chunk


class NngReceiver(WeightReceiver):
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s  # of each chunk

    def fetch(
        self, weights, on_chunk: Callable[[int], None] | None = None, announced: messages.WeightsReady | None = None
    ) -> tuple[int, NamedTensors]:
        if announced is not None and announced.num_chunks > 0:
            try:
                return self._fetch(weights, announced, on_chunk)
            except RemoteError:  # no longer staged (the trainer moved two versions on): fetch the latest
                pass
        return self._fetch(weights, weights.ask(messages.GetLatestWeights(), timeout_s=30), on_chunk)

    def _fetch(self, weights, latest: messages.WeightsReady, on_chunk: Callable[[int], None] | None) -> tuple[int, NamedTensors]:
        def received():
            for i in range(latest.num_chunks):
                chunk = weights.ask(messages.GetWeightChunk(version=latest.version, index=i), timeout_s=self.timeout_s)
                yield from ((n, to_torch(t)) for n, t in zip(chunk.names, chunk.tensors))
                if on_chunk is not None:
                    on_chunk(i)

        return latest.version, joined(received())
