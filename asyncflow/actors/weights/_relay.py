"""Weight fan-out through the replicas (``[workflow] weight_fanout = "tree"``).

With direct fan-out every replica pulls the whole version from the ``weights`` actor:
the trainer's side serves one copy per replica. With the tree, replicas relay it:

- **Layout** (``tree_sources``): the ``weights`` actor is the root of a tree of degree
  d over the replicas in roster order (heap order: replica i is node i + 1, its parent
  node ``i // d``; node 0 is the root). Each replica's ``WeightsReady`` names its
  ``sources``: its parent's relay, then each ancestor's up the tree (at most
  ``MAX_SOURCES``); the root is the last source of all. The first d replicas have
  none: they pull from the root, which so serves d copies per version whatever the
  number of replicas.
- **Relay** (``RelayActor``, registered as ``relay.<replica>`` in the replica's
  process): serves ``RelayChunk`` from the chunks its replica has received so far.
  A chunk not in yet is held (up to ``HOLD_S``) and answered the moment it arrives:
  chunk-pipelined, so a version reaches depth D after about (chunks + D) chunk times,
  not D whole-version times. The chunks are the received frames themselves (no
  copy to keep them), for the ``NUM_KEPT`` newest versions.
- **Receiver** (``RelayReceiver``, the replica's ``WeightReceiver``): pulls each chunk
  from its first live source and hands it to its own relay. A source that does not
  answer within ``source_timeout_s`` (dead, frozen, restarted without the version),
  or says the version is not coming (``RelayWait(coming=False)``), or keeps it
  waiting longer than the sources above it could take (``timeout_s`` each, and one
  more), is left for the rest of that version: the next chunk
  comes from the next source up, at worst the root. Only the root failing fails the
  fetch (retried at the next announcement, as with direct fan-out).

What does not change: announcements (``WeightsReady`` from the ``weights`` actor to
every replica), the swap grant, and version integrity: the chunks are the trainer's
bytes, forwarded unchanged, and the replica checks the weights it loads against the
digest the trainer published (``rollout/inbox.py``).

Invariants:
- A relay only ever serves chunks it received whole for that (version, index): a
  version's bytes are the same at every replica.
- Every wait is bounded: a held request is answered within ``HOLD_S``; a source is
  given ``source_timeout_s`` per ask and, while it answers that the chunk is coming,
  ``timeout_s`` per source left above it, and one more, before the receiver moves up
  the tree (so a live parent that is itself falling back keeps its children). A dead
  or frozen relay never hangs its subtree.
- The relay actor's state (``RelayStore``) is touched by its own thread only: the
  receiver's fetch thread tells it what arrived (in-process messages), it never
  sends a reply itself.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights._base import NamedTensors, WeightReceiver
from asyncflow.actors.weights._link import EmulatedLink
from asyncflow.actors.weights.nng import joined
from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor, Pending, serve_actor
from asyncflow.core.errors import AsyncflowError, RemoteError
from asyncflow.core.tensors import nbytes, to_torch

log = logging.getLogger(__name__)

RELAY_PREFIX = "relay."
HOLD_S = 1.0
"""How long a relay holds a request for a chunk it does not have before it answers
``RelayWait`` (so the asker knows the relay is alive)."""
SOURCE_TIMEOUT_S = 5.0
"""A source that answers nothing within this (it holds a request ``HOLD_S`` at most,
then a chunk's transfer) is dead or frozen: the receiver moves up the tree."""
NUM_KEPT = 2
"""Versions a relay keeps: the newest and the one before (a child may be mid-fetch)."""
MAX_SOURCES = 8
"""Ancestors named in an announcement (a chain of degree 1 would name every replica
before it); past them the root."""


def relay_name(replica: str) -> str:
    """The directory name of ``replica``'s relay: ``relay.rollout.3``."""
    return f"{RELAY_PREFIX}{replica}"


def tree_sources(replicas: list[str], degree: int) -> dict[str, list[str]]:
    """Each replica's sources in the tree of ``degree`` over ``replicas`` (in order): its
    ancestors' relay names, nearest first, at most ``MAX_SOURCES`` (the root, the
    ``weights`` actor, is not named: it is every replica's last source)."""
    if degree < 1:
        raise ValueError(f"a fan-out tree needs degree >= 1, not {degree}")
    out: dict[str, list[str]] = {}
    for i, name in enumerate(replicas):
        chain: list[str] = []
        node = i + 1
        while len(chain) < MAX_SOURCES:
            node = (node - 1) // degree
            if node == 0:
                break
            chain.append(relay_name(replicas[node - 1]))
        out[name] = chain
    return out


def tree_levels(replicas: list[str], degree: int) -> list[list[str]]:
    """The replicas by depth in the tree of ``degree`` over ``replicas`` (in order): the
    root's children first, then theirs, ... Every replica's parent is in the level before
    its own (what the weights actor announces a level at a time: a parent hears of a
    version before its children ask it for the chunks)."""
    if degree < 1:
        raise ValueError(f"a fan-out tree needs degree >= 1, not {degree}")
    levels: list[list[str]] = []
    for i, name in enumerate(replicas):
        depth, node = 0, i + 1
        while (node := (node - 1) // degree) != 0:
            depth += 1
        while len(levels) <= depth:
            levels.append([])
        levels[depth].append(name)
    return levels


# -- the relay's state: pure, one thread ------------------------------------------------


class RelayStore:
    """The chunks a relay holds, and the requests waiting for chunks not in yet (opaque
    tokens). Pure state, no I/O: the relay actor's thread alone calls it."""

    def __init__(self, num_kept: int = NUM_KEPT):
        self.num_kept = num_kept
        self._chunks: dict[int, list[messages.WeightChunk | None]] = {}
        self._ended: set[int] = set()  # versions whose fetch ended (complete or not): nothing more comes
        self._waiting: dict[tuple[int, int], list] = {}
        self.announced = -1  # the newest version announced to this replica

    def announce(self, version: int) -> None:
        self.announced = max(self.announced, version)

    def begin(self, version: int, num_chunks: int) -> list:
        """The replica starts fetching ``version``; versions past the kept ones are
        dropped. Returns the tokens waiting for chunks of dropped versions."""
        self.announce(version)
        if version not in self._chunks:
            self._chunks[version] = [None] * num_chunks
        self._ended.discard(version)  # (again: a failed fetch of it is being retried)
        dropped: list = []
        for old in sorted(self._chunks)[: -self.num_kept]:
            del self._chunks[old]
            self._ended.discard(old)
            dropped += self._take(old)
        return dropped

    def put(self, chunk: messages.WeightChunk) -> list:
        """A chunk arrived; returns the tokens waiting for it (answer them with it)."""
        chunks = self._chunks.get(chunk.version)
        if chunks is None or not 0 <= chunk.index < len(chunks):
            return []
        chunks[chunk.index] = chunk
        return self._waiting.pop((chunk.version, chunk.index), [])

    def end(self, version: int) -> list:
        """The replica's fetch of ``version`` ended (whole or failed): returns the tokens
        still waiting for its chunks (they will not come)."""
        if version in self._chunks:
            self._ended.add(version)
        return self._take(version)

    def get(self, version: int, index: int) -> messages.WeightChunk | None:
        chunks = self._chunks.get(version)
        return chunks[index] if chunks is not None and 0 <= index < len(chunks) else None

    def coming(self, version: int) -> bool:
        """Whether the chunks of ``version`` this relay lacks may still come: it is
        fetching it, or it was announced it and began nothing newer."""
        if version in self._chunks:
            return version not in self._ended
        return version == self.announced and all(v < version for v in self._chunks)

    def wait(self, version: int, index: int, token) -> None:
        self._waiting.setdefault((version, index), []).append(token)

    def unwait(self, version: int, index: int, token) -> bool:
        """Remove ``token`` (its hold expired); whether it was still waiting."""
        waiting = self._waiting.get((version, index), [])
        if token not in waiting:
            return False
        waiting.remove(token)
        if not waiting:
            self._waiting.pop((version, index), None)
        return True

    def num_waiting(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    def _take(self, version: int) -> list:
        keys = [k for k in self._waiting if k[0] == version]
        return [t for k in keys for t in self._waiting.pop(k)]


# -- the relay actor: the store, served -------------------------------------------------


class _Announce:
    __slots__ = ("version",)

    def __init__(self, version: int):
        self.version = version


class _Begin:
    __slots__ = ("version", "num_chunks")

    def __init__(self, version: int, num_chunks: int):
        self.version, self.num_chunks = version, num_chunks


class _Put:
    __slots__ = ("chunk",)

    def __init__(self, chunk: messages.WeightChunk):
        self.chunk = chunk


class _End:
    __slots__ = ("version",)

    def __init__(self, version: int):
        self.version = version


class GetRelayStats:
    """In-process (tests, bench): ``(num_bytes_served, num_chunks_served, num_waiting)``."""


class RelayActor(Actor):
    """``relay.<replica>``: serves the chunks its replica received to the replica's
    children in the tree. Takes RelayChunk, Ping, Stop (wire); from the replica's
    receiver, in-process: what was announced, begun, received and ended."""

    Inbox = messages.RelayIn

    def __init__(self, ctx, hold_s: float = HOLD_S, num_kept: int = NUM_KEPT, link_mb_s: float = 0.0):
        """``link_mb_s``: an emulated uplink for the chunks served (benchmarks, ``_link.py``); 0: none."""
        super().__init__(ctx)
        self.hold_s = hold_s
        self.store = RelayStore(num_kept)
        self.num_bytes_served = self.num_chunks_served = 0
        self._ids = itertools.count()
        self.link = EmulatedLink.of(link_mb_s)

    def handle(self, msg, pending: Pending | None):
        match msg:
            case messages.RelayChunk(version=version, index=index):
                chunk = self.store.get(version, index)
                if chunk is not None:
                    if self.link is not None and pending is not None:
                        self._send_later(self._served(chunk), pending)
                        return DEFER
                    return self._served(chunk)
                if pending is None or (version <= self.store.announced and not self.store.coming(version)):
                    return messages.RelayWait(version=version, index=index, coming=False)
                # not in yet (or not announced here yet: the announcements race): held until it is, or HOLD_S
                token = (next(self._ids), version, index, pending)
                self.store.wait(version, index, token)
                self.call_later(self.hold_s, lambda: self._expire(token))
                return DEFER
            case _Announce(version=version):
                self.store.announce(version)
            case _Begin(version=version, num_chunks=num_chunks):
                self._answer_wait(self.store.begin(version, num_chunks), coming=False)
            case _Put(chunk=chunk):
                for _, _, _, waiting in self.store.put(chunk):
                    if not waiting.done:
                        self._send_later(self._served(chunk), waiting)
            case _End(version=version):
                self._answer_wait(self.store.end(version), coming=False)
            case GetRelayStats():
                return self.num_bytes_served, self.num_chunks_served, self.store.num_waiting()
            case protocol.Stop():
                return protocol.Ok()
            case _:
                raise TypeError(f"{self.ctx.name} does not handle {type(msg).__name__}")
        return None

    def _expire(self, token) -> None:
        """A held request's ``HOLD_S`` is up (this actor's thread): tell the asker whether to ask again."""
        _, version, index, _ = token
        if self.store.unwait(version, index, token):
            self._answer_wait([token], coming=self.store.coming(version))

    def _served(self, chunk: messages.WeightChunk) -> messages.WeightChunk:
        self.num_chunks_served += 1
        self.num_bytes_served += sum(nbytes(t) for t in chunk.tensors)
        return chunk

    def _send_later(self, chunk: messages.WeightChunk, waiting: Pending) -> None:
        """Answer ``waiting`` with ``chunk``: at once, or once the emulated link has sent it."""
        if self.link is None:
            waiting.resolve(chunk)
        else:
            self.link.send(self, chunk, waiting)

    @staticmethod
    def _answer_wait(tokens: list, coming: bool) -> None:
        for _, version, index, waiting in tokens:
            if not waiting.done:
                waiting.resolve(messages.RelayWait(version=version, index=index, coming=coming))


# -- the replica's side: fetch from the tree, feed the relay ------------------------------


class RelayReceiver(WeightReceiver):
    """Fetches each version from the sources its announcement names (then the root),
    chunk by chunk, and hands every chunk to this replica's relay (``relay``: its
    pykka ref) for the replica's children."""

    def __init__(self, directory, relay, timeout_s: float, source_timeout_s: float = SOURCE_TIMEOUT_S):
        self.directory = directory
        self.relay = relay
        self.timeout_s = timeout_s  # of each chunk, from a source that keeps answering RelayWait
        self.source_timeout_s = min(source_timeout_s, timeout_s)  # of each ask
        self._stale: set[str] = set()  # sources that failed: looked up afresh (a restart moves them)
        self.num_bytes_from_root = 0
        self.num_bytes_relayed = 0  # received from relays
        self.num_fallbacks = 0  # sources left mid-version
        self._announced: messages.WeightsReady | None = None  # the newest announcement (its sources)

    def announce(self, msg: messages.WeightsReady) -> None:
        if self._announced is None or msg.version > self._announced.version:
            self._announced = msg  # (listener thread: one reference, swapped whole)
        self.relay.tell(_Announce(msg.version))

    def counters(self) -> dict[str, float]:
        """Bytes this replica received from the root and from relays; sources it left mid-version."""
        return {
            "weights/bytes_from_root": float(self.num_bytes_from_root),
            "weights/bytes_relayed": float(self.num_bytes_relayed),
            "weights/relay_fallbacks": float(self.num_fallbacks),
        }

    def fetch(
        self, weights, on_chunk: Callable[[int], None] | None = None, announced: messages.WeightsReady | None = None
    ) -> tuple[int, NamedTensors]:
        if announced is not None and announced.num_chunks > 0:
            try:
                return self._fetch(weights, announced, announced.sources, on_chunk)
            except RemoteError:  # the root no longer stages it (the trainer moved two versions on): the latest
                pass
        latest = weights.ask(messages.GetLatestWeights(), timeout_s=30)
        newest = self._announced  # the latest through the tree too, where it was announced here
        return self._fetch(weights, latest, newest.sources if newest and newest.version == latest.version else [], on_chunk)

    def _fetch(self, weights, ready: messages.WeightsReady, sources: list[str], on_chunk) -> tuple[int, NamedTensors]:
        version = ready.version
        self.relay.tell(_Begin(version, ready.num_chunks))
        chain: list[str | None] = [*sources, None]  # None: the root
        at = 0

        def received():
            nonlocal at
            for i in range(ready.num_chunks):
                chunk, at = self._chunk(weights, chain, at, version, i)
                self.relay.tell(_Put(chunk))
                yield from ((n, to_torch(t)) for n, t in zip(chunk.names, chunk.tensors))
                if on_chunk is not None:
                    on_chunk(i)

        try:
            return version, joined(received())
        finally:
            self.relay.tell(_End(version))

    def _chunk(self, weights, chain: list[str | None], at: int, version: int, index: int) -> tuple[messages.WeightChunk, int]:
        """Chunk ``index`` from the first source from ``chain[at]`` on that has it; the
        position of that source (the next chunk starts there)."""
        while True:
            name = chain[at]
            if name is None:
                chunk = weights.ask(messages.GetWeightChunk(version=version, index=index), timeout_s=self.timeout_s)
                self.num_bytes_from_root += sum(nbytes(t) for t in chunk.tensors)
                return chunk, at
            # a live relay that says the chunk is coming is fetching it from the sources above it, each
            # bounded by timeout_s: it is given as long as they could take, and one timeout_s more
            got = self._from_relay(name, version, index, patience_s=(len(chain) - at) * self.timeout_s)
            if got is not None:
                self.num_bytes_relayed += sum(nbytes(t) for t in got.tensors)
                return got, at
            self.num_fallbacks += 1
            at += 1

    def _from_relay(self, name: str, version: int, index: int, patience_s: float) -> messages.WeightChunk | None:
        """The chunk from relay ``name``, or None where it cannot give it (gone, frozen,
        not fetching this version, or still without it after ``patience_s``)."""
        deadline = time.monotonic() + patience_s
        try:
            ref = self.directory.ref(name, wait_s=0.0, refresh=name in self._stale)
            self._stale.discard(name)
            while True:
                reply = ref.ask(messages.RelayChunk(version=version, index=index), timeout_s=self.source_timeout_s)
                if isinstance(reply, messages.WeightChunk):
                    return reply
                if not reply.coming or time.monotonic() > deadline:
                    why = "it will not have it" if not reply.coming else f"not in after {patience_s:g} s"
                    log.info("weights v%d chunk %d: relay %s: %s; asking the next source up", version, index, name, why)
                    return None
        except (AsyncflowError, LookupError) as exc:
            self._stale.add(name)
            log.warning("weights v%d chunk %d: relay %s failed (%s); asking the next source up", version, index, name, exc)
            return None


def start_relay(ctx, hold_s: float = HOLD_S, link_mb_s: float = 0.0):
    """Serve ``relay.<ctx.name>`` in this process and register it; returns the served actor."""
    served = serve_actor(
        RelayActor,
        relay_name(ctx.name),
        ctx.transport,
        directory_address=ctx.directory_address,
        hold_s=hold_s,
        link_mb_s=link_mb_s,
    )
    try:
        ctx.directory.register(served.entry())
    except BaseException:
        served.stop()
        raise
    return served


class TreeReceiver(RelayReceiver):
    """A ``RelayReceiver`` that owns its relay actor: started with it, stopped by ``close``."""

    def __init__(
        self, ctx, timeout_s: float, source_timeout_s: float = SOURCE_TIMEOUT_S, hold_s: float = HOLD_S, link_mb_s: float = 0.0
    ):
        # a held request is answered well inside the asker's patience
        self.served = start_relay(ctx, min(hold_s, min(source_timeout_s, timeout_s) / 2), link_mb_s)
        super().__init__(ctx.directory, self.served.pykka_ref, timeout_s, source_timeout_s)

    def relay_stats(self) -> tuple[int, int, int]:
        """``(num_bytes_served, num_chunks_served, num_waiting)`` of this replica's relay."""
        return self.served.pykka_ref.ask(GetRelayStats(), timeout=5.0)

    def counters(self) -> dict[str, float]:
        """``RelayReceiver.counters`` and the bytes this replica's relay served its children."""
        return {**super().counters(), "weights/relay_bytes_served": float(self.relay_stats()[0])}

    def close(self) -> None:
        try:
            self.directory.unregister(self.served.name, address=self.served.address, timeout_s=2.0)
        except Exception as exc:  # noqa: BLE001 - the directory may be gone at shutdown
            log.debug("could not unregister %s: %s", self.served.name, exc)
        self.served.stop()
