"""A move's cost against what it saves in the steps left (an online move must never slow
a run down). Pure: planner.move_cost."""

from __future__ import annotations

import pytest

from asyncflow.planner.move_cost import MoveCost, measured_cost, net_gain_s, reverse
from asyncflow.planner.online import MoveDecision, RoleWindow, Split, StepObservation


def _decision(before_s: float = 10.0, after_s: float = 5.0) -> MoveDecision:
    return MoveDecision(
        from_role="train",
        to_role="rollout",
        num_workers=1,
        split_after=Split(rollout_workers=2, train_workers=1),
        predicted_step_s_before=before_s,
        predicted_step_s_after=after_s,
        predicted_gain=before_s / after_s - 1,
        reason="test",
    )


def _obs(step: int, step_s: float) -> StepObservation:
    return StepObservation(step=step, step_s=step_s, rollout=RoleWindow(busy_fraction=1.0), train=RoleWindow(busy_fraction=0.2))


def test_a_move_pays_only_over_the_steps_left_once_it_is_in_place_less_its_cost():
    # 5 s saved a step; the move takes 20 s (2 steps of 10 s) and costs 20 s of run time
    cost = MoveCost(cost_s=20.0, wall_s=20.0, measured=False)
    assert net_gain_s(_decision(), steps_left=27, cost=cost) == pytest.approx(25 * 5.0 - 20.0)
    assert net_gain_s(_decision(), steps_left=6, cost=cost) == pytest.approx(4 * 5.0 - 20.0)  # 0: not worth it
    assert net_gain_s(_decision(), steps_left=5, cost=cost) < 0
    assert net_gain_s(_decision(), steps_left=1, cost=cost) == pytest.approx(-20.0)  # never in place in time


def test_the_measured_cost_is_the_extra_time_of_the_steps_the_move_straddled():
    before = [_obs(1, 10.0), _obs(2, 10.0)]
    during = [_obs(3, 16.0), _obs(4, 13.0), _obs(5, 9.0)]  # the spawn took a core; the last step had the new replica
    cost = measured_cost(before, during, wall_s=35.0)
    assert cost == MoveCost(cost_s=8.0, wall_s=35.0, measured=True)
    assert measured_cost(before, [_obs(3, 8.0)], wall_s=1.0).cost_s == 0.0  # a faster step is no negative cost


def test_reversing_a_move_goes_back_to_the_split_before_it_at_the_measured_step_times():
    back = reverse(_decision(), Split(rollout_workers=1, train_workers=2), step_s_before=10.0, step_s_after=12.0)
    assert (back.from_role, back.to_role, back.num_workers) == ("rollout", "train", 1)
    assert back.split_after == Split(rollout_workers=1, train_workers=2)
    assert (back.predicted_step_s_before, back.predicted_step_s_after) == (12.0, 10.0)
    assert back.predicted_gain == pytest.approx(0.2)
    assert "12.000" in back.reason and "10.000" in back.reason
