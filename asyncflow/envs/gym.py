"""Gymnasium-style text environments as asyncflow environments (no extra needed).

Any object with the gymnasium API over text actions runs as an ``Environment``:

    reset(*, seed, options) -> (observation, info)
    step(action: str)       -> (observation, reward, terminated, truncated, info)

a ``gymnasium.Env`` with a ``spaces.Text`` action space, or a plain class of your own.
``GymTextEnvironment.make`` builds one per trajectory (in ``reset``, so the probe
``load_env_factory`` makes costs nothing); ``gym_env(make)`` is the same as a class:

    # my_envs.py                      env.path = "my_envs:Wordle"
    Wordle = gym_env(lambda: gymnasium.make("MyWordle-v0"))

Mapping (docs/environments.md, "Hub environments"):
- ``reset``: ``seed`` is a digest of the prompt's text, so the members of a GRPO group
  (one prompt) start from the same state and different prompts from different ones;
  ``options`` is ``None`` unless given (``options(sample)``: e.g. the dataset's answer).
  The observation it returns is inserted after the prompt, before the first turn.
- ``step``: the turn's text is the action; ``terminated or truncated`` ends the
  trajectory (``finish`` 1; ``info["truncated"]`` says which), the reward is the step's,
  ``info["tool_calls"]`` counts as in any environment. The wrapped env is closed when
  its trajectory ends, or when the driver drops a trajectory it ended (the turn limit).
- An observation that is a string is a tool message; ``None`` or ``""`` inserts nothing;
  anything else is inserted as ``str(obs)`` (override ``render``).
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Callable
from typing import Any

from asyncflow.envs.base import Action, Environment, Observation, Sample, Step


def prompt_seed(sample: Sample) -> int:
    """A stable 31-bit seed of the prompt's text (the same in every process)."""
    return zlib.crc32(sample.prompt.encode()) & 0x7FFFFFFF


class GymTextEnvironment(Environment):
    """One trajectory over a gymnasium-style text env. Subclasses implement ``make``
    (and may override ``seed``, ``options``, ``render``)."""

    env: Any = None
    """The wrapped env, made by ``reset``."""

    def make(self) -> Any:
        """A new gymnasium-style env (one per trajectory)."""
        raise NotImplementedError(f"{type(self).__name__}.make: return the gymnasium-style env this trajectory plays")

    def seed(self, sample: Sample) -> int | None:
        return prompt_seed(sample)

    def options(self, sample: Sample) -> dict[str, Any] | None:
        return None

    def render(self, observation: Any) -> Observation:
        if observation is None or isinstance(observation, str):
            return observation
        return str(observation)

    def reset(self, sample: Sample) -> Observation:
        self.env = self.make()
        if not callable(getattr(self.env, "reset", None)) or not callable(getattr(self.env, "step", None)):
            raise TypeError(
                f"{type(self).__name__}.make returned a {type(self.env).__name__}, which lacks reset() or step(): "
                "return an env with the gymnasium API (reset(seed=, options=) and step(text))"
            )
        self.closer = weakref.finalize(self, getattr(self.env, "close", lambda: None))  # once: at done, or when dropped
        out = self.env.reset(seed=self.seed(sample), options=self.options(sample))
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                f"{type(self.env).__name__}.reset returned {type(out).__name__}: a gymnasium-style env returns "
                "(observation, info)"
            )
        return self.render(out[0])

    def close(self) -> None:
        """The trajectory ended however it ended (the driver's call): what ``reset`` opened is
        closed now rather than at garbage collection (once: the finalizer runs at most once)."""
        closer = getattr(self, "closer", None)
        if closer is not None:
            closer()

    def step(self, action: Action) -> Step:
        out = self.env.step(action.text)
        if not (isinstance(out, tuple) and len(out) == 5):
            raise TypeError(
                f"{type(self.env).__name__}.step returned {type(out).__name__} of {len(out) if isinstance(out, tuple) else 1}: "
                "a gymnasium-style env returns (obs, reward, terminated, truncated, info); the old gym 4-tuple "
                "(obs, reward, done, info) needs a wrapper"
            )
        observation, reward, terminated, truncated, info = out
        done = bool(terminated) or bool(truncated)
        info = {**(info or {}), "truncated": bool(truncated) and not bool(terminated)}
        if done:
            self.closer()
        return Step(observation=None if done else self.render(observation), reward=float(reward), done=done, info=info)


def gym_env(
    make: Callable[[], Any],
    *,
    options: Callable[[Sample], dict[str, Any] | None] | None = None,
    name: str | None = None,
) -> type[GymTextEnvironment]:
    """A ``GymTextEnvironment`` class (a zero-argument factory, for ``env.path``) whose
    ``make`` calls ``make()``; ``options(sample)``, if given, is passed to each reset."""
    body: dict[str, Any] = {"make": lambda self: make()}
    if options is not None:
        body["options"] = lambda self, sample: options(sample)
    made = getattr(make, "__name__", "")
    return type(name or (f"Gym{made}" if made.isidentifier() else "GymEnv"), (GymTextEnvironment,), body)
