"""WeightSyncActor: the host-side staging buffer of new policy weights.

Runs in the trainer's process (rank 0), registered as ``weights``. After each
step the trainer hands it a snapshot of the weights (``publish``, an in-process
call: no copy over a socket); it splits them into chunks and tells every rollout
replica ``WeightsReady``. Replicas pull the chunks in a background thread while
they keep generating (delayed parameter update), then ask ``AcquireSwap`` before
loading them onto their device at a generation boundary.

Takes: GetLatestWeights, GetWeightChunk, AcquireSwap, ReleaseSwap, RegisterReplica,
UnregisterReplica (replicas added or removed by the online planner), Ping, Stop.
Sends: WeightsReady (tell, to each replica), WeightChunk.

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

    def __init__(self, ctx, replicas: list[str], substep: bool, chunk_bytes: int = 32 << 20):
        super().__init__(ctx)
        self.replicas = replicas
        self.substep = substep
        self.chunk_bytes = chunk_bytes
        self._versions: dict[int, list[protocol.WeightChunk]] = {}
        self._latest = -1
        self._holder: str | None = None
        self._swap_queue: deque = deque()

    # in-process API (called through the pykka proxy by the trainer)
    def publish(self, version: int, named_tensors: list) -> int:
        """Stage ``named_tensors`` (cpu snapshots the trainer will not modify) as ``version``."""
        from asyncflow.engines.base import chunk_by_bytes

        chunks = [
            protocol.WeightChunk(version=version, index=i, names=[n for n, _ in chunk], tensors=[to_wire(t) for _, t in chunk])
            for i, chunk in enumerate(chunk_by_bytes(named_tensors, self.chunk_bytes))
        ]
        num_bytes = sum(len(t.data) for c in chunks for t in c.tensors)
        self._versions[version] = chunks
        self._latest = max(self._latest, version)
        for old in sorted(self._versions)[:-2]:
            del self._versions[old]
        ready = protocol.WeightsReady(version=version, num_chunks=len(chunks), num_bytes=num_bytes)
        for name in self.replicas:
            try:
                # fresh lookup: a restarted replica has a new address
                self.ctx.directory.ref(name, wait_s=1.0, refresh=True).tell(ready, timeout_s=2.0)
            except (AsyncflowError, LookupError) as exc:  # a dead replica fetches the latest when restarted
                log.warning("could not tell %s about weights v%d: %s", name, version, exc)
        return num_bytes

    def handle(self, msg, pending):
        match msg:
            case protocol.GetLatestWeights():
                if self._latest < 0:
                    return protocol.WeightsReady(version=-1, num_chunks=0, num_bytes=0)
                chunks = self._versions[self._latest]
                return protocol.WeightsReady(
                    version=self._latest, num_chunks=len(chunks), num_bytes=sum(len(t.data) for c in chunks for t in c.tensors)
                )
            case protocol.GetWeightChunk(version=version, index=index):
                if version not in self._versions:
                    raise KeyError(f"weights v{version} are no longer staged (latest v{self._latest}); fetch the latest")
                return self._versions[version][index]
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
                self._swap_queue = deque((r, p) for r, p in self._swap_queue if r != replica)
                if self._holder == replica:  # it stopped between AcquireSwap and ReleaseSwap
                    self.handle(protocol.ReleaseSwap(replica=replica, version=-1), None)
                return protocol.Ok()
            case protocol.Stop():
                return protocol.Ok()
