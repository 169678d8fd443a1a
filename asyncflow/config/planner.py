"""``[planner]``: the cost model's inputs (``afctl plan``)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.engines.config import (
    Count,
    NonNegFloat,
    NonNegInt,
)


class PlannerConfig(Section):
    """The planner actor (online reallocation; docs/planner.md)."""

    online: Annotated[bool, Meta(description="Move worker processes between rollout and training during the run.")] = False
    imbalance_threshold: Annotated[
        NonNegFloat,
        Meta(
            description="Busy-fraction gap (rollout - training) beyond which one side counts as waiting on the other in a step."
        ),
    ] = 0.2
    patience_steps: Annotated[
        Count, Meta(description="Steps in a row that must lean the same way before a move, and steps between moves.")
    ] = 3
    min_gain: Annotated[NonNegFloat, Meta(description="Predicted step-time gain (fraction) a move must bring to be made.")] = 0.05
    max_rollout_replicas: Annotated[
        Count,
        Meta(
            description="Most rollout replica processes the online planner may run (it never adds beyond); "
            "with ``online = false`` it limits nothing."
        ),
    ] = 4
    train_threads: Annotated[
        NonNegInt,
        Meta(
            description="torch threads of the trainer at start (its workers, the ones the planner moves to rollout); 0: "
            "cluster.threads_per_process."
        ),
    ] = 0
    measure_steps: Annotated[
        Count, Meta(description="Steps after a move over which its measured gain is recorded in planner.jsonl.")
    ] = 3
    move_cost_s: Annotated[
        NonNegFloat,
        Meta(
            description="Run seconds a move that adds a rollout replica is taken to cost before one has been made (a new "
            "process imports torch and builds its engine on the cores the roles share: about 20 s on a 2-core box). A move is "
            "made only when the time it saves over the steps left exceeds its cost; after a move the measured cost "
            'replaces this (docs/planner.md, "What a move costs").'
        ),
    ] = 20.0
    cores: Annotated[
        NonNegInt,
        Meta(
            description="With cluster.device = cpu: the cores every process shares (0: all of this machine's). There the planner adds "
            'or removes rollout replicas and never gives the trainer threads (docs/planner.md, "online reallocation on a '
            'CPU box").'
        ),
    ] = 0
