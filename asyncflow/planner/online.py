"""The online planner's decision: move workers between rollout and training, or not.

Pure: the caller (the planner actor in the workflow) passes the last steps'
observations and the current split; nothing is remembered here.

Rule, with hysteresis:
- a step leans one way when one role's busy fraction exceeds the other's by more
  than `imbalance_threshold` (the other waits on it), and the training queue agrees
  (a starving trainer has a shallow queue; a drowning one a deep queue);
- only when each of the last `patience_steps` steps leans the same way, and at least
  `patience_steps` steps have passed since the last move, is a move considered;
- the move (1 .. `max_move_workers` workers, in multiples of the donor's worker
  granularity, never below `min_workers`) is the one with the smallest predicted
  step, and it is made only if the predicted gain is at least `min_gain`.

Prediction: a role's work per step in worker-seconds is busy x workers x step time
(averaged over the window); with w workers its time is work / w; an asynchronous step
is bound by the slower role, so step_after = step_now x max_role(work/w') / max_role(work/w).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec


class RoleWindow(msgspec.Struct, kw_only=True, frozen=True):
    busy_fraction: float  # time computing / step time, 0..1
    queue_depth: float = 0.0  # rows ready for this role, not yet consumed (end of step)


class StepObservation(msgspec.Struct, kw_only=True, frozen=True):
    step: int
    step_s: float
    rollout: RoleWindow
    train: RoleWindow


class Split(msgspec.Struct, kw_only=True, frozen=True):
    rollout_workers: int
    train_workers: int


class OnlinePolicy(msgspec.Struct, kw_only=True, frozen=True):
    imbalance_threshold: float = 0.2  # busy-fraction gap that counts as one role waiting on the other
    patience_steps: int = 3  # consecutive leaning steps before a move, and steps between moves
    min_gain: float = 0.05  # predicted step-time gain (fraction) a move must bring
    max_move_workers: int = 1
    min_workers: int = 1  # per role
    rollout_worker_granularity: int = 1  # e.g. devices per engine instance (tensor parallel degree)
    train_worker_granularity: int = 1
    shallow_queue_rows: float = float("inf")  # a starving trainer's queue holds at most this many rows (inf: not checked)
    deep_queue_rows: float = float("inf")  # a trainer with more rows waiting is the bottleneck (inf: not checked)


class MoveDecision(msgspec.Struct, kw_only=True, frozen=True):
    from_role: str
    to_role: str
    num_workers: int
    split_after: Split
    predicted_step_s_before: float
    predicted_step_s_after: float
    predicted_gain: float  # before / after - 1
    reason: str


def steady_lean(history: Sequence[StepObservation], policy: OnlinePolicy) -> str | None:
    """The side every one of the last ``patience_steps`` steps leans to, or None
    (too few steps, or they disagree, or one is balanced): the hysteresis."""
    k = policy.patience_steps
    if len(history) < k:
        return None
    leans = {lean(o, policy) for o in history[-k:]}
    return leans.pop() if len(leans) == 1 and None not in leans else None


def lean(obs: StepObservation, policy: OnlinePolicy) -> str | None:
    """'rollout' when the step needs more rollout workers, 'train' for more trainers, else None."""
    gap = obs.rollout.busy_fraction - obs.train.busy_fraction
    if gap > policy.imbalance_threshold and obs.train.queue_depth <= policy.shallow_queue_rows:
        return "rollout"
    if -gap > policy.imbalance_threshold or obs.train.queue_depth > policy.deep_queue_rows:
        return "train"
    return None


def predict_step_s(history: Sequence[StepObservation], split: Split, new_split: Split) -> tuple[float, float]:
    """(now, after) step times predicted from the window's measured work per role."""
    n = len(history)
    step_s = sum(o.step_s for o in history) / n
    work_r = sum(o.rollout.busy_fraction * o.step_s for o in history) / n * split.rollout_workers
    work_t = sum(o.train.busy_fraction * o.step_s for o in history) / n * split.train_workers
    bound_now = max(work_r / split.rollout_workers, work_t / split.train_workers)
    bound_after = max(work_r / new_split.rollout_workers, work_t / new_split.train_workers)
    if bound_now <= 0:
        return step_s, step_s
    return step_s, step_s * bound_after / bound_now


def decide(
    history: Sequence[StepObservation],
    split: Split,
    policy: OnlinePolicy | None = None,
    steps_since_last_move: int | None = None,
) -> MoveDecision | None:
    """A move of workers at the next step boundary, or None. `history`: oldest first."""
    policy = policy or OnlinePolicy()
    if steps_since_last_move is not None and steps_since_last_move < policy.patience_steps:
        return None
    to_role = steady_lean(history, policy)
    if to_role is None:
        return None
    k = policy.patience_steps
    window = list(history[-k:])
    from_role = "train" if to_role == "rollout" else "rollout"
    unit = policy.train_worker_granularity if from_role == "train" else policy.rollout_worker_granularity
    donor = split.train_workers if from_role == "train" else split.rollout_workers
    best: MoveDecision | None = None
    for num in range(unit, policy.max_move_workers + 1, unit):
        if donor - num < policy.min_workers:
            break
        delta = num if to_role == "rollout" else -num
        after = Split(rollout_workers=split.rollout_workers + delta, train_workers=split.train_workers - delta)
        before_s, after_s = predict_step_s(window, split, after)
        if best is None or after_s < best.predicted_step_s_after:
            gap = sum(o.rollout.busy_fraction - o.train.busy_fraction for o in window) / k
            best = MoveDecision(
                from_role=from_role,
                to_role=to_role,
                num_workers=num,
                split_after=after,
                predicted_step_s_before=before_s,
                predicted_step_s_after=after_s,
                predicted_gain=before_s / after_s - 1 if after_s > 0 else 0.0,
                reason=(
                    f"{from_role} waited on {to_role} for {k} steps (busy rollout - train = {gap:+.2f}, "
                    f"threshold {policy.imbalance_threshold})"
                ),
            )
    if best is None or best.predicted_gain < policy.min_gain:
        return None
    return best


def measured_gain(before: Sequence[StepObservation], after: Sequence[StepObservation]) -> float:
    """The effect of a move, to log beside its prediction: mean step before / mean step after - 1."""
    if not before or not after:
        raise ValueError("measured_gain needs at least one step before and one after the move")
    mean_before = sum(o.step_s for o in before) / len(before)
    mean_after = sum(o.step_s for o in after) / len(after)
    return mean_before / mean_after - 1
