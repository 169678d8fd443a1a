"""The planner counts a reward model served as its own role: its devices are taken
out of the split, its forward is a stage of every step, and its memory is checked."""

from __future__ import annotations

import msgspec
import pytest

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import RoleCost, Workload, async_step, forward_cost, reward_model_cost, sync_step
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS
from asyncflow.planner.search import search

H100 = get_hardware("h100")


def test_a_reward_model_forward_has_no_vocabulary_logits_and_costs_what_its_shape_costs():
    wl, eff = Workload(), Efficiency()
    rm = reward_model_cost(PRESETS["7b"], H100, eff, wl, 2, 1)
    ref = forward_cost(PRESETS["7b"], H100, eff, wl, 2, 1)
    assert rm.role == "reward_model" and rm.memory_bytes["logits"] == 0 < ref.memory_bytes["logits"]
    assert rm.time_s == pytest.approx(ref.time_s)  # the same forward over the step's tokens
    small = reward_model_cost(PRESETS["1.5b"], H100, eff, wl, 2, 1)
    assert small.time_s < rm.time_s and small.peak_memory_bytes < rm.peak_memory_bytes


def _role(name: str, time_s: float, latency_s: float | None = None) -> RoleCost:
    return RoleCost(role=name, devices=1, time_s=time_s, latency_s=time_s if latency_s is None else latency_s)


def test_a_slow_reward_model_is_the_bottleneck_of_an_async_step_and_a_phase_of_a_sync_one():
    rollout, train = _role("rollout", 10.0), _role("train", 8.0)
    fast = async_step(rollout, train, None, 1.0, 0.1, staleness=1)
    slow = async_step(rollout, train, None, 1.0, 0.1, staleness=1, reward_model=_role("reward_model", 30.0, 2.0))
    assert fast.bottleneck != "reward_model" and slow.bottleneck == "reward_model" and slow.step_s == 30.0
    # its latency rides the generate -> score -> train -> sync loop, beside the reference's (the later counts)
    loop = async_step(rollout, train, _role("reference", 1.0, 3.0), 1.0, 0.1, 0, reward_model=_role("rm", 1.0, 5.0))
    assert loop.stage_s["dependency"] == pytest.approx(10.0 + 5.0 + 8.0 + 1.0)
    base = sync_step(rollout, train, None, 1.0)
    with_rm = sync_step(rollout, train, None, 1.0, reward_model=_role("reward_model", 4.0))
    assert with_rm.step_s == pytest.approx(base.step_s + 4.0)


def test_search_gives_the_reward_model_its_own_devices_and_counts_its_stage_and_memory():
    wl = Workload(use_reference=False)
    without = search(PRESETS["7b"], H100, wl, 16)
    result = search(PRESETS["7b"], H100, wl, 16, reward_model=PRESETS["7b"], reward_model_devices=2)
    assert result.plans and result.sync is not None and result.colocated is not None
    for plan in [*result.plans, result.sync]:
        assert plan.reward_model_devices == 2
        assert plan.rollout_devices + plan.train_devices + plan.reference_devices == 14
        assert "reward_model" in plan.stage_s and "reward_model" in plan.memory_bytes
    assert all(p.reward_model_devices == 0 and "reward_model" not in p.stage_s for p in without.plans)
    # a 7B reward model on 2 devices scores every token of 2048 samples: the step waits for it
    assert result.plans[0].bottleneck == "reward_model"
    assert result.plans[0].predicted_step_s > without.plans[0].predicted_step_s
    assert "reward_model" in result.colocated.stage_s


def test_a_reward_model_too_large_for_its_devices_leaves_no_plan_and_says_why():
    big = msgspec.structs.replace(PRESETS["72b"], name="huge-rm")
    result = search(PRESETS["1.5b"], H100, Workload(), 8, reward_model=big, reward_model_devices=1)
    assert result.plans == [] and result.sync is None
    assert any(i.role == "reward_model" and i.short_bytes > 0 for i in result.infeasible)


def test_too_few_devices_beside_the_reward_model_are_refused():
    with pytest.raises(ValueError, match="beside the reward model's 2"):
        search(PRESETS["0.5b"], H100, Workload(), 3, reward_model=PRESETS["0.5b"], reward_model_devices=2)


def test_the_config_prediction_adds_the_reward_models_forward_to_the_reward_stage():
    from asyncflow.config.load import load_config_text
    from asyncflow.planner.calibration import Profile
    from asyncflow.planner.predict import ConfigInputs, predict

    cfg = load_config_text("[reward_model]\nenabled = true\n")
    base = ConfigInputs(model=PRESETS["0.5b"], prompt_tokens=8.0, reward_score_s={"sync": 0.01, "async": 0.01})
    with_rm = msgspec.structs.replace(base, reward_model=PRESETS["0.5b"])
    profile = Profile(hardware="cpu", efficiency=Efficiency())
    a = predict(cfg, profile, base, cores=2, num_steps=5, poll_s=0.05)
    b = predict(cfg, profile, with_rm, cores=2, num_steps=5, poll_s=0.05)
    assert a["reward_model_s"] == 0 < b["reward_model_s"]
    for mode in ("sync", "async"):
        assert b["modes"][mode]["stages"]["reward_s"] > a["modes"][mode]["stages"]["reward_s"]
    assert b["modes"]["sync"]["predicted_step_s"] > a["modes"]["sync"]["predicted_step_s"]
