"""The two halves of a weight transport (see the package docstring)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from asyncflow.actors.runtime import messages

NamedTensors = list  # [(name, torch.Tensor)]


def tensor_views(
    flat, names: Sequence[str], dtypes: Sequence[str], shapes: Sequence[Sequence[int]], offsets: Sequence[int]
) -> NamedTensors:
    """Views of the named tensors laid out in the flat byte tensor ``flat`` at ``offsets``
    (no copy): how a collective chunk and a local file are read back."""
    import torch

    out = []
    for name, dtype, shape, off in zip(names, dtypes, shapes, offsets):
        dt = getattr(torch, dtype)
        n = dt.itemsize
        for s in shape:
            n *= s
        out.append((name, flat[off : off + n].view(dt).view(shape)))
    return out


class WeightSender(ABC):
    """The trainer's side: stages published versions and serves their bytes."""

    num_bytes_served: int = 0  # tensor bytes served over nng (GetWeightChunk) so far
    num_chunks_served: int = 0

    @abstractmethod
    def publish(self, version: int, named_tensors: NamedTensors, digest: int) -> messages.WeightsReady:
        """Stage ``named_tensors`` (host copies nobody modifies) as ``version``; return
        the announcement for the replicas."""

    @abstractmethod
    def latest(self) -> messages.WeightsReady:
        """The newest staged version (``version=-1`` before the first publish)."""

    @abstractmethod
    def serve(self, msg: messages.WeightRequest) -> messages.WeightChunk | messages.WeightStream:
        """Answer a replica's request for bytes (a transport's own message)."""

    # Optional hooks, not abstract: a transport that holds nothing per replica or
    # nothing to release (nng) keeps these no-op defaults; the collective one overrides them.
    def drop_replica(self, replica: str) -> None:  # noqa: B027 (optional hook, no-op by default)
        """``replica`` is gone: release what this side holds for it. Optional: the
        default does nothing."""

    def close(self) -> None:  # noqa: B027 (optional hook, no-op by default)
        """Release everything (the weights actor stops). Optional: the default does
        nothing."""


class WeightReceiver(ABC):
    """A replica's side: fetches the newest staged version from the ``weights`` actor."""

    @abstractmethod
    def fetch(
        self, weights, on_chunk: Callable[[int], None] | None = None, announced: messages.WeightsReady | None = None
    ) -> tuple[int, NamedTensors]:
        """``(version, [(name, tensor)])`` of the newest version ``weights`` (an
        ActorRef) holds; ``on_chunk(i)`` after each chunk arrives. ``announced``: the
        newest ``WeightsReady`` the replica was told, which a transport may use instead
        of asking for the latest (a round trip less). Raises on failure (the caller
        retries at the next announcement)."""

    def announce(self, msg: messages.WeightsReady) -> None:  # noqa: B027 (optional hook: only the relay tree listens)
        """``msg`` was announced to this replica (listener thread; return at once). Optional:
        the default does nothing; the relay (``_relay.py``) tells its children a version is coming."""

    def counters(self) -> dict[str, float]:
        """Running totals for the replica's RoleStats (``weights/...``). Optional: none by default."""
        return {}

    def close(self) -> None:  # noqa: B027 (optional hook: nng holds nothing; the collective receiver overrides it)
        """Release what this side holds (groups, buffers). Optional: the default does
        nothing."""
