"""The local workflow model (planner.workflow) and `afctl plan --config`'s mapping of a run config."""

from __future__ import annotations

import msgspec
import pytest

from asyncflow.planner.workflow import StageTimes, contention, simulate


def test_a_sync_step_is_its_calls_then_polls_until_the_new_weights_are_there():
    # 2 calls of 25 ms, then training 30 ms: a gated replica polls 0.05 s at a time
    # and swaps once a poll ends after the weights were published (at 80 ms): a 100 ms
    # period. Measured as bench e2e does, first train start to last end over 20 steps:
    # (19 periods + one 30 ms train) / 20
    st = StageTimes(call_s=0.025, calls_per_step=2, train_s=0.03, poll_s=0.05)
    result = simulate(st, num_replicas=1, staleness=0, num_steps=20)
    assert result.step_s == pytest.approx((19 * 0.1 + 0.03) / 20)
    assert result.num_polls == 19


def test_with_staleness_one_a_fast_trainer_never_leaves_the_replica_polling():
    st = StageTimes(call_s=0.025, calls_per_step=2, train_s=0.03, poll_s=0.2)
    result = simulate(st, num_replicas=1, staleness=1, num_steps=20)
    assert result.num_polls == 0
    assert result.step_s == pytest.approx(0.05, rel=0.05)  # rollout-bound: 2 calls per step


def test_a_slow_trainer_bounds_the_async_step_and_two_replicas_do_not_help():
    st = StageTimes(call_s=0.025, calls_per_step=2, train_s=0.2, poll_s=0.05)
    one = simulate(st, num_replicas=1, staleness=1, num_steps=20)
    two = simulate(st, num_replicas=2, staleness=1, num_steps=20)
    assert one.step_s == pytest.approx(0.2, rel=0.05) and two.step_s == pytest.approx(0.2, rel=0.05)


def test_processes_beyond_the_cores_stretch_each_other():
    assert contention(2, 2) == 1.0 and contention(3, 2) == 1.5


@pytest.mark.timeout(60)
def test_plan_config_maps_a_run_config_and_predicts_both_modes(tmp_path):
    from asyncflow.cli.predict import config_inputs
    from asyncflow.config.load import load_config_text
    from asyncflow.planner.calibration import Efficiency, Profile
    from asyncflow.planner.predict import predict

    cfg = load_config_text("""
        [algorithm]
        group_size = 4
        [rollout]
        prompts_per_call = 2
        [rollout.sampling]
        max_new_tokens = 8
        [train]
        prompts_per_step = 4
    """)
    inputs = config_inputs(cfg)  # measured from the config's (tiny) model and data by the CLI
    out = predict(cfg, Profile(hardware="cpu", efficiency=Efficiency()), inputs, num_steps=10, cores=2, poll_s=0.05)
    assert out["calls_per_step"] == 2 and out["call_batch"] == 8 and out["response_tokens"] == 8
    assert out["prompt_tokens"] > 3  # "a+b=" in the chat template
    assert out["framework"]["reward_score_s"]["sync"] > 0  # the config's reward function, timed
    sync, async_ = out["modes"]["sync"], out["modes"]["async"]
    assert async_["staleness"] == 1 and sync["staleness"] == 0
    assert 0 < async_["predicted_step_s"] <= sync["predicted_step_s"]
    assert sync["predicted_samples_per_s"] == pytest.approx(16 / sync["predicted_step_s"])
    # dynamic sampling over-samples: the rollout generates twice the groups per step, the trainer trains as many
    over = msgspec.structs.replace(cfg, algorithm=msgspec.structs.replace(cfg.algorithm, dynamic_sampling=True))
    out2 = predict(over, Profile(hardware="cpu", efficiency=Efficiency()), inputs, num_steps=10, cores=2, poll_s=0.05)
    assert out2["calls_per_step"] == 4
    assert out2["modes"]["sync"]["predicted_step_s"] > sync["predicted_step_s"]


def test_the_cli_predicts_with_the_rollout_actors_own_gated_wait(monkeypatch):
    """The planner knows no actor: `afctl predict` passes it the rollout's wait
    (actors/rollout/actor.py: ANNOUNCE_WAIT_S), the one value the actor itself waits."""
    from asyncflow.actors import rollout
    from asyncflow.cli import predict as cli_predict

    seen = {}
    monkeypatch.setattr(cli_predict, "config_inputs", lambda cfg: None)
    monkeypatch.setattr(cli_predict, "planner_predict", lambda *a, **kw: seen.update(kw) or {})
    monkeypatch.setattr(rollout, "ANNOUNCE_WAIT_S", 0.123)
    cli_predict.predict(None, None, cores=2)
    assert seen["poll_s"] == 0.123
