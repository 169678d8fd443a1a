"""The stop's resume hint names the checkpoint that exists once the run has stopped: a
Ctrl-C that lands while a checkpoint is written lets the trainer finish it, and the
resume uses that one, so the hint must not name the one before."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from wf_helpers import afctl, write_config

from asyncflow.actors.trainer.checkpoints import latest_good_checkpoint

HOOKS = Path(__file__).resolve().parents[1] / "chaos" / "hooks"  # sitecustomize: marks, and a hold inside the checkpoint


def _wait_for(path: Path, proc, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"afctl up exited early ({proc.returncode}):\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} within {timeout_s} s")
        time.sleep(0.05)


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_checkpoint_names_the_checkpoint_the_trainer_finished_while_stopping(tmp_path):
    run_dir, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    config = write_config(tmp_path, num_steps=100_000, checkpoint_every=2)
    # the hook marks the checkpoint after step 4 once its queue and model are written, then holds it
    # 2 s before its manifest: the Ctrl-C lands inside that checkpoint, which the trainer then finishes
    env = {
        "PYTHONPATH": os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH", "")) if p),
        "AF_CHAOS_MARKS": str(marks),
        "AF_CHAOS_HOLD_S": "2",
    }
    proc = afctl("up", str(config), "--run-dir", str(run_dir), env_extra=env, start_new_session=True)
    try:
        _wait_for(marks / "checkpoint.step_000004.tmp", proc, 240)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, out
    ckpt, _ = latest_good_checkpoint(run_dir)
    assert ckpt is not None and ckpt.name == "step_000004", out  # the held checkpoint was finished by the stop
    assert f"Resume from its last checkpoint ({ckpt.name}): afctl up --resume {run_dir}" in out, out
    assert "step_000002" not in out, out
