"""A worker that dies during its own restart never crashes the driver:
the restart is retried with backoff within the role's budget, and past the budget the
run stops cleanly and resumes itself (``cluster.max_resumes``)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, child_hosts, wait_for_steps, write_config

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # 40 s: the default suite stays under 10 minutes on 2 cores
@pytest.mark.timeout(420)
def test_a_reward_worker_that_dies_in_each_restart_is_retried_then_the_run_stops_cleanly_and_resumes(tmp_path):
    run_dir, crashes = tmp_path / "run", tmp_path / "crashes"
    config = write_config(
        tmp_path,
        num_steps=8,
        checkpoint_every=2,
        extra=f'[cluster]\npython_path = ["{HERE}"]\nmax_resumes = 1\nmax_restarts_per_role = 2\nrestart_backoff_s = 0.2\n',
        changes={"reward": {"functions": ["wf_crashing_reward:length"]}},
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir), env_extra={"AF_TEST_CRASH_ON_IMPORT": str(crashes)})
    wait_for_steps(run_dir, proc, 3, 300)  # step_000002 is saved: there is a checkpoint to resume from
    crashes.write_text("2")  # the next two starts of a reward worker die while it imports its function
    os.kill(child_hosts(proc.pid)["reward.0"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=360)
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    assert "reward.0 exited with code -9" in out, out
    assert out.count("!! restart of reward.0 failed") == 2, out  # retried once with budget left, then given up
    assert "role reward: 2 restarts within" in out and "cluster.max_restarts_per_role = 2" in out, out
    assert "(automatic resume 1 of 1)" in out, out
    assert crashes.read_text() == "0"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["resumes"]) == 1 and "role reward" in summary["resumes"][0]["error"]
    assert_trained_exactly_once(run_dir, 8, 2, 2)
