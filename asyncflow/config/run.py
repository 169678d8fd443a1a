"""``cluster.toml``: ``RunConfig``, the typed schema of a whole run, made of the sections
of the modules beside it (config/__init__.py lists them), and the rules that need all of
it: ``validate`` (every section's ``check``, then the rules across sections of
``validation.py``) and ``check_paths``.

Every section is a msgspec Struct with defaults; unknown keys are errors. Each field
carries its rules and its documentation: ``Annotated[int, Meta(ge=1, description=...)]``
(msgspec checks the range while decoding). Rules between fields of one section are its
``check`` method (core/schema.py); rules that read several sections are the functions of
``validation.py``, which ``RunConfig.check`` calls after them; whether paths exist is
checked last, by ``check_paths``. A wrong key or value fails at load time (config/load.py) with the key's
dotted name and what to change:

    >>> load_config_text('[train]\\nnum_steps = 0')
    ConfigError: train.num_steps = 0: out of range; use a value >= 1 (in <string>; set it in [train]
    num_steps, or --set train.num_steps=...; docs/config.md says what it means)

Docs of every key: ``docs/config.md``, generated from the schema (descriptions,
types, defaults, ranges) by ``python -m asyncflow.config.docs --markdown``.
"""

from __future__ import annotations

import logging
import os
from typing import Annotated

import msgspec
from msgspec import Meta

from asyncflow.config import validation as rules
from asyncflow.config._section import Section
from asyncflow.config.algorithm import AlgorithmConfig
from asyncflow.config.cluster import MOVED_DEVICES, ClusterConfig, LoggingConfig
from asyncflow.config.env import EnvConfig
from asyncflow.config.model import DataConfig, ModelConfig
from asyncflow.config.planner import PlannerConfig
from asyncflow.config.roles import (
    CriticConfig,
    ReferenceConfig,
    RewardConfig,
    RewardModelConfig,
    RoleEntry,
    RolloutConfig,
    reward_columns,
)
from asyncflow.config.train import EvalConfig, TrainConfig
from asyncflow.config.workflow import QueueConfig, WorkflowConfig
from asyncflow.core.schema import ConfigError, check_tree
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

    def __post_init__(self) -> None:
        """A device list under its old ``[cluster]`` key moves into its role's section, with
        a warning (given in both places, ``validation.check_moved_devices`` refuses it)."""
        for old, new in MOVED_DEVICES.items():
            devices, section = getattr(self.cluster, old), getattr(self, new)
            if devices and not section.devices:  # copies: a section may be shared with another config
                log.warning("[cluster] %s is deprecated: write [%s] devices = %s", old, new, devices)
                setattr(self, new, msgspec.structs.replace(section, devices=list(devices)))
                self.cluster = msgspec.structs.replace(self.cluster, **{old: []})

    @property
    def staleness(self) -> int:
        return 0 if self.workflow.mode == "sync" else self.workflow.staleness

    @property
    def eval_in_process(self) -> bool:
        """Evaluations run in the ``evaluator`` role's process (``eval.where``), not the trainer's."""
        if not self.eval.every_steps:
            return False
        if self.eval.where == "auto":
            return self.workflow.mode == "async" and self.workflow.weight_transport in ("nng", "local")
        return self.eval.where == "process"

    @property
    def rollout_streams(self) -> bool:
        """The rollout replicas generate as one continuous stream (partial rollout,
        ``actors/rollout/stream.py``) rather than unit by unit (``unit.py``):
        ``workflow.partial_rollout``, with ``auto`` resolved (``rollout_mode_why``)."""
        return self.rollout_mode_why()[0]

    def rollout_mode_why(self) -> tuple[bool, str]:
        """(streams, why): ``workflow.partial_rollout`` resolved, and the reason in a user's terms."""
        setting, engine = self.workflow.partial_rollout, self.rollout.engine
        if isinstance(setting, bool):
            return setting, f"workflow.partial_rollout = {str(setting).lower()}"
        if self.workflow.mode != "async":
            return False, f"{self.workflow.mode} mode: weights never change during generation"
        if engine.type in ("vllm", "vllm_ascend"):
            return False, "vLLM swaps weights inside its own generate calls"
        if engine.type == "emulated":
            return True, "async on emulated accelerators: the stream keeps each replica full while long responses finish"
        if engine.device != "cpu":
            return True, f"async on {engine.device}: the stream keeps the engine full while long responses finish"
        return False, "async on cpu: the trainer is the long pole and the stream measured slower here"

    @property
    def data_from_gateway(self) -> bool:
        """The run trains on the gateway's rewarded sessions (``[rollout.gateway] train``):
        no prompt loader, no reward role, no rollout task."""
        return self.rollout.gateway.trains

    @property
    def samples_per_step(self) -> int:
        return self.train.prompts_per_step * self.algorithm.group_size

    @property
    def groups_per_step(self) -> int:
        """Prompt groups the loader allocates (and the rollout generates) per step:
        ``prompts_per_step``, over-sampled with ``algorithm.dynamic_sampling``."""
        return self.algorithm.groups_per_step(self.train.prompts_per_step)

    @property
    def rows_per_step(self) -> int:
        """Rows allocated per step: ``samples_per_step`` unless dynamic sampling over-samples."""
        return self.algorithm.rows_per_step(self.train.prompts_per_step)

    @property
    def refill_rounds(self) -> int:
        """Dynamic sampling's refill rounds per step at most (0: no refill)."""
        return self.algorithm.refill_rounds

    @property
    def refill_headroom_rows(self) -> int:
        """Rows the loader leaves free when it allocates a new step, so that a refill
        round always fits (``AlgorithmConfig.refill_headroom_rows``); 0 without refill."""
        return self.algorithm.refill_headroom_rows(self.train.prompts_per_step)

    @property
    def reward_columns(self) -> list[tuple[str, float]]:
        """The columns besides ``reward`` that the trainer waits for and adds to the reward,
        each with its weight: the ``reward_column`` of ``[[roles]]``, then ``rm_score``."""
        return reward_columns(self.roles, self.reward_model)

    def check(self, run: object) -> None:
        """The rules across sections (``validation.py``), in the order of the sections;
        ``check_tree`` runs this after every section's own ``check``."""
        rules.check_moved_devices(self.cluster, self.rollout, self.train, self.reference, self.reward_model)
        rules.check_data_task(self.data, self.model)
        rules.check_dynamic_sampling_metric(self.algorithm, self.roles, self.reward_model)
        rules.check_overlong_buffer(self.algorithm, self.rollout)
        rules.check_gateway_replica(self.rollout)
        rules.check_gateway_secret(self.rollout, self.cluster)
        rules.check_gateway_restarts(self.rollout, self.cluster)
        rules.check_gateway_training(self.rollout, self.train, self.algorithm, self.env, self.reward_model)
        rules.check_reward_placement(self.reward, self.env)
        rules.check_something_scores(self.reward, self.env, self.rollout, self.roles)
        rules.check_tiny_reward_model(self.reward_model, self.model)
        rules.check_critic_fsdp(self.critic, self.train, self.algorithm)
        rules.check_eval(self.eval, self.train, self.rollout, self.workflow)
        rules.check_queue_capacity(self.queue, self.train, self.algorithm)
        rules.check_pinned_cores(self.cluster, self.train, self.workflow)
        rules.check_packing(self.cluster, self.rollout, self.planner)
        rules.check_online_planner(self.planner, self.rollout, self.train)
        rules.check_custom_roles(self.roles, self.reward_model)


def validate(cfg: RunConfig) -> None:
    """The cross-field rules: every section's ``check``; the first one broken raises
    ConfigError naming the key, its value and the fix. (msgspec has checked each
    field's own constraints while decoding.) A run that trains on gateway sessions
    then gets its ``train.num_steps`` from ``rollout.gateway`` (``num_sessions``,
    ``until_stopped``)."""
    check_tree(cfg)
    cfg.train.num_steps = cfg.rollout.gateway.steps(cfg.train.num_steps, cfg.samples_per_step)


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
