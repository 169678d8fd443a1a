"""The environment interface: what a multi-turn rollout talks to between model turns.

A trajectory is driven by ``actors/rollout/multiturn.py``: ``reset(sample)`` once, then,
after each model turn, ``step(action)`` with the turn's text and its exact token
ids; the returned observation is appended to the context (never to the loss) and
the model takes the next turn, until ``done`` or ``env.max_turns``.

Invariants:
- An environment instance serves one trajectory; the driver makes one per
  trajectory (``factory()``) and calls it from one thread at a time (a pool thread,
  never the engine's), so an instance needs no locks.
- An observation is text (rendered as a tool message through the model's chat
  template, ``envs/render.py``) or token ids (inserted exactly as given).
- Rewards are per step; the driver sums them with ``env.discount`` per turn
  (1: plain sum) into the row's ``env_reward``.
- ``close()`` ends every trajectory whose calls all returned, once (not one that
  timed out: the instance may still be inside its call).
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Observation = str | list[int] | None
"""Text (a tool message), exact token ids, or None (nothing to insert)."""


@dataclass(frozen=True)
class Sample:
    """One prompt as the queue holds it."""

    prompt: str
    """The prompt's text (its ids decoded, special tokens dropped)."""
    prompt_ids: list[int]
    """The exact ids the model sees first (chat template applied by the loader)."""
    answer: str
    """The dataset's ``answer`` field."""


@dataclass(frozen=True)
class Action:
    """One model turn."""

    text: str
    """The turn decoded, special tokens (the stop token) dropped."""
    ids: list[int]
    """The exact ids the model produced, the stop token included."""
    truncated: bool = False
    """The turn hit ``rollout.sampling.max_new_tokens`` without a stop token."""


@dataclass(frozen=True)
class Step:
    """What ``Environment.step`` returns."""

    observation: Observation = None
    """Appended to the context before the next turn (ignored when ``done``)."""
    reward: float = 0.0
    """This step's reward."""
    done: bool = False
    """The trajectory is over."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form; ``tool_calls`` (an int) is counted into the ``env_tool_calls`` column."""


class Environment(abc.ABC):
    """One trajectory's environment. Subclasses implement ``reset`` and ``step``."""

    tokenizer: Any = None
    """The model's tokenizer, set by ``bind`` before ``reset``."""

    def bind(self, tokenizer: Any) -> None:
        """Called once by the driver before ``reset``: the model's tokenizer (e.g. to
        pick the tool-call format from its chat template)."""
        self.tokenizer = tokenizer

    @abc.abstractmethod
    def reset(self, sample: Sample) -> Observation:
        """Start a trajectory on ``sample``. Returns an observation inserted after the
        prompt before the first turn (None: the model answers the prompt as is)."""

    @abc.abstractmethod
    def step(self, action: Action) -> Step:
        """The model took a turn: answer it. Raising ends the trajectory with an error
        (reward 0, ``env_error`` set); so does taking longer than ``env.step_timeout_s``."""

    def close(self) -> None:  # noqa: B027  (optional: most environments hold nothing)
        """The trajectory ended (done, the turn limit, no room left, an error in
        ``reset`` or ``step``): free what the environment holds (a sandbox, a connection,
        a subprocess). Called once, on the pool, after its last call returned; its
        errors are logged and counted (the driver's ``close_errors``). Not called when a call
        timed out, since the environment may still be inside it: such an instance is
        dropped, and only garbage collection reaches it."""


def load_env_factory(spec: str) -> Callable[[], Environment]:
    """The class (or zero-argument function) ``package.module:Name`` that makes one
    environment per trajectory, checked by making one."""
    if ":" not in spec:
        raise ValueError(f"env.path = {spec!r}: use 'package.module:Name' (a class or function returning an Environment)")
    module_name, attr = spec.split(":", 1)
    factory = getattr(importlib.import_module(module_name), attr, None)
    if factory is None or not callable(factory):
        raise ValueError(f"env.path = {spec!r}: module {module_name!r} has no callable {attr!r}")
    try:
        probe = factory()
    except TypeError as exc:
        raise ValueError(
            f"env.path = {spec!r} cannot be called without arguments ({exc}); name a class or function that can"
        ) from None
    if not isinstance(probe, Environment):
        raise ValueError(
            f"env.path = {spec!r} made a {type(probe).__name__}, not an asyncflow.envs.Environment: subclass it "
            "and implement reset(sample) and step(action)"
        )
    return factory
