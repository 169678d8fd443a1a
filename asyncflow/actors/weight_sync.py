"""WeightSyncActor: the host-side staging buffer of new policy weights.

Runs in the trainer's process (rank 0), registered as ``weights``. After each
step the trainer hands it a snapshot of the weights (``publish``, an in-process
call: no copy over a socket); it splits them into chunks and tells every rollout
replica ``WeightsReady``. Replicas pull the chunks in a background thread while
they keep generating (delayed parameter update), then ask ``AcquireSwap`` before
loading them onto their device at a generation boundary.

With ``workflow.weight_transport = "collective"`` a replica asks ``StreamWeights``
instead of pulling chunks: the same staged snapshot is broadcast over a two-member
torch.distributed group per replica (``_weight_channel.py``), in a thread per
replica so this actor keeps answering.

Takes: GetLatestWeights, GetWeightChunk, StreamWeights, AcquireSwap, ReleaseSwap,
RegisterReplica, UnregisterReplica (replicas added or removed by the online
planner), Ping, Stop.
Sends: WeightsReady (tell, to each replica), WeightChunk, WeightStream.

Invariants:
- The chunks of a version never change once published; the two newest versions
  are kept so a replica mid-fetch of the older one can finish.
- With sub-step updates, at most one replica holds the swap grant at a time, so
  generation capacity never drops to zero; otherwise grants are immediate.
"""

from __future__ import annotations

import logging
from collections import deque

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.tensors import to_wire

log = logging.getLogger(__name__)

WEIGHTS_NAME = "weights"


class WeightSyncActor(Actor):
    Inbox = protocol.WeightSyncIn

    def __init__(self, ctx, replicas: list[str], substep: bool, chunk_bytes: int = 32 << 20, timeout_s: float = 120.0):
        super().__init__(ctx)
        self.timeout_s = timeout_s  # of each broadcast of the collective channel
        self.replicas = replicas
        self.substep = substep
        self.chunk_bytes = chunk_bytes
        self._versions: dict[int, list[protocol.WeightChunk]] = {}
        self._named: dict[int, list] = {}  # the snapshots themselves (the chunks are views of them)
        self._digests: dict[int, int] = {}  # version -> weights_digest (engines/digest.py), 0 unknown
        self._layouts: dict[int, list[protocol.StreamChunk]] = {}  # collective layout, made on first use
        self._senders: dict = {}  # replica -> its group's rank 0
        self._before_chunk = None  # test hook: called in the sender thread before each chunk
        self._latest = -1
        self._holder: str | None = None
        self._swap_queue: deque = deque()

    # in-process API (called through the pykka proxy by the trainer)
    def publish(self, version: int, named_tensors: list, digest: int = 0) -> int:
        """Stage ``named_tensors`` (cpu snapshots the trainer will not modify) as
        ``version``, whose weights digest is ``digest``; announced with it."""
        from asyncflow.engines.base import chunk_by_bytes

        chunks = [
            protocol.WeightChunk(version=version, index=i, names=[n for n, _ in chunk], tensors=[to_wire(t) for _, t in chunk])
            for i, chunk in enumerate(chunk_by_bytes(named_tensors, self.chunk_bytes))
        ]
        num_bytes = sum(len(t.data) for c in chunks for t in c.tensors)
        self._versions[version] = chunks
        self._named[version] = list(named_tensors)
        self._digests[version] = digest
        self._latest = max(self._latest, version)
        for old in sorted(self._versions)[:-2]:
            del self._versions[old]
            self._named.pop(old, None)
            self._digests.pop(old, None)
            self._layouts.pop(old, None)
        ready = protocol.WeightsReady(version=version, num_chunks=len(chunks), num_bytes=num_bytes, digest=digest)
        for name in self.replicas:
            self._announce(name, ready)
        return num_bytes

    def _announce(self, name: str, ready: protocol.WeightsReady) -> None:
        """Tell ``name`` through the directory's cached ref; where that fails (a restarted
        replica has a new address) look it up afresh and tell once more."""
        for refresh in (False, True):
            try:
                self.ctx.directory.ref(name, wait_s=1.0, refresh=refresh).tell(ready, timeout_s=2.0)
                return
            except (AsyncflowError, LookupError) as exc:  # a dead replica fetches the latest when restarted
                if refresh:
                    log.warning("could not tell %s about weights v%d: %s", name, ready.version, exc)

    def handle(self, msg, pending):
        match msg:
            case protocol.GetLatestWeights():
                if self._latest < 0:
                    return protocol.WeightsReady(version=-1, num_chunks=0, num_bytes=0)
                chunks = self._versions[self._latest]
                return protocol.WeightsReady(
                    version=self._latest, num_chunks=len(chunks), num_bytes=sum(len(t.data) for c in chunks for t in c.tensors),
                    digest=self._digests.get(self._latest, 0),
                )
            case protocol.GetWeightChunk(version=version, index=index):
                if version not in self._versions:
                    raise KeyError(f"weights v{version} are no longer staged (latest v{self._latest}); fetch the latest")
                return self._versions[version][index]
            case protocol.StreamWeights():
                return self._stream(msg)
            case protocol.AcquireSwap(replica=replica):
                if not self.substep or self._holder in (None, replica):
                    self._holder = replica if self.substep else None
                    return protocol.Ok()
                self._swap_queue.append((replica, pending))
                return DEFER
            case protocol.ReleaseSwap(replica=replica):
                if self._holder == replica:
                    self._holder = None
                    while self._swap_queue and self._holder is None:
                        nxt, waiting = self._swap_queue.popleft()
                        if not waiting.done:
                            self._holder = nxt
                            waiting.resolve(protocol.Ok())
                return protocol.Ok()
            case protocol.RegisterReplica(replica=replica):
                if replica not in self.replicas:
                    self.replicas = [*self.replicas, replica]
                return protocol.Ok()
            case protocol.UnregisterReplica(replica=replica):
                self.replicas = [r for r in self.replicas if r != replica]
                if replica in self._senders:
                    self._senders.pop(replica).close()
                self._swap_queue = deque((r, p) for r, p in self._swap_queue if r != replica)
                if self._holder == replica:  # it stopped between AcquireSwap and ReleaseSwap
                    self.handle(protocol.ReleaseSwap(replica=replica, version=-1), None)
                return protocol.Ok()
            case protocol.Stop():
                self._close_senders()
                return protocol.Ok()

    def on_stop(self) -> None:
        self._close_senders()

    def _close_senders(self) -> None:
        for sender in self._senders.values():
            sender.close()
        self._senders.clear()

    def _stream(self, msg: protocol.StreamWeights) -> protocol.WeightStream:
        """Answer with the newest version's layout and start broadcasting it over the
        replica's group (made now if ``msg.group`` is new)."""
        from asyncflow.actors import _weight_channel as channel  # torch: only where the collective is used

        why = channel.unavailable(msg.backend)
        if why:
            return protocol.WeightStream(version=-1, refused=f"{msg.backend} on the trainer's side: {why}")
        if self._latest < 0:
            raise KeyError("no weights published yet")
        sender = self._senders.get(msg.replica)
        if sender is not None and (sender.group != msg.group or sender.failed):
            sender.close()  # the replica gave up on that group (or restarted): a fresh one
            sender = None
        if sender is None:
            sender = channel.StreamSender(self.ctx.directory, self.ctx.transport, msg.replica, msg.group, msg.backend,
                                          timeout_s=self.timeout_s)
            self._senders[msg.replica] = sender
        version = self._latest
        if version not in self._layouts:
            self._layouts[version] = channel.layout(self._named[version], self.chunk_bytes)
        chunks = self._layouts[version]
        sender.start(version, self._named[version], chunks, self._before_chunk)
        return protocol.WeightStream(version=version, chunks=chunks)
