"""The role sections: ``[rollout]``, ``[reference]``, ``[reward]``, ``[reward_model]``,
``[critic]`` and ``[[roles]]`` (a custom role). A role that computes on accelerators has
``devices`` in its own section (instance i sees device i; the trainer's are ``[train]
devices``), which its ``RoleSpec`` reads (``actors/runtime/spec.py``)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from asyncflow.config._section import Section
from asyncflow.config.gateway import GatewayConfig
from asyncflow.core.schema import Refused
from asyncflow.engines.config import (
    Count,
    Delay,
    NonNegInt,
    RolloutEngineConfig,
    SamplingParams,
    TrainEngineConfig,
)


def check_one_device_each(devices: list[int], count: int) -> None:
    """A role whose instance i sees device i of its section's ``devices``: one id per instance, or none."""
    if devices and len(devices) != count:
        raise Refused("devices", f"give one device id per worker ({count})")


class RolloutConfig(Section):
    """Rollout replicas (generation)."""

    engine: Annotated[RolloutEngineConfig, Meta(description="Engine of every replica (see engines/config.py).")] = msgspec.field(
        default_factory=RolloutEngineConfig
    )
    sampling: Annotated[SamplingParams, Meta(description="Sampling; ``n`` is ignored (the algorithm's group_size is used).")] = (
        msgspec.field(default_factory=SamplingParams)
    )
    num_replicas: Annotated[Count, Meta(description="Replica processes; each takes whole prompt groups from the queue.")] = 1
    prompts_per_call: Annotated[Count, Meta(description="Prompt groups per generate call (the unit between weight swaps).")] = 4
    gateway: Annotated[GatewayConfig, Meta(description="OpenAI-compatible HTTP gateway (docs/gateway.md).")] = msgspec.field(
        default_factory=GatewayConfig
    )
    devices: Annotated[
        list[NonNegInt],
        Meta(
            description="Accelerator ids for rollout replicas, one per replica (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES of "
            "its process). Empty: the process sees every device."
        ),
    ] = msgspec.field(default_factory=list)

    def check(self, run: object) -> None:
        check_one_device_each(self.devices, self.num_replicas)


class ReferenceConfig(Section):
    """Reference policy log-probs (for the KL term)."""

    num_workers: Annotated[Count, Meta(description="Worker processes (used only when algorithm.kl_coef > 0).")] = 1
    micro_batch_size: Annotated[Count, Meta(description="Rows per forward pass.")] = 16
    devices: Annotated[list[NonNegInt], Meta(description="Accelerator ids for reference workers, one per worker.")] = (
        msgspec.field(default_factory=list)
    )

    def check(self, run: object) -> None:
        check_one_device_each(self.devices, self.num_workers)


class RewardConfig(Section):
    """Reward workers."""

    functions: Annotated[
        list[str],
        Meta(
            description="Rewards summed (with ``weights``): built-ins ``exact_match``, ``math_answer``, or dotted paths "
            "``package.module:function`` of custom rewards, each called on a batch as ``fn(prompts, responses, answers, "
            "finish_reasons) -> list[float]``."
        ),
    ] = msgspec.field(default_factory=lambda: ["math_answer"])
    weights: Annotated[list[float], Meta(description="Weight per function (default 1 each).")] = msgspec.field(
        default_factory=list
    )
    placement: Annotated[
        Literal["role", "rollout"],
        Meta(
            description="Where the functions run. role: in the reward role's own processes (``reward.<i>``, ``num_workers`` of "
            "them), which take the generated rows from the queue and put ``reward``. rollout: in each rollout replica, on "
            "the rows it just generated, put with the responses: no reward process, one queue hand-off and one put less "
            "per batch; for cheap rule-based functions (a slow one holds generation back); with "
            "``workflow.partial_rollout`` each group is scored as its last sample finishes. Not with ``[env] path``. See "
            "docs/performance.md."
        ),
    ] = "role"
    num_workers: Annotated[Count, Meta(description="Worker processes (``placement = 'role'``).")] = 1
    batch_size: Annotated[
        Count,
        Meta(
            description="Most rows scored per call (async mode takes whatever is ready, up to this; a call costs a few queue round "
            "trips, so small calls waste CPU)."
        ),
    ] = 256
    timeout_s: Annotated[
        Delay,
        Meta(
            description="Most seconds one call of the reward functions (one batch) may take. A call past it is left behind "
            "(its thread runs on, never holding the process's exit), its rows get reward 0, as a failed environment's do, "
            "and a warning in the scoring process's log names the rows and the functions; the next batch is scored by a "
            "fresh call. 0: no limit (a hung function stalls the run until the stall report)."
        ),
    ] = 60.0

    def check(self, run: object) -> None:
        if self.weights and len(self.weights) != len(self.functions):
            raise Refused("weights", f"give one weight per function ({len(self.functions)})")


REWARD_MODEL_COLUMN = "rm_score"
"""The column the reward-model role puts (``[reward_model]``)."""


class RewardModelConfig(Section):
    """A reward model served as its own role (``reward_model.<i>``; docs/reward-models.md): it
    scores each row with a model and puts ``rm_score``, which the trainer adds to the
    reward functions' ``reward`` times ``weight``."""

    enabled: Annotated[bool, Meta(description="Start the reward-model role and add its score to the reward.")] = False
    kind: Annotated[
        Literal["classifier", "judge"],
        Meta(
            description="classifier: a sequence-classification model (``AutoModelForSequenceClassification``, ``num_labels = "
            "1``) scores (prompt, response) with its head at the last token. judge: a causal LM answers ``template`` "
            "greedily; the score is the first number in its text (``judge_default_score`` when there is none)."
        ),
    ] = "classifier"
    path: Annotated[
        str,
        Meta(
            description="Local Hugging Face directory of the model, relative to the config file or absolute, or a hub id "
            "``org/name`` (as ``model.path``; a judge must be a causal LM). Empty: a classifier "
            "is the tiny reward model of ``data.task``, trained for ``tiny_steps`` steps into ``RUN_DIR/reward_model``; a "
            "judge is the policy's starting model."
        ),
    ] = ""
    tiny_steps: Annotated[
        Count, Meta(description="Training steps of the tiny reward model built when ``path`` is empty (about 20 ms each).")
    ] = 300
    weight: Annotated[
        float, Meta(description="Weight of ``rm_score`` in the reward (reward = functions + weight x rm_score).")
    ] = 1.0
    num_replicas: Annotated[Count, Meta(description="Reward-model processes; each scores the rows handed to it.")] = 1
    batch_size: Annotated[Count, Meta(description="Most rows scored per forward pass (or judge generate call).")] = 16
    device: Annotated[
        Literal["cpu", "cuda", "npu"],
        Meta(description="Where the model runs (with ``devices``, replica i sees device i alone)."),
    ] = "cpu"
    dtype: Annotated[Literal["float32", "bfloat16", "float16"], Meta(description="The model's weights dtype.")] = "float32"
    template: Annotated[
        str,
        Meta(
            description="judge: the judge's prompt, with ``{prompt}``, ``{response}`` (decoded text) and ``{answer}`` filled in; "
            "put through the judge tokenizer's chat template when it has one."
        ),
    ] = "Score 0-9: {prompt}{response}"
    judge_max_new_tokens: Annotated[Count, Meta(description="judge: most tokens it generates per row.")] = 8
    judge_default_score: Annotated[float, Meta(description="judge: the score of a row whose judgement has no number.")] = 0.0
    devices: Annotated[list[NonNegInt], Meta(description="Accelerator ids for reward-model replicas, one per replica.")] = (
        msgspec.field(default_factory=list)
    )

    def check(self, run: object) -> None:
        check_one_device_each(self.devices, self.num_replicas)
        if not self.enabled:
            return
        if self.kind == "judge" and "{response}" not in self.template:
            raise Refused("template", "the judge must see the response: put {response} in the template", self.template)
        if self.kind == "judge":
            try:
                self.template.format(prompt="", response="", answer="")
            except (KeyError, IndexError, ValueError) as exc:
                raise Refused(
                    "template",
                    f"not a format string of {{prompt}}, {{response}}, {{answer}} ({exc!r}); write braces as {{{{ }}}}",
                ) from None


class CriticConfig(Section):
    """PPO critic (value model), initialised from the policy with a value head."""

    engine: Annotated[TrainEngineConfig, Meta(description="Training engine of the critic.")] = msgspec.field(
        default_factory=lambda: TrainEngineConfig(critic=True, lr=1e-4)
    )


class RoleEntry(Section):
    """A custom role: any Actor subclass, started in its own process."""

    name: Annotated[str, Meta(description="Actor name (unique).")]
    cls: Annotated[str, Meta(description="Dotted path ``package.module:Class`` of an asyncflow Actor.")]
    kwargs: Annotated[
        dict, Meta(description="Keyword arguments of its constructor (after ``ctx``; ``run_dir`` is always given).")
    ] = msgspec.field(default_factory=dict)
    task: Annotated[
        str,
        Meta(
            description="A queue task to create for this role (``tq.controller.<task>``): rows are freed only after the role acked "
            "them. Empty: the role reads no rows."
        ),
    ] = ""
    reward_column: Annotated[
        str,
        Meta(
            description="A column this role puts (one float per row) that the trainer waits for and adds to the reward, times "
            "``reward_weight``."
        ),
    ] = ""
    reward_weight: Annotated[float, Meta(description="Weight of ``reward_column`` in the reward.")] = 1.0


def reward_columns(roles: list[RoleEntry], reward_model: RewardModelConfig) -> list[tuple[str, float]]:
    """The columns besides ``reward`` that the trainer waits for and adds to the reward,
    each with its weight: the ``reward_column`` of ``[[roles]]``, then ``rm_score``."""
    out = [(r.reward_column, r.reward_weight) for r in roles if r.reward_column]
    if reward_model.enabled:
        out.append((REWARD_MODEL_COLUMN, reward_model.weight))
    return out
