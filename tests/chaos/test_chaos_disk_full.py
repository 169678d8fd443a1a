"""A disk that is full during a checkpoint: the trainer's checkpoint write raises
ENOSPC (hooks/sitecustomize.py, while a flag file exists). The run stops cleanly,
naming the error; once space is back (the flag removed) ``afctl up --resume``
completes, every group trained exactly once, no process left."""

from __future__ import annotations

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [500])
def test_a_full_disk_during_a_checkpoint_stops_the_run_cleanly_and_resume_completes_it(tmp_path, seed):
    flag = tmp_path / "disk_full"
    run = ChaosRun(tmp_path, seed, env={"AF_CHAOS_ENOSPC": str(flag), "AF_CHAOS_HOLD_S": "0"})
    run.before_resume = flag.unlink  # space is back
    run.start()
    run.wait_for_step(rng_for(seed).randint(3, NUM_STEPS - 2))  # step_000002 is saved; a later save fails
    flag.write_text("full")
    run.finish(expect_stop="No space left on device")
