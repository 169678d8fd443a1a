"""``cluster.toml``: ``RunConfig``, the typed schema of a whole run, made of the sections
of the modules beside it (config/__init__.py lists them), and the rules that need all of
it: ``validate`` (every section's ``check``) and ``check_paths``.

Every section is a msgspec Struct with defaults; unknown keys are errors. Each field
carries its rules and its documentation: ``Annotated[int, Meta(ge=1, description=...)]``
(msgspec checks the range while decoding). Rules between fields are one ``check``
method per section (core/schema.py); whether paths exist is checked after them, by
``check_paths``. A wrong key or value fails at load time (config/load.py) with the key's
dotted name and what to change:

    >>> load_config_text('[train]\\nnum_steps = 0')
    ConfigError: train.num_steps = 0: out of range; use a value >= 1 (in <string>; set it in [train]
    num_steps, or --set train.num_steps=...; docs/config.md says what it means)

Docs of every key: ``docs/config.md``, generated from the schema (descriptions,
types, defaults, ranges) by ``python -m asyncflow.config.docs --markdown``.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Annotated

import msgspec
from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.config.algorithm import AlgorithmConfig
from asyncflow.config.cluster import ClusterConfig, LoggingConfig
from asyncflow.config.env import EnvConfig
from asyncflow.config.model import DataConfig, ModelConfig
from asyncflow.config.names import reserved as reserved_role_name
from asyncflow.config.planner import PlannerConfig
from asyncflow.config.roles import (
    REWARD_MODEL_COLUMN,
    CriticConfig,
    ReferenceConfig,
    RewardConfig,
    RewardModelConfig,
    RoleEntry,
    RolloutConfig,
)
from asyncflow.config.train import EvalConfig, TrainConfig
from asyncflow.config.workflow import QueueConfig, WorkflowConfig
from asyncflow.core.schema import ConfigError, Refused, check_tree
from asyncflow.engines.config import (
    NonNegInt,
)

log = logging.getLogger(__name__)


class RunConfig(Section):
    """A whole run (one cluster.toml)."""

    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    reference: ReferenceConfig = msgspec.field(default_factory=ReferenceConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = msgspec.field(default_factory=RewardModelConfig)
    critic: CriticConfig = msgspec.field(default_factory=CriticConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    queue: QueueConfig = msgspec.field(default_factory=QueueConfig)
    workflow: WorkflowConfig = msgspec.field(default_factory=WorkflowConfig)
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    planner: PlannerConfig = msgspec.field(default_factory=PlannerConfig)
    roles: list[RoleEntry] = msgspec.field(default_factory=list)
    env: EnvConfig = msgspec.field(default_factory=EnvConfig)
    seed: Annotated[
        NonNegInt,
        Meta(
            description="Seed of the built-in tiny model and reward model, and of evaluation's sampling. Not of the data "
            "(``data.seed``: generation, shuffle, the held-out split) nor of the rollout's sampler "
            "(``rollout.engine.seed``): for another run of the same config, change those too."
        ),
    ] = 0

    @property
    def staleness(self) -> int:
        return 0 if self.workflow.mode == "sync" else self.workflow.staleness

    @property
    def data_from_gateway(self) -> bool:
        """The run trains on the gateway's rewarded sessions (``[rollout.gateway] train``):
        no prompt loader, no reward role, no rollout task."""
        return self.rollout.gateway.enabled and self.rollout.gateway.train

    @property
    def samples_per_step(self) -> int:
        return self.train.prompts_per_step * self.algorithm.group_size

    @property
    def groups_per_step(self) -> int:
        """Prompt groups the loader allocates (and the rollout generates) per step:
        ``prompts_per_step``, over-sampled with ``algorithm.dynamic_sampling``."""
        alg = self.algorithm
        if not alg.dynamic_sampling:
            return self.train.prompts_per_step
        return math.ceil(self.train.prompts_per_step * alg.dynamic_sampling_oversample - 1e-9)

    @property
    def rows_per_step(self) -> int:
        """Rows allocated per step: ``samples_per_step`` unless dynamic sampling over-samples."""
        return self.groups_per_step * self.algorithm.group_size

    @property
    def refill_rounds(self) -> int:
        """Dynamic sampling's refill rounds per step at most (0: no refill)."""
        alg = self.algorithm
        return alg.dynamic_sampling_max_rounds if alg.dynamic_sampling else 0

    @property
    def refill_headroom_rows(self) -> int:
        """Rows the loader leaves free when it allocates a new step, so that a refill
        round always fits: one round (``rows_per_step``) plus the informative rows a step
        may hold back while it waits (``samples_per_step``); 0 without refill."""
        return self.rows_per_step + self.samples_per_step if self.refill_rounds else 0

    @property
    def reward_columns(self) -> list[tuple[str, float]]:
        """The columns besides ``reward`` that the trainer waits for and adds to the reward,
        each with its weight: the ``reward_column`` of ``[[roles]]``, then ``rm_score``."""
        out = [(r.reward_column, r.reward_weight) for r in self.roles if r.reward_column]
        if self.reward_model.enabled:
            out.append((REWARD_MODEL_COLUMN, self.reward_model.weight))
        return out

    def check(self, run: RunConfig) -> None:
        """Rules across ``[[roles]]`` entries (each section checks its own keys)."""
        names = [r.name for r in self.roles]
        if len(names) != len(set(names)):
            raise Refused("roles.name", "role names must be unique", names)
        for r in self.roles:
            if reserved_role_name(r.name):
                raise Refused("roles.name", "this name belongs to a built-in role; choose another", r.name)
            if r.reward_column == REWARD_MODEL_COLUMN and self.reward_model.enabled:
                raise Refused("roles.reward_column", "the reward-model role puts this column: choose another", r.reward_column)
            if r.reward_column and not r.task:
                raise Refused(
                    "roles.reward_column",
                    f"role {r.name!r} must also set `task` (the queue task it reads rows from)",
                    r.reward_column,
                )


def validate(cfg: RunConfig) -> None:
    """The cross-field rules: every section's ``check``; the first one broken raises
    ConfigError naming the key, its value and the fix. (msgspec has checked each
    field's own constraints while decoding.) A run that trains on gateway sessions
    then gets its ``train.num_steps`` from ``rollout.gateway`` (``num_sessions``,
    ``until_stopped``)."""
    check_tree(cfg)
    cfg.train.num_steps = cfg.rollout.gateway.steps(cfg)


def check_paths(cfg: RunConfig) -> None:
    """What the schema cannot know: that ``model.path`` and ``data.path`` exist."""

    def refuse(key: str, value: str, fix: str) -> None:
        raise ConfigError(f"{key} = {value!r}: {fix}")

    if cfg.model.path:
        if not os.path.isdir(cfg.model.path):
            refuse(
                "model.path",
                cfg.model.path,
                "no such directory; give a local Hugging Face model directory "
                "(relative to the config file), or a checkpoint of a run (RUN_DIR/checkpoints/latest); "
                "a GGUF file becomes one with `afctl model import-gguf FILE DIR` "
                "(SmolLM2-135M: `afctl model import-gguf smollm2 DIR`; Gemma 3 270M: `afctl model import-gguf gemma3 DIR`)",
            )
        if not os.path.isfile(os.path.join(cfg.model.path, "config.json")):
            refuse(
                "model.path",
                cfg.model.path,
                "not a Hugging Face model directory (no config.json); give a "
                "directory saved with save_pretrained, or a checkpoint of a run (RUN_DIR/checkpoints/step_N or "
                "RUN_DIR/checkpoints/latest)",
            )
    rm = cfg.reward_model
    if rm.enabled and rm.path and not os.path.isfile(os.path.join(rm.path, "config.json")):
        refuse(
            "reward_model.path",
            rm.path,
            "not a Hugging Face model directory (no config.json); give a directory saved with save_pretrained "
            "(relative to the config file), or leave it empty for the tiny reward model",
        )
    if cfg.data.path and not os.path.isfile(cfg.data.path):
        refuse(
            "data.path", cfg.data.path, "no such file; give a .jsonl or .parquet file (relative to the config file, or absolute)"
        )


def _warn(cfg: RunConfig) -> None:
    """Loud warnings for configs that are valid but likely wrong."""
    alg = cfg.algorithm
    uncorrected = alg.is_truncation == 0 and alg.is_mask_low == 0 and alg.is_mask_high == 0 and alg.clip_against == "proximal"
    if cfg.staleness > 0 and uncorrected:
        log.warning(
            "workflow.staleness = %d in async mode trains on samples up to %d policy versions old, with no "
            "off-policy correction: set algorithm.is_truncation (e.g. 2.0), algorithm.is_mask_low / "
            'algorithm.is_mask_high (e.g. 0.5 / 2.0) or algorithm.clip_against = "behaviour" '
            "(see docs/algorithms.md)",
            cfg.staleness,
            cfg.staleness,
        )
