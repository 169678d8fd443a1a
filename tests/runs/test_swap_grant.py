"""The swap grant (AcquireSwap, ReleaseSwap: replicas swap one at a time) is asked for
only where replicas take turns: async, and the version announced to more than one
replica (actors/rollout/inbox.py ``swap_grant_needed``, actors/weights/actor.py)."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

from asyncflow.actors.driver.roster import RosterActor
from asyncflow.actors.rollout.inbox import swap_grant_needed
from asyncflow.actors.runtime import messages
from asyncflow.actors.weights.actor import Publish, WeightSyncActor
from asyncflow.bench.weights import bench_run_dir
from asyncflow.config.names import ROSTER, WEIGHTS
from asyncflow.core import protocol
from asyncflow.core.actor import Actor, serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.transport import TransportConfig


def _ready(replicas: int) -> messages.WeightsReady:
    return messages.WeightsReady(version=3, num_chunks=1, num_bytes=4, replicas=replicas)


@pytest.mark.timeout(10)
def test_the_grant_is_asked_for_only_where_replicas_take_turns():
    assert swap_grant_needed(1, _ready(2)) and swap_grant_needed(2, _ready(5))
    assert not swap_grant_needed(1, _ready(1))  # alone: nobody to keep generating while it swaps
    assert swap_grant_needed(1, _ready(0)) and swap_grant_needed(1, None)  # unknown: ask
    assert not swap_grant_needed(0, _ready(2)) and not swap_grant_needed(0, None)  # sync: every replica waits anyway


class _Replica(Actor):
    """Stands for a rollout replica: records the WeightsReady it is told."""

    Inbox = messages.WeightsReady
    told: list[messages.WeightsReady] = []
    changed = threading.Condition()

    def handle(self, msg, pending):
        with self.changed:
            self.told.append(msg)
            self.changed.notify_all()
        return protocol.Ok()

    @classmethod
    def wait_told(cls, n: int) -> list[messages.WeightsReady]:
        """The first ``n`` announcements, once handled (a tell returns on receipt, before the handler ran)."""
        with cls.changed:
            assert cls.changed.wait_for(lambda: len(cls.told) >= n, timeout=10), cls.told
            return list(cls.told[:n])


@pytest.mark.timeout(60)
def test_each_announcement_goes_to_the_replicas_the_roster_lists_and_says_how_many(tmp_path):
    transport = TransportConfig(scheme="inproc")
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    replicas = [serve_actor(_Replica, name, transport, directory_address=directory.address) for name in ("r.0", "r.1")]
    for r in replicas:
        dc.register(r.entry())
    listed = ["r.0"]  # the Supervisor's record, as the driver's roster answers it
    roster = serve_actor(RosterActor, ROSTER, transport, directory_address=directory.address, replicas=lambda: list(listed))
    dc.register(roster.entry())
    weights = serve_actor(
        WeightSyncActor,
        WEIGHTS,
        transport,
        directory_address=directory.address,
        run_dir=bench_run_dir(str(tmp_path), substep_updates=True),
        replicas=[],  # the replicas at start: only used where the roster does not answer
        chunk_bytes=1 << 10,
    )
    dc.register(weights.entry())
    try:
        weights.pykka_ref.ask(Publish(1, [("w", torch.zeros(4))], 0))
        assert [(m.version, m.replicas) for m in _Replica.wait_told(1)] == [(1, 1)]
        listed.append("r.1")  # the planner added a replica: nothing else is told
        weights.pykka_ref.ask(Publish(2, [("w", torch.ones(4))], 0))
        assert sorted((m.version, m.replicas) for m in _Replica.wait_told(3)[1:]) == [(2, 2), (2, 2)]
        assert dc.ref(WEIGHTS).ask(messages.GetLatestWeights()).replicas == 0  # not an announcement: unknown
        # the driver's roster gone (a frozen or dead driver): the last answer, not the replicas at start
        roster.stop()
        dc.unregister(ROSTER)
        weights.pykka_ref.ask(Publish(3, [("w", torch.ones(4))], 0))
        assert sorted((m.version, m.replicas) for m in _Replica.wait_told(5)[3:]) == [(3, 2), (3, 2)]
    finally:
        weights.stop()
        roster.stop()
        for r in replicas:
            r.stop()
        directory.stop()


def _rollout_spans(run_dir, replica: str) -> set[str]:
    trace = json.loads((run_dir / "trace.json").read_text())
    pid = next(
        e["pid"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e.get("name") == "process_name" and e["args"]["name"].startswith(replica)
    )
    return {e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == pid}


@pytest.mark.slow  # whole runs, about 20 s each (the rule and the announcements are checked above in the default suite)
@pytest.mark.timeout(200)
@pytest.mark.parametrize("num_replicas", [1, 2])
def test_an_async_replica_alone_swaps_without_the_grant(tmp_path, num_replicas):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path, mode="async", num_steps=6, staleness=1, changes={"rollout": {"num_replicas": num_replicas}})
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == 6 and all(m["weights_mismatch"] == 0 and m["staleness_max"] <= 1 for m in metrics), metrics
    assert_trained_exactly_once(run_dir, 6, 2, 2)
    spans = _rollout_spans(run_dir, "rollout.0")
    assert "swap_weights" in spans, spans
    # "wait_swap" is the replica's wait for the grant: none when alone, one per swap with two replicas
    assert ("wait_swap" in spans) == (num_replicas > 1), spans
