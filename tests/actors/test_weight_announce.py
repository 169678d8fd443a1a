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

from asyncflow.actors import messages
from asyncflow.actors.roster import RosterActor
from asyncflow.actors.weight_sync import Publish, WeightSyncActor
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.core.actor import Actor, serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
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
