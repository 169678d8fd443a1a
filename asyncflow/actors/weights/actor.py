"""WeightSyncActor: the ``weights`` actor, host-side staging of new policy weights.

Runs in the trainer's process (rank 0), registered as ``weights``. After each step
the trainer hands it a snapshot of the weights (``Publish``, an in-process message:
no copy over a socket); its ``WeightSender`` (``actors/weights/``, chosen once from
``[workflow] weight_transport``) stages it, and this actor tells every rollout
replica ``WeightsReady``. Replicas fetch the bytes in a background thread while
they keep generating (delayed parameter update), then ask ``AcquireSwap`` before
loading them onto their device at a generation boundary.

Constructed like any role actor from an ``ActorSpec``: ``run_dir`` (the config) and
the rollout replicas at start. It keeps no roster of its own: each Publish asks the
driver's ``roster`` (``roster.py``: the Supervisor's record) whom to announce to, so a
replica the online planner adds or removes is in or out of the next announcement; where
the roster does not answer, the last answer (at first, the replicas at start) is used.

With ``[workflow] weight_fanout = "tree"`` each replica's announcement also names its
``sources``, its ancestors in a tree of ``weight_fanout_degree`` over the roster
(``weights/_relay.py``): only the root's children fetch from this actor, the others
from their parent's relay, so this actor serves ``weight_fanout_degree`` copies of a
version whatever the number of replicas.

Takes: Publish (in-process), GetLatestWeights, GetWeightChunk / StreamWeights (served
by the sender), AcquireSwap, ReleaseSwap, ReplicaRemoved (the planner stops a replica:
its grant and channel are released; or the driver handles a replica's death: its grant
and its place in line for it are released), GetWeightSyncStats, Ping, Stop.
Sends: GetReplicas (ask, to the roster); WeightsReady (tell, to each replica, ``ANNOUNCE_THREADS`` at once).

Invariants:
- The bytes of a version never change once published; the two newest versions are
  kept so a replica mid-fetch of the older one can finish.
- With sub-step updates, at most one replica holds the swap grant at a time, so
  generation capacity never drops to zero; otherwise grants are immediate.
"""

from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import msgspec

from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.run_dir import Run
from asyncflow.actors.weights import build_sender, tree_levels, tree_sources
from asyncflow.actors.weights._link import EmulatedLink
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor
from asyncflow.core.errors import AsyncflowError

log = logging.getLogger(__name__)

ROSTER_ASK_S = 2.0
"""How long a Publish waits for the roster's answer (the driver's process; a frozen driver
must not hold the trainer's step: the last answer is used instead)."""
ANNOUNCE_THREADS = 32
"""Announcements in flight at once. A replica that is gone (killed, its death not yet handled
by the driver; restarting at a new address) costs a tell's timeout and a lookup, about 3 s:
told in turn, the 32 replicas of a killed pack (emulated replicas, 32 to a process) held every
version 96 s. Told together, the whole announcement waits about one such timeout at most."""
CHUNK_BYTES = 32 << 20
"""Bytes per chunk (nng: a larger tensor is cut into pieces) or per broadcast (collective: a larger
tensor travels alone)."""


class Publish:
    """In-process (trainer -> weights): stage ``named_tensors``, cpu snapshots the trainer
    will not modify, as ``version`` with weights digest ``digest`` (0: unknown) and
    announce it. The reply is the announcement's ``num_bytes``."""

    __slots__ = ("version", "named_tensors", "digest")

    def __init__(self, version: int, named_tensors: list, digest: int = 0):
        self.version, self.named_tensors, self.digest = version, named_tensors, digest


class WeightSyncActor(Actor):
    Inbox = messages.WeightSyncIn

    def __init__(self, ctx, run_dir: str, replicas: list[str], chunk_bytes: int = CHUNK_BYTES):
        super().__init__(ctx)
        config = Run(run_dir).config
        workflow = config.workflow
        self.link = EmulatedLink.of(workflow.weight_link_mb_s)  # emulation only (weights/_link.py); None: no link
        self.replicas = list(replicas)  # the roster's last answer (the replicas at start until the first)
        self._roster_failed = False  # warned once that the roster does not answer
        self.substep = workflow.substep_updates
        self.fanout, self.fanout_degree = workflow.weight_fanout, workflow.weight_fanout_degree
        self.sender = build_sender(
            workflow.weight_transport,
            ctx,
            chunk_bytes,
            workflow.weight_timeout_s,
            run_dir=run_dir,
            device=config.cluster.device,
        )
        self._holder: str | None = None
        self._swap_queue: deque = deque()
        self._announcers: ThreadPoolExecutor | None = None  # made at the first announcement to several replicas

    def _roster(self) -> list[str]:
        """The rollout replicas now, from the driver's roster; the last answer where it
        cannot answer (warned once, and once more when it answers again)."""
        try:
            ref = self.ctx.directory.ref(names.ROSTER, wait_s=0.5)
            self.replicas = ref.ask(messages.GetReplicas(), timeout_s=ROSTER_ASK_S).names
            if self._roster_failed:
                log.info("the roster answers again: %s", self.replicas)
            self._roster_failed = False
        except (AsyncflowError, LookupError) as exc:
            if not self._roster_failed:
                log.warning("the roster did not answer (%s); announcing to the last replicas known: %s", exc, self.replicas)
            self._roster_failed = True
        return self.replicas

    def _announce(self, name: str, ready: messages.WeightsReady) -> None:
        """Tell ``name`` through the directory's cached ref; where that fails (a restarted
        replica has a new address) look it up afresh and tell once more."""
        for refresh in (False, True):
            try:
                self.ctx.directory.ref(name, wait_s=1.0, refresh=refresh).tell(ready, timeout_s=2.0)
                return
            except (AsyncflowError, LookupError) as exc:  # a dead replica fetches the latest when restarted
                if refresh:
                    log.warning(
                        "could not tell %s about weights v%d (a replica still starting or restarting loads the newest "
                        "version once it is up): %s",
                        name,
                        ready.version,
                        exc,
                    )

    def _announce_all(self, todo: list[tuple[str, messages.WeightsReady]]) -> None:
        """Tell replicas their announcements, ``ANNOUNCE_THREADS`` at a time, in roster order;
        returns once every tell is done or given up (each is bounded)."""
        if len(todo) <= 1:
            for name, ready in todo:
                self._announce(name, ready)
            return
        if self._announcers is None:
            self._announcers = ThreadPoolExecutor(ANNOUNCE_THREADS, thread_name_prefix=f"{self.ctx.name}-announce")
        for future in [self._announcers.submit(self._announce, name, ready) for name, ready in todo]:
            future.result()  # _announce contains a replica's failure; anything else is this actor's

    def handle(self, msg, pending):
        match msg:
            case Publish(version=version, named_tensors=named_tensors, digest=digest):
                # each replica learns whether it is alone: one alone swaps without the grant (rollout.py)
                replicas = self._roster()
                ready = msgspec.structs.replace(self.sender.publish(version, named_tensors, digest), replicas=len(replicas))
                sources = tree_sources(replicas, self.fanout_degree) if self.fanout == "tree" else {}
                # the tree: a level at a time, so a parent hears before its children (as when every replica
                # was told in turn); a slow parent (dead, restarting) holds its children as it did then
                for level in tree_levels(replicas, self.fanout_degree) if self.fanout == "tree" else [replicas]:
                    self._announce_all(
                        [
                            (name, msgspec.structs.replace(ready, sources=sources[name]) if sources.get(name) else ready)
                            for name in level
                        ]
                    )
                return ready.num_bytes
            case messages.GetLatestWeights():
                return self.sender.latest()
            case messages.GetWeightChunk() | messages.StreamWeights():
                served = self.sender.serve(msg)
                if self.link is None or pending is None or not isinstance(served, messages.WeightChunk):
                    return served
                self.link.send(self, served, pending)
                return DEFER
            case messages.GetWeightSyncStats():
                return messages.WeightSyncStats(
                    num_bytes_served=self.sender.num_bytes_served, num_chunks_served=self.sender.num_chunks_served
                )
            case messages.AcquireSwap(replica=replica):
                if not self.substep or self._holder in (None, replica):
                    self._holder = replica if self.substep else None
                    return protocol.Ok()
                self._swap_queue.append((replica, pending))
                return DEFER
            case messages.ReleaseSwap(replica=replica):
                self._release(replica)
                return protocol.Ok()
            case messages.ReplicaRemoved(replica=replica, dead=dead):
                if dead:  # its process died: restarted under its name, it asks for the grant anew
                    log.info("%s died: its swap grant and its place in line for it are released", replica)
                else:
                    self.replicas = [r for r in self.replicas if r != replica]  # should the roster not answer next time
                    self.sender.drop_replica(replica)
                self._swap_queue = deque((r, p) for r, p in self._swap_queue if r != replica)
                if self._holder == replica:  # it stopped between AcquireSwap and ReleaseSwap
                    self._release(replica)
                return protocol.Ok()
            case protocol.Stop():
                self._close()
                return protocol.Ok()
            case _:
                raise TypeError(f"{self.ctx.name} does not handle {type(msg).__name__}")

    def _release(self, replica: str) -> None:
        """``replica`` gives the swap grant back: the next one waiting gets it."""
        if self._holder != replica:
            return
        self._holder = None
        while self._swap_queue and self._holder is None:
            nxt, waiting = self._swap_queue.popleft()
            if not waiting.done:
                self._holder = nxt
                waiting.resolve(protocol.Ok())

    def _close(self) -> None:
        self.sender.close()
        if self._announcers is not None:
            self._announcers.shutdown(wait=False, cancel_futures=True)

    def on_stop(self) -> None:
        self._close()
