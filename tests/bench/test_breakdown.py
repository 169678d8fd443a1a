"""``afctl bench e2e --breakdown``: phases of an activity reach the trace on their own
lane, leave the busy time, version flows and ``afctl trace`` as they were, and are
summed per role and step; on a real run every role's work shows its phases."""

from __future__ import annotations

import json

import pytest

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.runtime import messages
from asyncflow.bench._breakdown import breakdown, table
from asyncflow.cli.runs import timeline, validate_trace
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig


def _spans(role, pid, spans, final_version):
    return messages.Spans(
        role=role,
        pid=pid,
        names=[s[0] for s in spans],
        starts_s=[s[1] for s in spans],
        durations_s=[s[2] for s in spans],
        versions=[s[3] for s in spans],
        counters={"version": final_version},
    )


@pytest.mark.timeout(30)
def test_phases_go_on_their_own_lane_and_leave_flows_and_busy_time_alone(tmp_path):
    c = CollectorActor(
        ActorContext("collector", TransportConfig(scheme="inproc")), run_dir=str(tmp_path), num_steps=2, progress=False
    )
    # a phase ends before its activity, so it is recorded first (the order SpanRecorder sees)
    c.handle(
        _spans(
            "trainer",
            11,
            [
                ("wait_data", 100.0, 1.0, 0),
                ("train/forward", 101.0, 0.2, 0),
                ("train/backward", 101.2, 0.25, 0),
                ("train", 101.0, 0.5, 0),
                ("sync_weights/export", 101.5, 0.05, 0),
                ("sync_weights", 101.5, 0.1, 0),
                ("wait_data", 101.6, 1.0, 1),
            ],
            1,
        ),
        None,
    )
    c.handle(
        _spans(
            "rollout.0",
            12,
            [("generate/decode_model", 100.0, 0.5, 0), ("generate", 100.0, 1.0, 0), ("swap_weights", 101.8, 0.2, 0)],
            1,
        ),
        None,
    )
    path = tmp_path / "trace.json"
    c.write_trace(str(path))
    trace = json.loads(path.read_text())
    assert validate_trace(trace, max_run_s=10.0) == []
    phases = [e for e in trace["traceEvents"] if e.get("cat") == "phase"]
    assert sorted(e["name"] for e in phases) == [
        "generate/decode_model",
        "sync_weights/export",
        "train/backward",
        "train/forward",
    ]
    assert all(e["tid"] == 1 for e in phases)
    flows = [e for e in trace["traceEvents"] if e["ph"] in ("s", "f")]
    assert len(flows) == 2 and all(e["name"] == "weights v1" for e in flows)  # sync_weights -> swap_weights
    tl = timeline(trace)
    assert [s.name for s in tl.tracks["trainer"]] == ["wait_data", "train", "sync_weights", "wait_data"]
    assert c.last_span["rollout.0"][0] == "swap_weights"

    b = breakdown(trace, num_steps=2)  # ms per step
    t = b["trainer"]
    assert t["busy_ms"] == pytest.approx(300.0) and t["wait_ms"] == pytest.approx(1000.0)
    assert t["phases"]["train/forward"] == pytest.approx(100.0)
    assert t["compute_ms"] == pytest.approx(225.0)  # forward + backward; export is the framework's
    assert t["framework_ms"] == pytest.approx(75.0)
    assert b["rollout.0"]["compute_ms"] == pytest.approx(250.0)
    lines = table({"sync": b, "async": b})
    assert any(line.strip().startswith("forward") for line in lines)


@pytest.mark.timeout(120)
def test_a_real_run_breaks_down_into_the_phases_of_every_role(tmp_path):
    from tiny_config import write_tiny_config

    from asyncflow.actors.driver.launcher import run
    from asyncflow.cli.runs import load_trace
    from asyncflow.config.load import load_config

    path = write_tiny_config(
        tmp_path / "c.toml",
        {"train": {"num_steps": 3, "checkpoint_every": 0}, "workflow": {"mode": "sync"}, "logging": {"progress": False}},
    )
    run(load_config(str(path)), tmp_path / "run")
    b = breakdown(load_trace(tmp_path / "run" / "trace.json"), num_steps=3)
    trainer, rollout = b["trainer"], b["rollout.0"]
    for name in ("train/forward", "train/backward", "train/optimizer", "train/batch", "sync_weights/export"):
        assert trainer["phases"].get(name, 0.0) > 0.0, (name, trainer["phases"])
    # the replica's GetBatch waits in the queue for admissible rows: idle time (wait_data)
    for name in ("generate/prefill_model", "generate/sample", "put/put_round_trip", "wait_data/get_meta"):
        assert rollout["phases"].get(name, 0.0) > 0.0, (name, rollout["phases"])
    assert b["reward.0"]["phases"].get("score/reward_fn", 0.0) > 0.0
    for role in (trainer, rollout):
        assert 0.0 < role["compute_ms"] < role["busy_ms"] and role["framework_ms"] > 0.0
        assert role["cpu_ms"] > 0.0  # the "cpu" counter of its process
