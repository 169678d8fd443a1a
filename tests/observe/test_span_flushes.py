"""A role's span recorder tells the collector only when it has something to say: new
spans, a changed counter, or its keepalive (the process's CPU so far) being due; a role
busy in one long call sends nothing in between. Real collector, served over inproc."""

from __future__ import annotations

import json

import pytest

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.spans import SpanRecorder
from asyncflow.core.actor import serve_actor
from asyncflow.core.ref import ActorRef
from asyncflow.core.transport import TransportConfig

pytestmark = pytest.mark.timeout(60)


def _cpu_counters(ref: ActorRef, path) -> list[dict]:
    """The "cpu" counter events of the trace: one per Spans message the collector took."""
    ref.ask(messages.WriteTrace(path=str(path)))  # answered after the tells before it
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "C" and e.get("name") == "cpu"]


@pytest.fixture
def collector(tmp_path):
    transport = TransportConfig(scheme="inproc")
    served = serve_actor(CollectorActor, "collector", transport, run_dir=str(tmp_path), num_steps=2, progress=False)
    try:
        yield ActorRef("collector", served.address, transport)
    finally:
        served.stop()


def test_flushes_without_new_spans_send_nothing_until_the_keepalive(collector, tmp_path):
    rec = SpanRecorder("rollout.0", collector, flush_s=3600, enabled=True, keepalive_s=3600)
    try:
        rec.flush()  # the first: the CPU baseline
        for _ in range(5):
            rec.flush()  # a role inside one long generate call: nothing new
        assert len(_cpu_counters(collector, tmp_path / "a.json")) == 1
        rec.span("rollout.0", "generate", 1.0, 0.5)
        rec.flush()
        assert len(_cpu_counters(collector, tmp_path / "b.json")) == 2
        rec.counters["version"] = 3  # a counter changed: said at once
        rec.flush()
        assert len(_cpu_counters(collector, tmp_path / "c.json")) == 3
    finally:
        rec.close()
    assert len(_cpu_counters(collector, tmp_path / "d.json")) == 4  # close sends the last CPU figure


def test_an_idle_recorder_still_reports_its_cpu_when_the_keepalive_is_due(collector, tmp_path):
    rec = SpanRecorder("rollout.0", collector, flush_s=3600, enabled=True, keepalive_s=0.0)
    try:
        for _ in range(3):
            rec.flush()
        assert len(_cpu_counters(collector, tmp_path / "a.json")) == 3
    finally:
        rec.close()
