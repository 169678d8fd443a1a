"""The trainer's step shapes, one ``StepSource`` per module (``base.py`` says what one is).

``SOURCES`` lists them; a run's config asks for at most one (``StepSource.wanted``), and
the rest of the time a step is ``WholeStep``'s: the rows planned for it. A new shape is
its module and one line here. ``check_step_shape`` refuses, before any process starts
(``driver/preflight.py``), a config that asks for two shapes or for what its shape
cannot do, naming the key to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncflow.actors.trainer.sources.base import Batch, StepContext, StepSource, Trained
from asyncflow.actors.trainer.sources.dynamic import DynamicSampling
from asyncflow.actors.trainer.sources.sessions import GatewaySessions
from asyncflow.actors.trainer.sources.streamed import StreamedStep
from asyncflow.actors.trainer.sources.whole import WholeStep
from asyncflow.config.load import ConfigError

if TYPE_CHECKING:
    from asyncflow.config.run import RunConfig

__all__ = ["SOURCES", "Batch", "StepContext", "StepSource", "Trained", "WholeStep", "check_step_shape", "source_for"]

SOURCES: list[type[StepSource]] = [
    GatewaySessions,
    StreamedStep,
    DynamicSampling,
]
"""The step shapes a config asks for by a key (``StepSource.key``); none asked: ``WholeStep``."""


def source_for(cfg: RunConfig) -> type[StepSource]:
    """The step shape of this run, refusing (``ConfigError``, naming the key and the fix)
    a config that asks for two or for what its shape cannot do."""
    wanted = [s for s in SOURCES if s.wanted(cfg)]
    if len(wanted) > 1:
        first, second = wanted[0], wanted[1]
        raise ConfigError(
            f"{second.key} = true: a step has one shape, and {first.key} = true asks for another; "
            f"set {second.key} = false (or {first.key} = false)"
        )
    source = wanted[0] if wanted else WholeStep
    for refused, why in source.refusals(cfg):
        if refused:
            raise ConfigError(f"{source.key} = True: {why}")
    return source


def check_step_shape(cfg: RunConfig) -> None:
    """``source_for``'s refusals, for the driver's checks before launch."""
    source_for(cfg)
