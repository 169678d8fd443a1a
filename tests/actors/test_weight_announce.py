"""A version's announcement (``WeightsReady`` from the ``weights`` actor to every replica
the roster names) is not held up by replicas that are gone. Found by tests/chaos/
test_chaos_scale.py: with a pack of 32 replicas killed, each Publish told the dead ones in
turn, about 3 s each (a tell to the dead address, then a lookup of a name no longer
registered), 96 s per version; the weights actor answered nothing else meanwhile, and the
restarted replicas' GetLatestWeights timed out. Live replicas get the same announcements
as before: every version, in order."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from asyncflow.actors.driver.roster import RosterActor
from asyncflow.actors.runtime import messages
from asyncflow.actors.weights.actor import Publish, WeightSyncActor
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.core.actor import Actor, serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.transport import TransportConfig


class Listening(Actor):
    """A live replica, as far as announcements go: it records each WeightsReady."""

    Inbox = messages.LoopIn
    heard: dict[str, list[int]] = {}
    lock = threading.Lock()

    def handle(self, msg, pending):
        if isinstance(msg, messages.WeightsReady):
            with Listening.lock:
                Listening.heard.setdefault(self.ctx.name, []).append(msg.version)
        return protocol.Ok()


@pytest.mark.timeout(120)
def test_replicas_that_are_gone_do_not_hold_up_the_announcement_to_the_live_ones(tmp_path):
    transport = TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    live = [f"rollout.{i}" for i in range(4)]
    unregistered = [f"rollout.{i}" for i in range(4, 10)]  # dead, their names removed (the driver's requeue)
    stale = [f"rollout.{i}" for i in range(10, 16)]  # dead, still registered at an address nobody serves
    roster = live + unregistered + stale
    served = []
    try:
        Listening.heard = {}
        for name in live:
            served.append(serve_actor(Listening, name, transport, directory_address=directory.address))
            dc.register(served[-1].entry())
        for name in stale:
            dc.register(protocol.ActorEntry(name=name, address=f"ipc://{tmp_path}/{name}-gone.sock"))
        served.append(
            serve_actor(RosterActor, names.ROSTER, transport, directory_address=directory.address, replicas=lambda: roster)
        )
        dc.register(served[-1].entry())
        weights = serve_actor(
            WeightSyncActor,
            names.WEIGHTS,
            transport,
            directory_address=directory.address,
            run_dir=bench_run_dir(str(tmp_path)),
            replicas=[],
        )
        served.append(weights)
        dc.register(weights.entry())
        took = []
        for version in (1, 2):
            began = time.monotonic()
            weights.pykka_ref.ask(Publish(version, [("w", torch.full((4,), float(version)))], version), timeout=60)
            took.append(time.monotonic() - began)
        # one tell's timeout and one lookup at most per version (about 3 s), not one per dead replica in turn (36 s)
        assert max(took) < 8.0, took
        assert Listening.heard == {name: [1, 2] for name in live}
        assert dc.ref(names.WEIGHTS).ask(messages.GetLatestWeights(), timeout_s=5).version == 2
    finally:
        for actor in reversed(served):
            actor.stop()
        directory.stop()


@pytest.mark.timeout(60)
def test_a_dead_replicas_swap_grant_and_its_place_in_line_go_to_the_live_ones(tmp_path):
    """Found by tests/chaos/test_chaos_scale.py: a replica of the killed pack held the swap grant
    (or was next in line for it), so the 224 live replicas waited in AcquireSwap, the trainer's
    checkpoint waited for them to pause, and the run stalled. The driver tells the weight sync of
    each dead replica (``ReplicaRemoved(dead=True)``): its grant and its waiting asks are dropped;
    it stays a replica (its restart comes back under its name)."""
    transport = TransportConfig(scheme="inproc")
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    weights = serve_actor(
        WeightSyncActor,
        names.WEIGHTS,
        transport,
        directory_address=directory.address,
        run_dir=bench_run_dir(str(tmp_path), substep_updates=True),
        replicas=["rollout.0", "rollout.1", "rollout.2", "rollout.3"],
    )
    dc.register(weights.entry())
    line = weights.pykka_ref._actor_weakref()._swap_queue  # the asks waiting for the grant, read to order them (not changed)
    granted: dict[str, threading.Event] = {}
    ended: dict[str, str] = {}  # how an ask that was never granted ended (the dropped one: when the actor stops)

    def acquire(replica: str) -> None:
        granted[replica] = threading.Event()

        def ask():
            try:
                dc.ref(names.WEIGHTS).ask(messages.AcquireSwap(replica=replica, version=1), timeout_s=60)
            except AsyncflowError as exc:
                ended[replica] = type(exc).__name__
                return
            granted[replica].set()

        threading.Thread(target=ask, daemon=True).start()

    try:
        ref = dc.ref(names.WEIGHTS)
        acquire("rollout.0")
        assert granted["rollout.0"].wait(10)
        for n, replica in enumerate(("rollout.1", "rollout.2", "rollout.3"), start=1):  # in line, in this order
            acquire(replica)
            deadline = time.monotonic() + 10
            while len(line) < n and time.monotonic() < deadline:  # this one is in line before the next asks
                time.sleep(0.01)
            assert len(line) == n
        ref.tell(messages.ReplicaRemoved(replica="rollout.1", dead=True))  # dead while waiting in line
        ref.tell(messages.ReplicaRemoved(replica="rollout.0", dead=True))  # dead holding the grant
        assert granted["rollout.2"].wait(10) and not granted["rollout.3"].is_set()
        ref.ask(messages.ReleaseSwap(replica="rollout.2", version=1))
        assert granted["rollout.3"].wait(10) and not granted["rollout.1"].is_set()
    finally:
        weights.stop()
        directory.stop()
    # the dead replica's ask was dropped, never answered: it ends as the actor goes, in the asking thread's hands
    deadline = time.monotonic() + 10
    while "rollout.1" not in ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ended == {"rollout.1": "ActorGone"}
