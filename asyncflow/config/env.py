"""``[env]``: multi-turn environments and tools."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.engines.config import (
    Count,
    Fraction,
    NonNegInt,
    Seconds,
)


class EnvConfig(Section):
    """Multi-turn environments (docs/environments.md): each rollout row becomes a
    trajectory of model turns and environment steps. Off while ``path`` is empty."""

    path: Annotated[
        str,
        Meta(
            description="The environment, ``package.module:Name`` (a class or zero-argument function making an "
            "``asyncflow.envs.Environment``), importable on every rollout host (and the trainer's with ``[eval]``: held-out "
            "episodes run there); e.g. ``asyncflow.envs.calc:CalcEnv``. "
            "Empty: single-turn rollouts (no environment)."
        ),
    ] = ""
    max_turns: Annotated[
        Count, Meta(description="Most model turns per trajectory; one that reaches it ends unfinished (``finish`` 0).")
    ] = 4
    step_timeout_s: Annotated[
        Seconds,
        Meta(
            description="Longest an ``env.reset`` or ``env.step`` call may take; past it the trajectory ends with an error "
            "(``env_error`` 1, reward 0) and the run goes on."
        ),
    ] = 30.0
    discount: Annotated[
        Fraction,
        Meta(
            description="Per-turn discount of the step rewards summed into ``env_reward``: turn t counts discount^t (1: a plain sum)."
        ),
    ] = 1.0
    reward: Annotated[
        Literal["add", "replace"],
        Meta(
            description="How the reward role uses ``env_reward``: ``add``: reward functions' sum + env_reward; ``replace``: "
            "env_reward alone (the functions are not called). A row whose environment failed gets 0 either way."
        ),
    ] = "add"
    num_threads: Annotated[
        Count,
        Meta(
            description="Threads per rollout replica running environment calls (outside the engine's thread); a hung call "
            "holds its thread, so this bounds how many a replica survives."
        ),
    ] = 8
    max_context_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Longest trajectory (prompt + every turn + observations): a turn that could pass it is not started "
            "and the trajectory ends unfinished; an observation is cut in tokens to what it leaves for one more turn, "
            'with a marker the model reads (docs/environments.md, "Sizes"). 0: the model\'s context '
            "(max_position_embeddings), which bounds it anyway."
        ),
    ] = 0
    max_observation_chars: Annotated[
        NonNegInt,
        Meta(
            description="Longest observation (a tool's result) put into a trajectory: a text one is cut to this many "
            "characters before it is tokenised, with a marker saying so (``[observation cut: N chars, ...]``); one given "
            "as token ids, to this many ids. Counted (``observations_cut`` in the rollout's log). A 50 MB tool result "
            "once grew a rollout process to 19 GB. Then cut in tokens to what the context has left "
            "(``max_context_tokens``). 0: no limit in characters."
        ),
    ] = 16384
