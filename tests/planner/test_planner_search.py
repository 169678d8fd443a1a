"""The allocation search: plans fit, infeasible ones are explained, large clusters are planned."""

import pytest

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import Workload, forward_cost, rollout_cost, train_cost
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS
from asyncflow.planner.search import granularity, search, speedup


def _roles_of(plan, model, hw, wl):
    eff = Efficiency()
    yield rollout_cost(model, hw, eff, wl, plan.rollout_devices, plan.rollout_tp)
    colocated_ref = wl.use_reference and plan.reference_devices == 0
    yield train_cost(model, hw, eff, wl, plan.train_devices, plan.train_tp, plan.train_pp, colocated_ref)
    if plan.reference_devices:
        yield forward_cost(model, hw, eff, wl, plan.reference_devices, plan.reference_tp)


@pytest.mark.parametrize("model,hw,n", [("32b", "910b", 64), ("7b", "h100", 16), ("72b", "a100", 128), ("14b", "h200", 24)])
def test_the_search_never_returns_a_plan_that_does_not_fit(model, hw, n):
    m, h, wl = PRESETS[model], get_hardware(hw), Workload()
    result = search(m, h, wl, n)
    assert result.plans
    for plan in result.plans:
        assert plan.rollout_devices + plan.train_devices + plan.reference_devices == n
        assert plan.rollout_devices % plan.rollout_tp == 0
        assert plan.train_tp * plan.train_pp * plan.train_dp == plan.train_devices
        for role in _roles_of(plan, m, h, wl):
            assert role.feasible, role.reason
            assert role.peak_memory_bytes <= role.memory_available_bytes
        assert plan.peak_memory_bytes <= h.memory_bytes * h.usable_memory_fraction


@pytest.mark.parametrize("model,n", [("llama3-70b", 64), ("7b", 24), ("qwen3-30b-a3b", 40)])
def test_every_training_rank_gets_the_same_number_of_samples(model, n):
    """The trainer refuses a step whose rows do not split evenly over its ranks: a plan
    with data-parallel size 18 for 2048 samples could not run."""
    wl = Workload()
    result = search(PRESETS[model], get_hardware("h100"), wl, n)
    assert result.plans
    for plan in [*result.plans, result.sync]:
        assert plan is not None and wl.num_samples % plan.train_dp == 0, (plan.train_dp, wl.num_samples)


@pytest.mark.parametrize("model,n,prompts,samples", [("7b", 64, 12, 8), ("7b", 32, 12, 16), ("llama3-8b", 64, 48, 16)])
def test_every_training_rank_trains_whole_prompt_groups(model, n, prompts, samples):
    """The trainer gives each rank whole prompt groups (``prompts_per_step`` a multiple of
    ``train.num_ranks``, config/train.py): 12 prompts x 8 samples split over dp 16 gives
    every rank 6 samples, but 16 ranks cannot take 12 groups whole. Every plan's (and the
    sync and colocated alternatives') data-parallel degree divides the prompts."""
    wl = Workload(prompts_per_step=prompts, samples_per_prompt=samples)
    result = search(PRESETS[model], get_hardware("h100"), wl, n)
    assert result.plans
    for plan in [*result.plans, result.sync, result.colocated]:
        assert plan is None or prompts % plan.train_dp == 0, (plan.mode, plan.train_dp, prompts)


def test_plans_come_best_first_with_consistent_rates():
    wl = Workload()
    result = search(PRESETS["7b"], get_hardware("h100"), wl, 64)
    steps = [p.predicted_step_s for p in result.plans]
    assert steps == sorted(steps)
    best = result.plans[0]
    assert best.predicted_samples_per_s == pytest.approx(wl.num_samples / best.predicted_step_s)
    assert best.bottleneck in best.stage_s


def test_infeasible_allocations_are_explained_with_the_memory_that_is_short():
    result = search(PRESETS["32b"], get_hardware("910b"), Workload(), 32)
    assert result.num_infeasible_splits > 0
    assert result.infeasible
    for item in result.infeasible:
        assert item.short_bytes > 0
        assert item.needed_bytes == pytest.approx(item.available_bytes + item.short_bytes)
        assert "short by" in item.reason and "GiB" in item.reason
    # Trainers of a 32B model on very few NPUs run out of room for the optimizer state.
    assert any(i.role == "train" and "model_states" in i.reason for i in result.infeasible)


def test_a_cluster_too_small_for_the_model_returns_no_plan_but_the_reasons():
    result = search(PRESETS["72b"], get_hardware("910b"), Workload(), 4)
    assert result.plans == []
    assert {i.role for i in result.infeasible} >= {"train"}


def test_async_is_predicted_faster_than_the_best_synchronous_alternative():
    for model, n in (("7b", 32), ("32b", 256)):
        result = search(PRESETS[model], get_hardware("910b"), Workload(), n)
        assert speedup(result) > 1.0
        assert result.colocated is not None and result.colocated.mode == "colocated"


def test_1024_devices_are_planned_at_node_granularity():
    hw = get_hardware("910b")
    assert granularity(1024, hw) == 8
    assert granularity(64, hw) == 1
    result = search(PRESETS["72b"], hw, Workload(), 1024)
    assert result.granularity == 8
    assert all(p.rollout_devices % 8 == 0 for p in result.plans)


def test_too_few_devices_say_what_to_change():
    with pytest.raises(ValueError, match="at least 2"):
        search(PRESETS["0.5b"], get_hardware("cpu"), Workload(), 1)
