"""A resumed run has a trace per launch: each launch's collector keeps the earlier
launch's trace.json as trace.launch-<k>.json before it writes its own, and
``afctl trace RUN_DIR`` shows every launch, each labelled "launch k of n"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.runtime import messages
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig


def spans(role: str, start_s: float, n: int) -> messages.Spans:
    return messages.Spans(
        role=role,
        pid=4242,
        names=["generate"] * n,
        starts_s=[start_s + 0.01 * i for i in range(n)],
        durations_s=[0.009] * n,
        versions=[0] * n,
        counters={"version": 0},
    )


def one_launch(run_dir: Path, role: str, n: int) -> None:
    """What one launch's collector writes: ``n`` spans of ``role``."""
    c = CollectorActor(
        ActorContext("collector", TransportConfig(scheme="inproc")), run_dir=str(run_dir), num_steps=2, progress=False
    )
    c.handle(spans(role, 1000.0, n), None)
    c.write_trace(str(run_dir / "trace.json"))


@pytest.mark.timeout(60)
def test_a_second_launch_keeps_the_first_launchs_trace_beside_its_own(tmp_path):
    one_launch(tmp_path, "rollout.0", 3)
    one_launch(tmp_path, "trainer", 5)
    first = json.loads((tmp_path / "trace.launch-1.json").read_text())
    last = json.loads((tmp_path / "trace.json").read_text())
    assert sum(e["ph"] == "X" for e in first["traceEvents"]) == 3
    assert sum(e["ph"] == "X" for e in last["traceEvents"]) == 5


@pytest.mark.timeout(60)
def test_afctl_trace_of_a_resumed_run_shows_every_launch_labelled(tmp_path):
    from asyncflow.cli.trace import trace

    (tmp_path / "run").mkdir()
    for role, n in (("rollout.0", 3), ("trainer", 5), ("reward.0", 7)):
        one_launch(tmp_path / "run", role, n)
    result = CliRunner().invoke(trace, [str(tmp_path / "run"), "--png", str(tmp_path / "trace.png")])
    assert result.exit_code == 0, result.output
    heads = [line for line in result.output.splitlines() if " spans over " in line]
    assert len(heads) == 3, result.output
    for k, (head, n) in enumerate(zip(heads, (3, 5, 7)), start=1):
        assert f"launch {k} of 3" in head and f": {n} spans over" in head, result.output
    assert (tmp_path / "trace.png").stat().st_size > 0


@pytest.mark.slow  # two tiny launches, about 40 s; the planted tests above cover the default suite
@pytest.mark.timeout(300)
def test_a_real_resumed_run_is_traced_launch_by_launch(tmp_path):
    from obs_helpers import afctl, write_config

    from asyncflow.cli.trace import trace

    run_dir = tmp_path / "run"
    first = afctl("up", str(write_config(tmp_path / "tiny.toml", num_steps=2)), "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stdout + first.stderr
    second = afctl("up", "--resume", str(run_dir), "--set", "train.num_steps=3")
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "steps 3..3)" in out  # the resumed launch trains the third step, numbered as its progress line
    assert sorted(p.name for p in run_dir.glob("trace*.json")) == ["trace.json", "trace.launch-1.json"]
    result = CliRunner().invoke(trace, [str(run_dir)])
    assert result.exit_code == 0, result.output
    heads = [line for line in result.output.splitlines() if " spans over " in line]
    assert [h.split(":")[0].rsplit(" ", 4)[-4:] for h in heads] == [["launch", "1", "of", "2"], ["launch", "2", "of", "2"]]
