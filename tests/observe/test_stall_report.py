"""The stall report at real size: its timeout scales with the steps
the run has shown (or the preflight's estimate before the first), it prints a short
block on the terminal, and every process's Python stacks go to RUN_DIR/logs/stall-<n>.txt."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from asyncflow.actors.driver import launcher as launcher_module
from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.driver.launcher import STALL_STEP_FACTOR, Launcher, stall_timeout_s
from asyncflow.actors.driver.topology import HostPlan
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.run_dir import LaunchInfo
from asyncflow.config.load import load_config_text
from asyncflow.core import protocol
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig

HERE = Path(__file__).parent


@pytest.mark.timeout(10)
def test_the_stall_timeout_is_hang_timeout_s_unless_three_slowest_steps_take_longer():
    assert STALL_STEP_FACTOR == 3.0
    assert stall_timeout_s(300, 0.0, None) == 300  # nothing known: the configured timeout
    assert stall_timeout_s(300, 50.0, None) == 300  # fast steps never shorten it
    assert stall_timeout_s(300, 150.0, None) == 450  # a real model's slow steps lengthen it
    assert stall_timeout_s(300, 0.0, 148.0) == 444  # before the first step: the preflight's estimate
    assert stall_timeout_s(300, 0.0, 20.0) == 300
    assert stall_timeout_s(300, 120.0, 1000.0) == 360  # once steps are seen, they count, not the estimate


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


@pytest.mark.timeout(10)
def test_the_collector_reports_the_slowest_step_and_not_the_processes_start_before_the_first(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr("asyncflow.actors.driver.collector.time", clock)
    collector = CollectorActor(
        ActorContext("collector", TransportConfig(scheme="inproc")), run_dir=str(tmp_path), num_steps=4, progress=False
    )
    state = collector.handle(messages.GetRunState(), None)
    assert state.slowest_step_s == 0.0
    clock.now += 90  # the processes start, load the model, generate the first rows
    collector.handle(messages.StepMetrics(step=0, values={"step": 0, "step_time_s": 20.0}), None)
    assert collector.handle(messages.GetRunState(), None).slowest_step_s == 20.0  # the trainer's own time
    clock.now += 35
    collector.handle(messages.StepMetrics(step=1, values={"step": 1, "step_time_s": 20.0}), None)
    clock.now += 25
    collector.handle(messages.StepMetrics(step=2, values={"step": 2, "step_time_s": 20.0}), None)
    assert collector.handle(messages.GetRunState(), None).slowest_step_s == 35.0  # between two steps' metrics


@pytest.fixture
def launcher(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the cluster pointer file stays in this test
    cfg = load_config_text(f"[logging]\nprogress = false\nhang_timeout_s = 0.1\n[cluster]\npython_path = ['{HERE}']\n")
    (tmp_path / "run").mkdir()
    launcher = Launcher(cfg, tmp_path / "run", LaunchInfo(model_dir="m", base_model_dir="m", data_path="d"))
    launcher.start()  # nothing planned: the driver's own actors; the test adds a host
    try:
        yield launcher
    finally:
        launcher.stop()


@pytest.mark.timeout(120)
def test_a_stall_report_prints_a_short_block_and_writes_every_process_stacks_to_a_new_file(launcher):
    spec = protocol.ActorSpec(name="stuck", cls="obs_stuck:StuckActor")
    launcher.supervisor.add(HostPlan(name="stuck", kind="fake", role=None, specs=[spec]))
    logs = launcher.run_dir.absolute() / "logs"

    block = launcher.stall_report(400.0, {}, timeout_s=300.0)
    assert block.startswith("no trainer step completed in 400 s (stall timeout 300 s)")
    assert block.splitlines()[-1] == f"  Python stacks of every process: {logs / 'stall-1.txt'}"
    assert len(block.splitlines()) < 10 and "File " not in block  # no stacks on the terminal
    stacks = (logs / "stall-1.txt").read_text()
    process = stacks.split("--- Python stacks of process stuck ")[1].split("--- Python stacks of the driver")[0]
    assert "in stuck_in_a_unit_of_work" in process  # the stuck thread of that process
    assert "--- Python stacks of the driver" in stacks

    second = launcher.stall_report(800.0, {}, timeout_s=300.0)
    assert second.endswith(str(logs / "stall-2.txt"))  # a new file per report
    assert "in stuck_in_a_unit_of_work" in (logs / "stall-2.txt").read_text()


@pytest.mark.timeout(120)
def test_the_wait_loop_reports_a_stall_after_the_timeout_and_names_the_stacks_file(launcher, monkeypatch):
    said: list[str] = []

    def echo(message=None, err=False, **kwargs):
        said.append(str(message))
        if "no trainer step completed" in str(message):  # the report is out: let the run end
            launcher.collector.pykka_ref.tell(messages.RunFinished(last_step=0, checkpoint=""))

    monkeypatch.setattr(launcher_module.click, "echo", echo)
    finished = launcher.wait()  # hang_timeout_s = 0.1 and no step ever comes
    assert finished.last_step == 0
    report = next(m for m in said if "no trainer step completed" in m)
    assert report.endswith(str(launcher.run_dir.absolute() / "logs" / "stall-1.txt"))
    assert (launcher.run_dir / "logs" / "stall-1.txt").exists()
