"""The collector's trace is streamed to RUN_DIR/trace.json in chunks: the collector
holds at most a chunk of events, each write appends only what is new (the file's
earlier bytes are never rewritten), and the file is a Chrome trace that
``afctl trace`` reads at any moment: memory and the cost of a write stay constant
however long the run."""

from __future__ import annotations

import json

import pytest

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.runtime import messages
from asyncflow.cli.runs import load_trace, timeline, validate_trace
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig

CHUNK = 500


def spans(role: str, pid: int, start_s: float, n: int, version: int) -> messages.Spans:
    names = ["generate" if i % 2 else "wait_data" for i in range(n)]
    return messages.Spans(
        role=role,
        pid=pid,
        names=names,
        starts_s=[start_s + 0.01 * i for i in range(n)],
        durations_s=[0.009] * n,
        versions=[version] * n,
        counters={"version": version},
    )


@pytest.mark.timeout(60)
def test_a_long_run_holds_at_most_a_chunk_of_events_and_only_appends_to_the_trace(tmp_path):
    ctx = ActorContext("collector", TransportConfig(scheme="inproc"))
    c = CollectorActor(ctx, run_dir=str(tmp_path), num_steps=2, progress=False, trace_chunk_events=CHUNK)
    path = tmp_path / "trace.json"
    before = b""
    for k in range(60):  # 60 batches of 200 spans: 12,000 events, 24 chunks
        c.handle(spans(f"rollout.{k % 3}", 100 + k % 3, 1000.0 + 2.0 * k, 200, version=k // 10), None)
        assert len(c.trace_events) < CHUNK
        if path.exists():
            now = path.read_bytes()
            kept = before.rstrip(b"\n]}")
            assert now.startswith(kept)  # appended, never rewritten
            before = now
    c.write_trace(str(path))
    trace = load_trace(path)
    assert validate_trace(trace, max_run_s=1000.0) == []
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == 12_000
    assert list(timeline(trace).tracks) == ["rollout.0", "rollout.1", "rollout.2"]


@pytest.mark.timeout(60)
def test_a_trace_cut_in_the_middle_of_an_append_still_reads_up_to_its_last_whole_event(tmp_path):
    ctx = ActorContext("collector", TransportConfig(scheme="inproc"))
    c = CollectorActor(ctx, run_dir=str(tmp_path), num_steps=2, progress=False, trace_chunk_events=CHUNK)
    c.handle(spans("trainer", 7, 1000.0, 2 * CHUNK, version=0), None)
    path = tmp_path / "trace.json"
    whole = path.read_bytes()
    path.write_bytes(whole.rstrip(b"\n]}") + b',\n{"ph": "X", "name": "gen')  # a reader met a half-written append
    trace = load_trace(path)
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == len(json.loads(whole)["traceEvents"]) - sum(
        1 for e in json.loads(whole)["traceEvents"] if e["ph"] != "X"
    )
