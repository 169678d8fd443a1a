"""Every name the RL roles use for each other, in one place: actor names in the
directory, queue task names, and the names of numbered replicas.

Import these instead of writing the literal: a renamed role then breaks at import
time, not in the middle of a run. (A role's other facts, its actor class, columns,
restart rule, section and devices, live in its module's ``RoleSpec``.) They sit in the
config layer, below the roles, because the config refuses a ``[[roles]]`` entry that takes
one (``reserved``). A new built-in role needs no line here: the topology refuses a
``[[roles]]`` entry named like any role of ``BUILT_IN`` (``topology.custom_role``).
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
EVALUATOR = "evaluator"  # held-out evaluation in a process of its own ([eval] where)
WEIGHTS = "weights"  # the weight sync, in the trainer's process
COLLECTOR = "collector"  # in the driver
PLANNER = "planner"  # in the driver, with [planner] online = true
ROSTER = "roster"  # in the driver: the rollout replicas now, from the Supervisor

DISPLAY_ORDER = (LOADER, ROLLOUT, REWARD, REFERENCE, TRAINER, EVALUATOR)
"""The order tables and plots list roles in (``afctl`` views of a run; any other after them)."""

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


# -- what a custom role ([[roles]]) may not be called --------------------------------------------
RESERVED_NAMES = (LOADER, TRAINER, WEIGHTS, COLLECTOR, PLANNER, ROSTER, "directory", "queue")
"""Single actors and processes of the built-in roles and of the driver."""
RESERVED_PREFIXES = tuple(
    f"{role}." for role in (ROLLOUT, REWARD, REWARD_MODEL, REFERENCE, TRAINER, "tq", "host", "dist", "shard", "relay")
)
"""Prefixes of numbered replicas (``rollout.3``, ``trainer.1``) and of the queue's,
hosts', rendezvous' and weight relays' (``relay.rollout.3``) actors."""


def reserved(name: str) -> bool:
    """Whether ``name`` belongs to a built-in role or to the driver's machinery (a
    custom role's replicas are ``name.0``, ``name.1``: ``shard`` would take the queue
    shards' names)."""
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES) or f"{name}." in RESERVED_PREFIXES
