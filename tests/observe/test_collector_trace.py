"""The collector's trace and loggers, fed messages directly (no processes)."""

from __future__ import annotations

import json
import threading

import pytest

from asyncflow.actors.driver._loggers import build_loggers
from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.runtime import messages
from asyncflow.cli.runs import timeline, validate_trace
from asyncflow.config.cluster import LoggingConfig
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig


class ListLogger:
    def __init__(self):
        self.logged = []

    def log(self, step, values):
        self.logged.append((step, values))


def _collector(tmp_path, loggers=()):
    ctx = ActorContext("collector", TransportConfig(scheme="inproc"))
    return CollectorActor(ctx, run_dir=str(tmp_path), num_steps=2, progress=False, loggers=list(loggers))


def _spans(role, pid, spans, final_version):
    """spans: (name, start s, duration s, version when it began)."""
    return messages.Spans(
        role=role,
        pid=pid,
        names=[s[0] for s in spans],
        starts_s=[s[1] for s in spans],
        durations_s=[s[2] for s in spans],
        versions=[s[3] for s in spans],
        counters={"version": final_version},
    )


def _step(step, staleness):
    return messages.StepMetrics(
        step=step,
        values={
            "step": step,
            "reward_mean": 0.5,
            "samples": 4,
            "total_samples": 4,
            "total_tokens": 40,
            "time_s": 1.0 + step,
            "staleness_max": staleness,
            "staleness_mean": staleness,
            "response_len_mean": 3.0,
        },
    )


def test_weight_sync_flows_link_the_publishing_train_step_to_each_replica_that_loads_it(tmp_path):
    c = _collector(tmp_path)
    c.handle(
        _spans(
            "trainer",
            11,
            [
                ("wait_data", 100.0, 1.0, 0),
                ("train", 101.0, 0.5, 0),
                ("sync_weights", 101.5, 0.1, 0),
                ("wait_data", 101.6, 1.0, 1),
            ],
            1,
        ),
        None,
    )
    c.handle(
        _spans("rollout.0", 12, [("generate", 100.0, 1.0, 0), ("wait_swap", 101.7, 0.1, 0), ("swap_weights", 101.8, 0.2, 0)], 1),
        None,
    )
    c.handle(_spans("rollout.1", 13, [("generate", 100.0, 2.0, 0), ("swap_weights", 102.0, 0.2, 0)], 1), None)
    path = tmp_path / "trace.json"
    c.write_trace(str(path))
    trace = json.loads(path.read_text())
    assert validate_trace(trace, max_run_s=10.0) == []
    events = trace["traceEvents"]
    starts = [e for e in events if e["ph"] == "s"]
    ends = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(ends) == 2 and {e["name"] for e in starts} == {"weights v1"}
    assert all(e["ts"] == pytest.approx(101.5e6) for e in starts)
    assert sorted(e["ts"] for e in ends) == pytest.approx([101.8e6, 102.0e6])
    versions = [(e["pid"], e["args"]["version"]) for e in events if e["ph"] == "C" and e["name"] == "policy version"]
    assert versions.count((1, 1)) == 1 and versions.count((2, 1)) == 1  # one sample per change, not per span
    assert list(timeline(trace).tracks) == ["rollout.0", "rollout.1", "trainer"]


def test_every_step_reaches_the_loggers_and_the_staleness_counter(tmp_path):
    logger = ListLogger()
    c = _collector(tmp_path, [logger])
    c.busy = {"trainer": 0.5}
    for step in range(2):
        c.handle(_step(step, staleness=step), None)
    assert [s for s, _ in logger.logged] == [0, 1] and logger.logged[1][1]["busy/trainer"] == 0.5
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["staleness_max"] for line in lines] == [0, 1]
    assert [e["args"]["max"] for e in c.trace_events if e["name"] == "staleness"] == [0, 1]


def test_no_logger_is_built_unless_asked():
    assert build_loggers(LoggingConfig(), "/nonexistent") == []


def test_the_tensorboard_logger_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    (logger,) = build_loggers(LoggingConfig(tensorboard=True), tmp_path)
    logger.log(0, {"reward_mean": 0.25, "busy/trainer": 0.5})
    logger.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_without_the_package_says_how_to_install_it(tmp_path):
    try:
        import wandb  # noqa: F401

        pytest.skip("wandb is installed")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[wandb\]'"):
        build_loggers(LoggingConfig(wandb_project="p"), tmp_path)


@pytest.mark.timeout(30)
def test_the_trace_is_rewritten_during_the_run_so_a_live_run_can_be_drawn(tmp_path):
    ctx = ActorContext("collector", TransportConfig(scheme="inproc"))
    written = threading.Event()
    ref = CollectorActor.start(
        ctx,
        run_dir=str(tmp_path),
        num_steps=2,
        progress=False,
        trace_every_s=0.05,
        on_trace_written=lambda num_events: written.set(),
    )
    try:
        ref.ask(_spans("trainer", 11, [("wait_data", 100.0, 1.0, 0), ("train", 101.0, 0.5, 0)], 0))
        assert written.wait(10)
        first = json.loads((tmp_path / "trace.json").read_text())
        assert {e["name"] for e in first["traceEvents"] if e["ph"] == "X"} == {"wait_data", "train"}
        written.clear()
        ref.ask(_spans("trainer", 11, [("sync_weights", 101.5, 0.1, 0)], 1))
        assert written.wait(10)
        second = json.loads((tmp_path / "trace.json").read_text())
        assert "sync_weights" in {e["name"] for e in second["traceEvents"] if e["ph"] == "X"}
        assert not (tmp_path / "trace.json.tmp").exists()
    finally:
        ref.stop()


@pytest.mark.timeout(10)
def test_roles_sort_in_pipeline_order_with_ranks_and_infrastructure_last():
    from asyncflow.cli.status import _order

    names = ["dist.trainer", "trainer.1", "tq.manager", "trainer", "rollout.10", "rollout.2", "loader", "weights"]
    ordered = sorted(names, key=_order)
    assert ordered[:5] == ["loader", "rollout.2", "rollout.10", "trainer", "trainer.1"]
    assert set(ordered[5:]) == {"dist.trainer", "tq.manager", "weights"}


@pytest.mark.timeout(30)
def test_a_live_trace_write_that_fails_is_said_once_and_the_collector_goes_on(tmp_path, capsys):
    """A full disk (here: trace.json unwritable) must not end the collector: the periodic
    write says so once and is tried again at its next turn."""
    c = _collector(tmp_path)
    scheduled: list = []
    c.call_later = lambda delay, fn: scheduled.append(fn)  # type: ignore[method-assign]
    c.handle(_step(0, 0), None)  # a trace event to write
    c.trace_path.unlink(missing_ok=True)
    c.trace_path.mkdir()  # every write of trace.json fails
    c._write_live()
    c._write_live()
    assert len(scheduled) == 2  # the next write is still scheduled each time
    assert capsys.readouterr().err.count("could not write") == 1
