"""The nng weight transport: the replica pulls the staged chunks over the actor
transport (``GetLatestWeights``, then ``GetWeightChunk`` per chunk). Tensors travel
as ``dtype, shape, raw bytes`` views of the staged snapshot (no copy on this side)."""

from __future__ import annotations

from collections.abc import Callable

from asyncflow.actors.weights._base import NamedTensors, WeightReceiver, WeightSender
from asyncflow.core import protocol
from asyncflow.core.errors import RemoteError
from asyncflow.core.tensors import to_torch, to_wire

NUM_KEPT = 2
"""Versions kept staged: the newest and the one before (a replica may be mid-fetch)."""


class NngSender(WeightSender):
    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes
        self._chunks: dict[int, list[protocol.WeightChunk]] = {}
        self._named: dict[int, NamedTensors] = {}  # the snapshots themselves (the chunks are views of them)
        self._ready: dict[int, protocol.WeightsReady] = {}
        self._latest = -1

    def publish(self, version: int, named_tensors: NamedTensors, digest: int) -> protocol.WeightsReady:
        from asyncflow.engines.base import chunk_by_bytes

        chunks = [
            protocol.WeightChunk(version=version, index=i, names=[n for n, _ in chunk], tensors=[to_wire(t) for _, t in chunk])
            for i, chunk in enumerate(chunk_by_bytes(named_tensors, self.chunk_bytes))
        ]
        num_bytes = sum(len(t.data) for c in chunks for t in c.tensors)
        self._chunks[version] = chunks
        self._named[version] = list(named_tensors)
        self._ready[version] = protocol.WeightsReady(version=version, num_chunks=len(chunks), num_bytes=num_bytes, digest=digest)
        self._latest = max(self._latest, version)
        for old in sorted(self._chunks)[:-NUM_KEPT]:
            self._forget(old)
        return self._ready[version]

    def _forget(self, version: int) -> None:
        del self._chunks[version]
        self._named.pop(version, None)
        self._ready.pop(version, None)

    def latest(self) -> protocol.WeightsReady:
        if self._latest < 0:
            return protocol.WeightsReady(version=-1, num_chunks=0, num_bytes=0)
        return self._ready[self._latest]

    def serve(self, msg: protocol.WeightRequest) -> protocol.WeightChunk | protocol.WeightStream:
        if not isinstance(msg, protocol.GetWeightChunk):
            raise TypeError(
                f"the nng weight transport does not serve {type(msg).__name__}: the replica and the trainer "
                "must use the same [workflow] weight_transport"
            )
        if msg.version not in self._chunks:
            raise KeyError(f"weights v{msg.version} are no longer staged (latest v{self._latest}); fetch the latest")
        return self._chunks[msg.version][msg.index]


class NngReceiver(WeightReceiver):
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s  # of each chunk

    def fetch(
        self, weights, on_chunk: Callable[[int], None] | None = None, announced: protocol.WeightsReady | None = None
    ) -> tuple[int, NamedTensors]:
        if announced is not None and announced.num_chunks > 0:
            try:
                return self._fetch(weights, announced, on_chunk)
            except RemoteError:  # no longer staged (the trainer moved two versions on): fetch the latest
                pass
        return self._fetch(weights, weights.ask(protocol.GetLatestWeights(), timeout_s=30), on_chunk)

    def _fetch(self, weights, latest: protocol.WeightsReady, on_chunk: Callable[[int], None] | None) -> tuple[int, NamedTensors]:
        tensors: NamedTensors = []
        for i in range(latest.num_chunks):
            chunk = weights.ask(protocol.GetWeightChunk(version=latest.version, index=i), timeout_s=self.timeout_s)
            tensors.extend((n, to_torch(t)) for n, t in zip(chunk.names, chunk.tensors))
            if on_chunk is not None:
                on_chunk(i)
        return latest.version, tensors
