"""kill -9 of a reward-model replica (``[reward_model]``) at a random (seeded) moment:
it is restarted in place, the rows it held are requeued to its task, and the run
completes with every prompt group trained exactly once and nothing left behind."""

from __future__ import annotations

import json
import re
import time

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [130])
def test_a_reward_model_replica_killed_at_a_random_moment_is_restarted_and_every_group_is_trained_once(tmp_path, seed):
    rng = rng_for(seed)
    step, delay_s = rng.randint(2, NUM_STEPS - 2), rng.uniform(0.0, 1.0)
    run = ChaosRun(tmp_path, seed, changes={"reward_model": {"enabled": True, "tiny_steps": 20, "batch_size": 2}}).start()
    run.wait_for_step(step)
    time.sleep(delay_s)  # the random moment within the step
    run.kill("reward_model.0")
    out = run.finish()
    assert re.search(r"reward_model\.0'?( \(\w+\))? exited with code -9", out), run.why(f"step {step} + {delay_s:.2f} s:\n{out}")
    summary = json.loads((run.run_dir / "summary.json").read_text())
    # restarted in place, not resumed from a checkpoint
    assert [r["host"] for r in summary["restarts"]] == ["reward_model.0"] and not summary.get("resumes"), run.why(str(summary))
