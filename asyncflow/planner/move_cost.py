"""What an online move costs the run, against what it saves in the steps left
(docs/planner.md, "What a move costs"). Pure: no I/O.

A move is not free: a new rollout replica is a process that imports torch and builds
its engine, and on shared cores it takes that CPU from the roles that are running, so
the steps while it starts are slower. A move is worth making only when the time it
saves over the steps left once it is in place exceeds that cost:

    net = (steps_left - wall_s / step_s) x (step_s - step_s_after) - cost_s

- ``cost_s``: run seconds lost while the move is carried out: the steps it straddled
  (from the decision to the first step under the new split) took that much longer
  than the steps that motivated it. Before a move of that direction has been made,
  the planner's prior (``planner.move_cost_s``) stands for both ``cost_s`` and
  ``wall_s``; after, the measured figures do.
- ``wall_s``: run seconds from the decision to the move in place: steps still made
  under the old split.

A move whose measured gain comes out negative is reversed (``reverse``) and its
direction is not tried again in the run: the planner's model missed something the
machine has (other jobs on the cores, a slower spawn), and trying again would pay the
cost again for the same result.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from asyncflow.planner.online import MoveDecision, Split, StepObservation


class MoveCost(msgspec.Struct, frozen=True):
    cost_s: float  # run seconds lost while the move is carried out
    wall_s: float  # run seconds from the decision to the move in place
    measured: bool  # False: the prior (planner.move_cost_s)


def net_gain_s(decision: MoveDecision, steps_left: int, cost: MoveCost) -> float:
    """Run seconds the move saves over the ``steps_left`` steps after its decision, less its cost."""
    step_s = decision.predicted_step_s_before
    if step_s <= 0:
        return -cost.cost_s
    in_place = max(0.0, steps_left - cost.wall_s / step_s)
    return in_place * (step_s - decision.predicted_step_s_after) - cost.cost_s


def measured_cost(before: Sequence[StepObservation], during: Sequence[StepObservation], wall_s: float) -> MoveCost:
    """The extra run time of the steps a move straddled (``during``), over the mean of
    the steps that motivated it (``before``); a step that came out faster costs nothing."""
    if not before:
        raise ValueError("measured_cost needs the steps before the move")
    mean_before = sum(o.step_s for o in before) / len(before)
    extra = sum(o.step_s - mean_before for o in during)
    return MoveCost(cost_s=max(0.0, extra), wall_s=wall_s, measured=True)


def reverse(decision: MoveDecision, split_before: Split, step_s_before: float, step_s_after: float) -> MoveDecision:
    """The move back to ``split_before``, for a move after which steps took ``step_s_after``
    against ``step_s_before`` before it (measured, not predicted)."""
    return MoveDecision(
        from_role=decision.to_role,
        to_role=decision.from_role,
        num_workers=decision.num_workers,
        split_after=split_before,
        predicted_step_s_before=step_s_after,
        predicted_step_s_after=step_s_before,
        predicted_gain=step_s_after / step_s_before - 1 if step_s_before > 0 else 0.0,
        reason=(
            f"revert: after {decision.num_workers} {decision.from_role} -> {decision.to_role} a step took "
            f"{step_s_after:.3f} s against {step_s_before:.3f} s before it"
        ),
    )
