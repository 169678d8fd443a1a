"""Every name the RL roles use for each other, in one place: actor names in the
directory, queue task names, and the names of numbered replicas.

Import these instead of writing the literal: a renamed role then breaks at import
time, not in the middle of a run. (A role's other facts, its actor class, columns
and restart rule, live in its module's ``RoleSpec``.)
"""

from __future__ import annotations

# -- actor names (the directory's keys) ------------------------------------------------------
LOADER = "loader"
ROLLOUT = "rollout"  # replicas are rollout.0, rollout.1, ...
REWARD = "reward"  # reward.0, ...
REFERENCE = "reference"  # reference.0, ...
REWARD_MODEL = "reward_model"  # reward_model.0, ... ([reward_model])
TRAINER = "trainer"  # rank 0; ranks 1.. are trainer.1, ...
TRAINER_RANK = "trainer_rank"  # the role of ranks 1.. (named trainer.<r>)
WEIGHTS = "weights"  # the weight sync, in the trainer's process
COLLECTOR = "collector"  # in the driver
PLANNER = "planner"  # in the driver, with [planner] online = true

# -- queue tasks (a controller each: tq.controller.<task>) -------------------------------------
TASK_ROLLOUT = "rollout"
TASK_REWARD = "reward"
TASK_REFERENCE = "reference"
TASK_REWARD_MODEL = "reward_model"
TASK_TRAIN = "train"


def replica(role: str, index: int) -> str:
    """The name of replica ``index`` of a replicated role: ``rollout.3``, ``trainer.1``."""
    return f"{role}.{index}"


def role_of(name: str) -> str:
    """The role a replica's name belongs to: ``rollout.3`` -> ``rollout``; a name
    without an index is its own role."""
    head, _, index = name.rpartition(".")
    return head if head and index.isdigit() else name
