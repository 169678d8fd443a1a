"""kill -9 of a partial-rollout replica while it swaps weights between decode steps
(sequences in flight, some tokens from the old version): the run completes and every
prompt group is trained exactly once. With an environment ([env] path) too: a replica
(or the trainer) killed during a swap with multi-turn trajectories in flight, and a
replica killed with trajectories half done (one turn taken, its environment step in
flight): no trajectory lost, none trained twice."""

from __future__ import annotations

import pytest
from chaos_helpers import NUM_STEPS, ChaosRun, rng_for

pytestmark = pytest.mark.chaos

# HalfwayEnv (chaos_env.py): two turns; the first step leaves a mark and holds 0.3 s
ENV = {"path": "chaos_env:HalfwayEnv", "max_turns": 3, "step_timeout_s": 10.0}
PARTIAL = {"workflow": {"partial_rollout": True}, "rollout.sampling": {"max_new_tokens": 24}}


def _synced(run: ChaosRun, sync: int) -> bool:
    return any(int(p.name.rsplit(".", 1)[1]) >= sync for p in run.marks.glob("sync.*"))


def _trained_with_environment(run: ChaosRun) -> None:
    trained = (run.run_dir / "metrics.jsonl").read_text()
    assert '"env/tool_call_rate"' in trained, run.why("the run trained without its environment's columns")
    assert '"token_staleness_max"' in trained, run.why("the run trained rows without their token versions")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [500])
def test_a_partial_rollout_killed_during_a_mid_sequence_swap_leaves_every_group_trained_exactly_once(tmp_path, seed):
    sync = rng_for(seed).randint(3, NUM_STEPS - 2)  # the rollout's n-th weight load (hooks/sitecustomize.py)
    run = ChaosRun(tmp_path, seed, changes=PARTIAL, env={"AF_CHAOS_HOLD_S": "0.5"}).start()
    run.wait_for_step(3)  # a checkpoint to resume from
    run.wait_until(f"weight sync {sync}", lambda: _synced(run, sync))
    run.kill("rollout.0")  # held 0.5 s inside load_weights, between two decode steps of its stream
    run.finish()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("host,seed", [("rollout.0", 510), ("trainer", 511)], ids=lambda v: str(v))
def test_a_multi_turn_partial_rollout_killed_during_a_swap_leaves_every_trajectory_trained_exactly_once(tmp_path, host, seed):
    sync = rng_for(seed).randint(3, NUM_STEPS - 2)
    run = ChaosRun(tmp_path, seed, changes={**PARTIAL, "env": ENV}, env={"AF_CHAOS_HOLD_S": "0.5"}).start()
    run.wait_for_step(3)
    run.wait_until(f"weight sync {sync}", lambda: _synced(run, sync))
    run.kill(host)  # the rollout holds 0.5 s inside load_weights, trajectories in the stream or at their environment
    out = run.finish()
    if host == "rollout.0":
        assert "rollout.0 exited with code -9" in out, run.why(out)
    _trained_with_environment(run)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [520])
def test_a_multi_turn_partial_rollout_killed_with_trajectories_half_done_leaves_each_trained_exactly_once(tmp_path, seed):
    run = ChaosRun(tmp_path, seed, changes={**PARTIAL, "env": ENV}).start()
    run.wait_for_step(3)
    before = set(run.marks.glob("env.*"))
    run.wait_until("a trajectory half done", lambda: set(run.marks.glob("env.*")) - before)
    run.kill("rollout.0")  # its environment holds 0.3 s after the mark: the trajectory is mid-flight
    out = run.finish()
    assert "rollout.0 exited with code -9" in out, run.why(out)
    _trained_with_environment(run)
