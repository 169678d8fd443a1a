"""kill -9 of a rollout process while its multi-turn trajectories are half done (one
turn taken, an environment step in flight): the run completes and every trajectory
is trained exactly once (no row lost, none twice)."""

from __future__ import annotations

import pytest
from chaos_helpers import ChaosRun

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [500])
def test_a_rollout_killed_with_trajectories_half_done_leaves_each_trained_exactly_once(tmp_path, seed):
    env = {"path": "chaos_env:HalfwayEnv", "max_turns": 3, "step_timeout_s": 10.0}
    run = ChaosRun(tmp_path, seed, changes={"env": env}).start()
    run.wait_for_step(3)  # a checkpoint to resume from, should the kill need one
    before = set(run.marks.glob("env.*"))
    run.wait_until("a trajectory half done", lambda: set(run.marks.glob("env.*")) - before)
    run.kill("rollout.0")  # its environment holds 0.3 s after the mark: the trajectory is mid-flight
    out = run.finish()
    assert "rollout.0 exited with code -9" in out, run.why(out)
    trained = (run.run_dir / "metrics.jsonl").read_text()
    assert '"env/tool_call_rate"' in trained, run.why("the run trained without its environment's columns")
