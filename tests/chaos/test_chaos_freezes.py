"""SIGSTOP for a minute of each kind of process, and of the whole process group (Ctrl-Z
of ``afctl up``: the driver with its hosts), at a seeded random moment, then SIGCONT.
The run finishes by itself: no role fails, nothing is resumed, every prompt group is
trained exactly once, no process is left (docs/faults.md, "Freeze policy").

Before the freeze policy each of these failed the run when the process woke:
``ActorTimeout: actor 'tq.controller.reward' ... did not answer GetBatch within 30.5 s``."""

from __future__ import annotations

import time

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos

KINDS = ["rollout.0", "reward.0", "loader", "queue", "shard.0", "trainer"]
FREEZE_S = 60.0
"""How long a process stays stopped: twice the default ask timeout (30 s), which failed the run before."""


def _moment(seed: int) -> tuple[int, float]:
    rng = rng_for(seed)
    return rng.randint(1, NUM_STEPS - 2), rng.uniform(0.0, 1.5)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("host,seed", [(h, 500 + i) for i, h in enumerate(KINDS)], ids=lambda v: str(v))
def test_a_process_frozen_for_a_minute_at_a_random_moment_does_not_fail_the_run(tmp_path, host, seed):
    step, delay_s = _moment(seed)
    run = ChaosRun(tmp_path, seed).start()
    run.wait_for_step(step)
    time.sleep(delay_s)  # the random moment within the step
    pid = run.freeze(host)
    try:
        time.sleep(FREEZE_S)  # the fault itself: a minute stopped (not a synchronisation)
    finally:
        run.thaw(pid)
    out = run.finish_without_failure()
    assert f"process {host} (pid {pid}) has not answered" in out, run.why(f"the driver did not name {host} frozen:\n{out}")
    assert f"process {host} (pid {pid}) answers again" in out, run.why(out)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("seed", [520])
def test_the_whole_run_frozen_for_a_minute_at_a_random_moment_goes_on_when_continued(tmp_path, seed):
    step, delay_s = _moment(seed)
    run = ChaosRun(tmp_path, seed, new_session=True).start()
    run.wait_for_step(step)
    time.sleep(delay_s)
    run.freeze_everything()
    try:
        time.sleep(FREEZE_S)  # the fault itself
    finally:
        run.thaw()
    out = run.finish_without_failure()
    assert "frozen, not dead" not in out, run.why(f"the driver, frozen too, named a process frozen:\n{out}")
