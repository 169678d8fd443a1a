"""A reward function that goes bad mid-run (NaN, one value too few, an exception): the
run stops cleanly with the error named, before anything trains on it; with the
function fixed (its flag file removed), ``afctl up --resume`` completes, every group
trained exactly once, no process left.

There is no reward timeout: a hanging reward function stalls the run (reported by
``logging.hang_timeout_s``) until its worker is killed; the last case kills the hung
worker, which is restarted with its rows requeued, and the run completes."""

from __future__ import annotations

import time

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos

EXPECTED = {
    "nan": "reward function chaos_rewards:switchable returned nan for sample",
    "short": "reward function chaos_rewards:switchable returned",
    "raise": "chaos: this reward function raised on purpose",
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode,seed", [("nan", 600), ("short", 601), ("raise", 602)], ids=lambda v: str(v))
def test_a_hostile_reward_function_stops_the_run_naming_it_and_resume_with_it_fixed_completes(tmp_path, mode, seed):
    flag = tmp_path / "bad_reward"
    run = ChaosRun(tmp_path, seed, env={"AF_CHAOS_BAD_REWARD": str(flag)})
    run.before_resume = flag.unlink  # the function is fixed
    run.start()
    run.wait_for_step(rng_for(seed).randint(3, NUM_STEPS - 2))
    flag.write_text(mode)
    out = run.finish(expect_stop=EXPECTED[mode])
    if mode == "short":
        assert "values for" in out and "responses" in out, run.why(out)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [603])
def test_a_hung_reward_worker_killed_is_restarted_and_the_run_completes(tmp_path, seed):
    flag = tmp_path / "bad_reward"
    rng = rng_for(seed)
    run = ChaosRun(tmp_path, seed, env={"AF_CHAOS_BAD_REWARD": str(flag)}).start()
    run.wait_for_step(rng.randint(3, NUM_STEPS - 2))
    flag.write_text("hang")
    stalled_at = run.steps_done()
    time.sleep(rng.uniform(1.0, 3.0))  # the reward worker hangs in the function (no reward timeout exists)
    run.kill("reward.0")
    flag.unlink()  # the restarted worker's function returns again
    out = run.finish()
    assert "reward.0 exited with code -9" in out and stalled_at < NUM_STEPS, run.why(out)
