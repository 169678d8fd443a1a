"""kill -9 of a partial-rollout replica while it swaps weights between decode steps
(sequences in flight, some tokens from the old version): the run completes and every
prompt group is trained exactly once."""

from __future__ import annotations

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [500])
def test_a_partial_rollout_killed_during_a_mid_sequence_swap_leaves_every_group_trained_exactly_once(tmp_path, seed):
    sync = rng_for(seed).randint(3, NUM_STEPS - 2)  # the rollout's n-th weight load (hooks/sitecustomize.py)
    changes = {"workflow": {"partial_rollout": True}, "rollout.sampling": {"max_new_tokens": 24}}
    run = ChaosRun(tmp_path, seed, changes=changes, env={"AF_CHAOS_HOLD_S": "0.5"}).start()
    run.wait_for_step(3)  # a checkpoint to resume from
    run.wait_until(f"weight sync {sync}", lambda: any(int(p.name.rsplit(".", 1)[1]) >= sync for p in run.marks.glob("sync.*")))
    run.kill("rollout.0")  # held 0.5 s inside load_weights, between two decode steps of its stream
    run.finish()
