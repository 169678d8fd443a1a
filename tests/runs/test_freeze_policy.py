"""The freeze policy on a real run (docs/faults.md, "Freeze policy").

A process frozen (SIGSTOP) for longer than the ask timeout is named frozen by the
driver, its peers send their requests again until it answers, and once continued the
run goes on and finishes, every group trained exactly once. A process frozen past
``cluster.transport.freeze_timeout_s`` is killed by the driver and restarted in place
like a dead one. Both wait on what the driver prints (events), never on sleeps."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, child_hosts, wait_for_steps, write_config

NUM_STEPS = 6


class _Output:
    """The driver's output, read line by line as it comes, so a test can wait for a line."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # the end: nothing more comes
            self._changed.notify_all()

    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, *parts: str, timeout_s: float = 120.0) -> str:
        """The first line containing every one of ``parts``; fails when the run ends first."""
        deadline = time.monotonic() + timeout_s

        def found() -> str | None:
            for line in self.lines:
                if all(p in line for p in parts):
                    return line
            if self.lines and self.lines[-1] == "":
                raise AssertionError(f"the run ended ({self.proc.poll()}) without a line with {parts}:\n{''.join(self.lines)}")
            return None

        with self._changed:
            while (line := found()) is None:
                left = deadline - time.monotonic()
                assert left > 0, f"no line with {parts} within {timeout_s} s:\n{''.join(self.lines)}"
                self._changed.wait(left)
            return line

    def finish(self, timeout_s: float) -> str:
        self.proc.wait(timeout=timeout_s)
        self._thread.join(timeout=30)
        return self.text()


def _start(tmp_path: Path, ask_timeout_s: float, freeze_timeout_s: float) -> tuple[subprocess.Popen, _Output, Path]:
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        num_steps=NUM_STEPS,
        changes={"cluster.transport": {"ask_timeout_s": ask_timeout_s, "freeze_timeout_s": freeze_timeout_s}},
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    return proc, _Output(proc), run_dir


def _assert_finished_cleanly(proc: subprocess.Popen, out: str, run_dir: Path) -> None:
    assert proc.returncode == 0, out
    assert "run failed" not in out and "automatic resume" not in out and "Traceback" not in out, out
    assert f"done: {NUM_STEPS} steps" in out, out
    assert_trained_exactly_once(run_dir, NUM_STEPS, 2, 2)


@pytest.mark.slow  # a run and a 10 s freeze: ~1 min on 2 cores
@pytest.mark.timeout(400)
@pytest.mark.parametrize("host", ["queue", "reward.0"])
def test_a_process_frozen_longer_than_the_ask_timeout_is_named_and_the_run_finishes_once_it_wakes(tmp_path, host):
    proc, output, run_dir = _start(tmp_path, ask_timeout_s=2.0, freeze_timeout_s=300.0)
    try:
        wait_for_steps(run_dir, proc, 2, 300)
        pid = child_hosts(proc.pid)[host]
        os.kill(pid, signal.SIGSTOP)
        try:
            # named after 10 s without an answer: five times the ask timeout, so its peers have sent their requests again
            line = output.wait_for(f"process {host} (pid {pid}) has not answered", "frozen, not dead")
            assert "state T, stopped by a signal" in line, line
        finally:
            os.kill(pid, signal.SIGCONT)
        output.wait_for(f"process {host} (pid {pid}) answers again")
        out = output.finish(timeout_s=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_finished_cleanly(proc, out, run_dir)


@pytest.mark.slow  # a run and a 15 s freeze: ~1 min on 2 cores
@pytest.mark.timeout(400)
def test_a_worker_frozen_past_the_freeze_timeout_is_killed_and_restarted_in_place(tmp_path):
    proc, output, run_dir = _start(tmp_path, ask_timeout_s=2.0, freeze_timeout_s=15.0)
    try:
        wait_for_steps(run_dir, proc, 2, 300)
        pid = child_hosts(proc.pid)["reward.0"]
        os.kill(pid, signal.SIGSTOP)  # never continued: the driver ends it
        output.wait_for(f"process reward.0 (pid {pid}) has not answered", "frozen, not dead")
        output.wait_for(f"process reward.0 (pid {pid}) was frozen for", "freeze_timeout_s = 15) and was killed")
        output.wait_for("reward.0 was frozen for", "restarting it")  # the death's handling: rows requeued, restarted
        out = output.finish(timeout_s=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    _assert_finished_cleanly(proc, out, run_dir)
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped
