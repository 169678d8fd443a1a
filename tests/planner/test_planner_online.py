"""The online planner's pure move decision, with hysteresis."""

import pytest

from asyncflow.planner.online import (
    OnlinePolicy,
    RoleWindow,
    Split,
    StepObservation,
    decide,
    measured_gain,
    predict_step_s,
)


def _obs(step, rollout_busy, train_busy, step_s=10.0, train_queue=0.0):
    return StepObservation(
        step=step,
        step_s=step_s,
        rollout=RoleWindow(busy_fraction=rollout_busy),
        train=RoleWindow(busy_fraction=train_busy, queue_depth=train_queue),
    )


def test_trainers_waiting_on_rollout_for_several_steps_move_a_worker_to_rollout():
    history = [_obs(s, 1.0, 0.4) for s in range(3)]
    move = decide(history, Split(rollout_workers=2, train_workers=4))
    assert move is not None
    assert (move.from_role, move.to_role, move.num_workers) == ("train", "rollout", 1)
    assert move.split_after == Split(rollout_workers=3, train_workers=3)
    # Work: rollout 1.0 x 2 x 10 = 20 worker-s, train 0.4 x 4 x 10 = 16; bound now 10 s, after max(20/3, 16/3).
    assert move.predicted_step_s_after == pytest.approx(10.0 * (20 / 3) / 10.0)
    assert move.predicted_gain == pytest.approx(10.0 / (20 / 3) - 1)
    assert "waited on rollout" in move.reason


def test_rollout_waiting_on_training_moves_a_worker_to_training():
    history = [_obs(s, 0.3, 0.95) for s in range(4)]
    move = decide(history, Split(rollout_workers=4, train_workers=2))
    assert move is not None and move.to_role == "train" and move.split_after.train_workers == 3


def test_no_move_before_the_imbalance_has_lasted_the_patience():
    history = [_obs(0, 0.9, 0.9), _obs(1, 1.0, 0.4), _obs(2, 1.0, 0.4)]
    assert decide(history, Split(rollout_workers=2, train_workers=4)) is None
    assert decide(history[1:], Split(rollout_workers=2, train_workers=4)) is None  # too few steps


def test_no_move_right_after_a_move():
    history = [_obs(s, 1.0, 0.4) for s in range(5)]
    split = Split(rollout_workers=2, train_workers=4)
    assert decide(history, split, steps_since_last_move=1) is None
    assert decide(history, split, steps_since_last_move=3) is not None


def test_balanced_roles_and_small_gaps_do_not_move():
    split = Split(rollout_workers=2, train_workers=2)
    assert decide([_obs(s, 0.8, 0.7) for s in range(5)], split) is None


def test_a_move_that_would_not_pay_is_not_made():
    # Rollout busier, but moving one of two trainers would make training the bottleneck.
    history = [_obs(s, 0.9, 0.65) for s in range(3)]
    assert decide(history, Split(rollout_workers=8, train_workers=2)) is None


def test_a_role_never_drops_below_its_minimum_or_moves_part_of_an_instance():
    history = [_obs(s, 1.0, 0.1) for s in range(3)]
    assert decide(history, Split(rollout_workers=1, train_workers=1)) is None
    policy = OnlinePolicy(max_move_workers=4, train_worker_granularity=2)
    move = decide(history, Split(rollout_workers=2, train_workers=6), policy)
    assert move is not None and move.num_workers % 2 == 0 and move.split_after.train_workers >= 1


def test_a_deep_training_queue_vetoes_a_move_away_from_training():
    policy = OnlinePolicy(shallow_queue_rows=8)
    history = [_obs(s, 1.0, 0.4, train_queue=64) for s in range(3)]
    assert decide(history, Split(rollout_workers=2, train_workers=4), policy) is None


def test_prediction_keeps_the_step_when_the_split_is_unchanged():
    history = [_obs(s, 1.0, 0.5) for s in range(3)]
    split = Split(rollout_workers=2, train_workers=2)
    assert predict_step_s(history, split, split) == (10.0, 10.0)


def test_the_measured_gain_compares_mean_steps_before_and_after_a_move():
    before = [_obs(s, 1.0, 0.4, step_s=12.0) for s in range(3)]
    after = [_obs(s, 0.9, 0.8, step_s=8.0) for s in range(3, 6)]
    assert measured_gain(before, after) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="at least one step"):
        measured_gain(before, [])


def test_repeated_decisions_move_an_unbalanced_pipeline_to_the_balanced_split_and_stop():
    # A synthetic async pipeline: 30 worker-seconds of rollout and 30 of training per step.
    work_r = work_t = 30.0
    split = Split(rollout_workers=1, train_workers=5)
    history, last_move, moves = [], None, []
    for step in range(20):
        step_s = max(work_r / split.rollout_workers, work_t / split.train_workers)
        history.append(
            StepObservation(
                step=step,
                step_s=step_s,
                rollout=RoleWindow(busy_fraction=work_r / split.rollout_workers / step_s),
                train=RoleWindow(busy_fraction=work_t / split.train_workers / step_s),
            )
        )
        since = None if last_move is None else step - last_move
        move = decide(history, split, steps_since_last_move=since)
        if move is not None:
            assert move.predicted_gain > 0
            moves.append((step, move.split_after))
            split, last_move = move.split_after, step
    assert split == Split(rollout_workers=3, train_workers=3)
    assert [s for _, s in moves] == [Split(rollout_workers=2, train_workers=4), Split(rollout_workers=3, train_workers=3)]
    assert moves[1][0] - moves[0][0] >= 3  # hysteresis between moves
