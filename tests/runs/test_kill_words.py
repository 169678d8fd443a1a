"""A worker killed with kill -9 in a live run is named by its signal, and never as an
out-of-memory kill: the kernel's count did not grow (or, without a memory cgroup to read,
both causes are named)."""

from __future__ import annotations

import os
import signal

import pytest
from wf_helpers import afctl, child_hosts, wait_for_steps, write_config


@pytest.mark.timeout(240)
def test_a_reward_worker_killed_with_kill_9_is_named_a_sigkill_and_not_an_out_of_memory_kill(tmp_path):
    run_dir = tmp_path / "run"
    proc = afctl("up", str(write_config(tmp_path, num_steps=8)), "--run-dir", str(run_dir))
    try:
        wait_for_steps(run_dir, proc, 2, 180)
        os.kill(child_hosts(proc.pid)["reward.0"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out  # restarted in place
    assert "reward.0 exited with code -9: killed by signal 9 (SIGKILL: " in out, out
    assert "lack of memory" not in out, out
