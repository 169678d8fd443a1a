"""``cluster.toml``: the typed schema of a run, and its loader.

Every section is a msgspec Struct with defaults; unknown keys are errors. Each field
carries its rules and its documentation: ``Annotated[int, Meta(ge=1, description=...)]``
(msgspec checks the range while decoding). Rules between fields are one ``check``
method per section (core/schema.py); whether paths exist is checked after them, by
``check_paths``. A wrong key or value fails at load time with the key's dotted name
and what to change:

    >>> load_config_text('[train]\\nnum_steps = 0')
    ConfigError: train.num_steps = 0: out of range; use a value >= 1 (in <string>; set it in [train]
    num_steps, or --set train.num_steps=...; docs/config.md says what it means)

Docs of every key: ``docs/config.md``, generated from the schema (descriptions,
types, defaults, ranges) by ``python -m asyncflow.config.run --markdown``.
"""

from __future__ import annotations

import logging
import math
import os
import re
import typing
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import tomllib
from msgspec import Meta

from asyncflow.algorithms import registry
from asyncflow.algorithms.loss_configs import PPOClipLoss
from asyncflow.config.names import reserved as reserved_role_name
from asyncflow.core import schema
from asyncflow.core.schema import ConfigError, Refused, check_tree
from asyncflow.core.transport import SECRET_ENV, TransportConfig, is_loopback
from asyncflow.engines.config import (
    Count,
    Fraction,
    NonNegFloat,
    NonNegInt,
    PosFloat,
    RolloutEngineConfig,
    SamplingParams,
    Seconds,
    TrainEngineConfig,
)

if typing.TYPE_CHECKING:  # statically the default loss's Struct; at run time the union of the registry's
    LossConfig = PPOClipLoss
else:
    LossConfig = registry.LossConfig

log = logging.getLogger(__name__)


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A ``[section]``. Its single-field rules are constraints on the fields; its
    cross-field rules are one ``check(run)`` method (core/schema.py), which raises
    ``Refused(key, fix)`` with the key relative to the section."""


class ModelConfig(_Section):
    """The policy model."""

    path: Annotated[
        str,
        Meta(
            description="Local Hugging Face directory (config.json, safetensors, tokenizer), relative to the config file or absolute; "
            "a run's checkpoint (``checkpoints/step_N``, or the link ``checkpoints/latest``) works too. Empty: build the "
            "tiny model (``tiny``) into ``RUN_DIR/model``. docs/your-model-and-data.md."
        ),
    ] = ""
    tiny: Annotated[
        Literal["qwen2", "llama"], Meta(description="Architecture of the tiny model built when ``path`` is empty.")
    ] = "qwen2"
    tiny_warm_start: Annotated[
        bool,
        Meta(
            description="Warm-start the tiny model with a short supervised pass on the task, stopped early (about 10% greedy "
            "accuracy), so RL has a signal from step one."
        ),
    ] = True
    tiny_warm_start_steps: Annotated[
        NonNegInt, Meta(description="Supervised steps of that warm start (more: a stronger start, less left to learn).")
    ] = 100


class DataConfig(_Section):
    """Prompts: a local JSONL or Parquet file with ``prompt`` and ``answer`` fields."""

    path: Annotated[
        str,
        Meta(
            description="The data file, relative to the config file or absolute (fields: docs/your-model-and-data.md). Empty: generate "
            "the tiny arithmetic task (``task``) into ``RUN_DIR/data.jsonl``."
        ),
    ] = ""
    task: Annotated[
        str,
        Meta(
            description="Built-in task when ``path`` is empty (asyncflow.toy.tasks): add, reverse, calc for the tiny model; "
            "add2 (two-digit addition in words) for a real model (examples/smollm2.toml)."
        ),
    ] = "add"
    num_prompts: Annotated[Count, Meta(description="Prompts generated for the built-in task.")] = 2000
    chat_template: Annotated[bool, Meta(description="Apply the tokenizer's chat template to each prompt.")] = True
    shuffle: Annotated[bool, Meta(description="Shuffle the prompts (with ``seed``) before each epoch.")] = True
    seed: Annotated[NonNegInt, Meta(description="Seed of the shuffle and of generated tasks.")] = 0
    max_prompt_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Longest prompt in tokens (as the loader encodes it, chat template included). The preflight reads "
            "every prompt of ``path`` before any process starts and refuses a longer one by its line. 0: what fits, the "
            "model's max_position_embeddings less ``rollout.sampling.max_new_tokens`` (that limit holds anyway)."
        ),
    ] = 0

    def check(self, run: RunConfig) -> None:
        if self.path and not self.path.endswith((".jsonl", ".parquet")):
            raise Refused("path", "use a .jsonl or .parquet file")
        if not self.path and self.task == "add2" and not run.model.path:
            raise Refused("task", '"add2" is a task in words for a real model: set model.path (examples/smollm2.toml)')


class AlgorithmConfig(_Section):
    """The RL algorithm and its knobs."""

    name: Annotated[
        str,
        Meta(
            description="The advantage estimator, a name of the registry (algorithms/registry.py, which says what each needs): "
            + "; ".join(
                f"{e.name}: {e.summary}" + (" (a critic trains beside the policy)" if e.needs_critic else "")
                for e in registry.ESTIMATORS.values()
            )
            + "."
        ),
    ] = "grpo"
    loss: Annotated[
        LossConfig,
        Meta(
            description="The policy loss, a Struct of its own keyed by ``name`` (registry: "
            + ", ".join(registry.POLICY_LOSSES)
            + ")."
        ),
    ] = msgspec.field(default_factory=PPOClipLoss)
    group_size: Annotated[Count, Meta(description="Responses sampled per prompt (GRPO's n).")] = 8
    std_normalize: Annotated[bool, Meta(description="GRPO: divide group-centred rewards by the group's std.")] = True
    kl_coef: Annotated[
        NonNegFloat, Meta(description="Weight of the KL to the reference policy; 0 disables the reference role.")
    ] = 0.0
    kl_estimator: Annotated[Literal["k1", "k2", "k3"], Meta(description="KL estimator.")] = "k3"
    kl_in_reward: Annotated[
        bool,
        Meta(
            description="Put the KL penalty into the reward instead of the loss, estimated by ``kl_estimator`` on the rollout "
            "log-probs. GRPO: each response's reward minus kl_coef x its KL summed over the response tokens, before the "
            "group normalisation. PPO: minus kl_coef x the token's KL on every response token's reward, before GAE."
        ),
    ] = False
    entropy_coef: Annotated[NonNegFloat, Meta(description="Entropy bonus weight.")] = 0.0
    is_truncation: Annotated[
        NonNegFloat,
        Meta(
            description="Off-policy correction: cap of the importance weight pi_prox / mu between the trainer's policy before the "
            'update and the rollout policy of stale samples (0 disables; with ``clip_against = "proximal"`` only). Per '
            "token or per sequence by ``is_level``."
        ),
    ] = 2.0
    gamma: Annotated[Fraction, Meta(description="PPO: discount.")] = 1.0
    lam: Annotated[Fraction, Meta(description="PPO: GAE lambda.")] = 0.95
    value_clip: Annotated[NonNegFloat, Meta(description="PPO: value clipping range.")] = 0.2
    epochs: Annotated[
        Count,
        Meta(
            description="Optimizer passes over each global batch. Above 1, the trainer first recomputes the batch's log-probs (one "
            "forward pass, pi_prox) so that every pass clips its ratio against the policy before the first one."
        ),
    ] = 1
    clip_against: Annotated[
        Literal["proximal", "behaviour"],
        Meta(
            description="What the PPO ratio is clipped against. behaviour (the default) is what keeps async runs learning as much as "
            "sync (docs/results.md). proximal (decoupled PPO): pi / pi_prox, pi_prox the policy before this update, times "
            "the truncated importance weight pi_prox / mu (``is_truncation``); with one optimizer step per batch the ratio "
            "is 1 and only that weight corrects staleness. behaviour (coupled PPO): pi / mu, mu the rollout policy that "
            "generated the sample, with no separate weight (``is_truncation`` unused): a trust region around the data's "
            "policy, which limits drift on stale samples. See docs/algorithms.md."
        ),
    ] = "behaviour"
    is_level: Annotated[
        Literal["token", "sequence"],
        Meta(
            description="Level of the importance ratio pi_prox / mu used by ``is_truncation`` and the mask: each token's own, or one "
            "per sequence (the product of its token ratios, exp of the sum of their logs over the response) on every token "
            "of it."
        ),
    ] = "token"
    is_mask_low: Annotated[
        float,
        Meta(
            ge=0,
            lt=1,
            description='Masked importance sampling (IcePop style): tokens (whole sequences with ``is_level = "sequence"``) whose '
            "pi_prox / mu is below this are dropped from the policy-gradient term; counted in the metric "
            "``is_masked_frac``. 0: no lower bound; otherwise below 1 (e.g. 0.5).",
        ),
    ] = 0.0
    is_mask_high: Annotated[
        NonNegFloat,
        Meta(
            description="Masked importance sampling: tokens (sequences) whose pi_prox / mu is above this are dropped too. 0: no upper "
            "bound; otherwise above 1 (e.g. 2.0). Both bounds 0: no mask."
        ),
    ] = 0.0
    overlong_buffer: Annotated[
        int,
        Meta(
            ge=0,
            description="Overlong shaping (DAPO): the last this many tokens before ``rollout.sampling.max_new_tokens`` M are a "
            "buffer over which a response's reward falls linearly, from 0 at length M - buffer to -``overlong_penalty`` at "
            "length M (the stop token counts), before the advantages are computed. 0: no length penalty; otherwise below M. "
            "Metric ``overlong_penalty_mean``; see docs/algorithms.md.",
        ),
    ] = 0
    overlong_penalty: Annotated[
        float,
        Meta(
            ge=0,
            description="The penalty at ``rollout.sampling.max_new_tokens`` (DAPO's penalty factor): subtracted in full from the reward "
            "of a response of that length, in part within ``overlong_buffer``. Unused while ``overlong_buffer = 0``.",
        ),
    ] = 1.0
    mask_truncated: Annotated[
        bool,
        Meta(
            description='Drop the responses cut at ``rollout.sampling.max_new_tokens`` (finish reason "length") from the loss: their '
            "tokens get no gradient and leave the loss's token (sequence) mean, which runs over the remaining tokens "
            "(rows). They still count in their group's reward statistics. Metric ``truncated_masked_frac``; see "
            "docs/algorithms.md.",
        ),
    ] = False
    dynamic_sampling: Annotated[
        bool,
        Meta(
            description="Dynamic sampling (DAPO): the trainer drops the prompt groups whose rewards are all equal (zero GRPO "
            "advantage: no gradient) and trains on up to ``train.prompts_per_step`` of the others. The loader over-samples "
            "(``dynamic_sampling_oversample``) to keep the batch full; every dropped group is acked and recorded in "
            "trained.jsonl. GRPO only. Metrics ``filtered_frac``, ``kept_groups``; see docs/algorithms.md.",
        ),
    ] = False
    dynamic_sampling_oversample: Annotated[
        float,
        Meta(
            ge=1.0,
            le=16.0,
            description="With ``dynamic_sampling``: prompt groups loaded and generated per step, as a multiple of "
            "``train.prompts_per_step`` (rounded up). The informative groups beyond ``prompts_per_step`` are dropped as "
            "surplus; a step with fewer trains on fewer unless ``dynamic_sampling_max_rounds`` refills it. Unused while "
            "``dynamic_sampling = false``.",
        ),
    ] = 2.0
    dynamic_sampling_max_rounds: Annotated[
        int,
        Meta(
            ge=0,
            le=64,
            description="With ``dynamic_sampling``: refill (DAPO's 'keep sampling until the batch is full'). A step whose "
            "groups hold fewer than ``train.prompts_per_step`` informative ones asks the loader for another round of "
            "over-sampled groups for the same step, generated and scored like the first, up to this many rounds; then it "
            "trains on what it has (metric ``refill_short``). 0: no refill. Metrics ``refill_rounds``, "
            "``refill_groups``; see docs/algorithms.md.",
        ),
    ] = 0

    @property
    def estimator(self) -> registry.Estimator:
        """The registry's entry for ``name`` (what it needs: a critic, a reference, groups)."""
        return registry.estimator(self.name)

    @property
    def needs_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def needs_reference(self) -> bool:
        """A reference policy runs: the KL term asks for its log-probs, or the estimator does."""
        return self.kl_coef > 0 or self.estimator.needs_reference

    def check(self, run: RunConfig) -> None:
        if self.name not in registry.ESTIMATORS:
            raise Refused("name", f"not an advantage estimator of the registry; use one of {list(registry.ESTIMATORS)}")
        grouped = [e.name for e in registry.ESTIMATORS.values() if e.grouped]
        if self.dynamic_sampling and not self.estimator.grouped:
            raise Refused(
                "dynamic_sampling", f"filters prompt groups by their rewards: use a group estimator ({grouped}) or turn it off"
            )
        if self.dynamic_sampling and self.group_size < 2:
            raise Refused("dynamic_sampling", "a group of one response always has equal rewards: use group_size >= 2")
        if self.estimator.grouped and self.group_size < 2:
            raise Refused("group_size", f"{self.name} compares the responses of one prompt: use at least 2")
        if self.is_mask_high != 0 and self.is_mask_high <= 1:
            raise Refused("is_mask_high", "use 0 (no upper bound) or a ratio above 1 such as 2.0")
        max_new_tokens = run.rollout.sampling.max_new_tokens
        if self.overlong_buffer >= max_new_tokens:
            raise Refused(
                "overlong_buffer",
                f"the buffer is the last tokens before rollout.sampling.max_new_tokens ({max_new_tokens}): use 0 (off) "
                f"or a value below {max_new_tokens}",
            )


class GatewayConfig(_Section):
    """An OpenAI-compatible HTTP endpoint served by one rollout replica (docs/gateway.md):
    agent programs call ``/v1/chat/completions``; the gateway records each session's
    token ids and log-probs exactly as the model produced them."""

    enabled: Annotated[bool, Meta(description="Serve the gateway from rollout replica ``replica``.")] = False
    host: Annotated[
        str,
        Meta(
            description="Address the HTTP server binds. Loopback (127.0.0.1, the default) needs no token; any other address "
            "needs the cluster secret ([cluster.transport] secret or ASYNCFLOW_SECRET), which clients send as their api_key "
            "(``Authorization: Bearer <secret>``). The secret travels in clear text over HTTP: use it on trusted networks only."
        ),
    ] = "127.0.0.1"
    port: Annotated[
        int, Meta(ge=0, le=65535, description="TCP port; 0 picks a free one (written to ``RUN_DIR/gateway.json`` and the log).")
    ] = 8000
    replica: Annotated[NonNegInt, Meta(description="Index of the rollout replica that serves it (``rollout.<replica>``).")] = 0
    require_secret: Annotated[
        bool, Meta(description="Ask for the cluster secret on loopback too (off loopback it is always asked for).")
    ] = False
    max_new_tokens: Annotated[
        Count | None,
        Meta(
            description="Most tokens one request may generate (a request's max_tokens is capped by it); None: "
            "[rollout.sampling] max_new_tokens."
        ),
    ] = None
    max_sessions: Annotated[
        Count,
        Meta(
            description="Sessions kept in memory; beyond it the oldest finished (rewarded) session is dropped, then the oldest "
            "anonymous one (a request that named no session) not taking a turn, and a new session is refused (HTTP 429) "
            "while all of them are named open ones."
        ),
    ] = 1024
    max_batch: Annotated[
        Count,
        Meta(
            description="Most requests (of different sessions, waiting at the same time) generated together in one engine call; "
            "1: one at a time."
        ),
    ] = 64
    max_request_bytes: Annotated[
        Count,
        Meta(
            description="Largest request body the gateway reads; a larger one gets HTTP 413 as it arrives (by its "
            "Content-Length, or once the stream passes the limit), never held whole in memory."
        ),
    ] = 1 << 20

    def check(self, run: RunConfig) -> None:
        if not self.enabled:
            return
        if self.host.startswith("[") or self.host.endswith("]"):
            raise Refused("host", f"give the address without brackets ({self.host.strip('[]')!r}); brackets belong in URLs")
        if self.replica >= run.rollout.num_replicas:
            raise Refused(
                "replica", f"there are {run.rollout.num_replicas} rollout replicas: use 0..{run.rollout.num_replicas - 1}"
            )
        if (not is_loopback(self.host) or self.require_secret) and not run.cluster.transport.secret_bytes():
            raise Refused(
                "host" if not is_loopback(self.host) else "require_secret",
                f"the gateway asks for the cluster secret here and none is set: set [cluster.transport] secret or the "
                f"{SECRET_ENV} environment variable (clients send it as their api_key), or serve on host = '127.0.0.1'",
                self.host if not is_loopback(self.host) else self.require_secret,
            )


class RolloutConfig(_Section):
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


class ReferenceConfig(_Section):
    """Reference policy log-probs (for the KL term)."""

    num_workers: Annotated[Count, Meta(description="Worker processes (used only when algorithm.kl_coef > 0).")] = 1
    micro_batch_size: Annotated[Count, Meta(description="Rows per forward pass.")] = 16


class RewardConfig(_Section):
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
            "per batch; for cheap rule-based functions (a slow one holds generation back). Not with ``[env] path`` or "
            "``workflow.partial_rollout``. See docs/performance.md."
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
        NonNegFloat,
        Meta(
            description="Most seconds one call of the reward functions (one batch) may take. A call past it is left behind "
            "(its thread runs on, never holding the process's exit), its rows get reward 0, as a failed environment's do, "
            "and a warning in the scoring process's log names the rows and the functions; the next batch is scored by a "
            "fresh call. 0: no limit (a hung function stalls the run until the stall report)."
        ),
    ] = 60.0

    def check(self, run: RunConfig) -> None:
        if self.weights and len(self.weights) != len(self.functions):
            raise Refused("weights", f"give one weight per function ({len(self.functions)})")
        if self.placement == "rollout" and run.env.path:
            raise Refused("placement", "the rollout scores only single-turn rows: with [env] path set, use placement = 'role'")
        if self.placement == "rollout" and run.workflow.partial_rollout:
            raise Refused(
                "placement",
                "a partial rollout streams its rows out unscored: with workflow.partial_rollout, use placement = 'role'",
            )
        if not self.functions and not run.env.path and not any(r.reward_column for r in run.roles):
            raise Refused(
                "functions", "nothing would score the responses: name a reward function (or set [env] path, whose reward counts)"
            )


REWARD_MODEL_COLUMN = "rm_score"
"""The column the reward-model role puts (``[reward_model]``)."""


class RewardModelConfig(_Section):
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
            description="Local Hugging Face directory of the model, relative to the config file or absolute. Empty: a classifier "
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
        Meta(description="Where the model runs (with ``cluster.reward_model_devices``, replica i sees device i alone)."),
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

    def check(self, run: RunConfig) -> None:
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
        if not self.path and self.kind == "classifier" and run.model.path:
            raise Refused(
                "path",
                "the tiny reward model reads the tiny model's tokens only: give a reward model of your own "
                "(reward_model.path) for model.path's model",
            )


class CriticConfig(_Section):
    """PPO critic (value model), initialised from the policy with a value head."""

    engine: Annotated[TrainEngineConfig, Meta(description="Training engine of the critic.")] = msgspec.field(
        default_factory=lambda: TrainEngineConfig(critic=True, lr=1e-4)
    )

    def check(self, run: RunConfig) -> None:
        ranks = run.train.num_ranks
        if ranks > 1 and run.train.engine.fsdp and run.algorithm.needs_critic and not self.engine.fsdp:
            raise Refused("engine.fsdp", f"the PPO critic trains on the same {ranks} ranks: set [critic.engine] fsdp = true")


class TrainConfig(_Section):
    """The trainer (actor update)."""

    engine: Annotated[TrainEngineConfig, Meta(description="Training engine (see engines/config.py).")] = msgspec.field(
        default_factory=TrainEngineConfig
    )
    num_steps: Annotated[Count, Meta(description="Trainer steps (policy versions) in the run.")] = 60
    prompts_per_step: Annotated[
        Count, Meta(description="Prompt groups per global batch (samples per step = this * group_size).")
    ] = 8
    num_ranks: Annotated[
        Count,
        Meta(
            description="Trainer processes (data parallel with FSDP2: needs ``engine.fsdp = true``). Rank 0 reads the batch plan and "
            "publishes weights; every rank reads its own rows from the queue. With ``cluster.train_devices``, give one "
            "device per rank."
        ),
    ] = 1
    dist_port: Annotated[
        int,
        Meta(
            ge=0,
            le=65535,
            description="Port of rank 0's torch.distributed store (0: any free port, published through the directory). Set it when "
            "only some ports are open between nodes.",
        ),
    ] = 0
    dist_timeout_s: Annotated[
        Seconds,
        Meta(
            description="How long trainer ranks wait for each other (rendezvous, each collective) before failing: a rank whose peer "
            "vanished fails after this, it never hangs."
        ),
    ] = 600.0
    checkpoint_every: Annotated[
        NonNegInt, Meta(description="Save a Hugging Face checkpoint and the queue state every N steps (0: at the end only).")
    ] = 0
    keep_checkpoints: Annotated[
        NonNegInt,
        Meta(
            description="Keep the newest N complete checkpoints (``checkpoints/step_*``) and delete older ones after each "
            "save; the best (``checkpoints/best``, ``[eval]``) is kept apart. 0: keep every one. Keep 2 or more so that a "
            "damaged newest checkpoint still has one to fall back to."
        ),
    ] = 0

    def check(self, run: RunConfig) -> None:
        ranks = self.num_ranks
        if ranks > 1 and not self.engine.fsdp:
            raise Refused(
                "engine.fsdp", f"train.num_ranks = {ranks} trains data parallel with FSDP2: set [train.engine] fsdp = true"
            )
        if self.prompts_per_step % ranks:
            raise Refused(
                "prompts_per_step", f"every rank trains whole prompt groups: use a multiple of train.num_ranks ({ranks})"
            )


class EvalConfig(_Section):
    """Evaluation of the policy on held-out prompts during the run (docs/metrics.md,
    ``val/*``). The trainer evaluates in its own process, with a private native
    rollout engine on its device holding the weights it has just published (whatever
    ``rollout.engine.type``; its KV cache: ``rollout.engine.kv_cache_bytes``, or 64 MiB);
    only trainer rank 0 evaluates, the other ranks wait for it."""

    every_steps: Annotated[
        NonNegInt,
        Meta(
            description="Evaluate after every this many trainer steps and after the last one; 0 disables evaluation (and the held-out "
            "split: every prompt is trained on)."
        ),
    ] = 0
    num_prompts: Annotated[
        Count,
        Meta(
            description="Held-out prompts: this many distinct prompts drawn (with ``data.seed``) from the data file; every row with "
            "one of them is left out of training. The data must have more distinct prompts than this (the built-in ``add`` "
            "task has 100)."
        ),
    ] = 20
    mode: Annotated[
        Literal["greedy", "pass_at_k"],
        Meta(
            description="greedy: one response per prompt at temperature 0. pass_at_k: ``k`` responses per prompt at "
            "``rollout.sampling.temperature``; a prompt passes if any is correct."
        ),
    ] = "greedy"
    k: Annotated[Count, Meta(description="Responses per prompt in pass_at_k mode.")] = 4
    max_new_tokens: Annotated[NonNegInt, Meta(description="Most response tokens; 0: ``rollout.sampling.max_new_tokens``.")] = 0
    correct_reward: Annotated[
        float,
        Meta(
            description="A response counts as correct when its reward (``reward.functions`` with ``reward.weights``) is at least this. "
            "The built-in tasks give 1.0 to an exact answer."
        ),
    ] = 0.999
    save_best: Annotated[
        bool,
        Meta(
            description="At each evaluation whose ``val/accuracy`` beats every earlier one, save the weights (a Hugging Face "
            "directory, no optimizer) to ``checkpoints/best_<version>`` and point the link ``checkpoints/best`` at it "
            "(``checkpoints/best.json`` says which)."
        ),
    ] = True
    at_start: Annotated[
        bool,
        Meta(
            description="Also evaluate the weights the run starts from (version 0, before any step of a new run): their figures "
            "go into the first step's record as ``val/start_accuracy`` and ``val/start_reward_mean``, and the run's last "
            "line says start -> last. Needs ``every_steps`` > 0 and one trainer rank."
        ),
    ] = False

    def check(self, run: RunConfig) -> None:
        if self.at_start and not self.every_steps:
            raise Refused("at_start", "evaluates only with every_steps > 0: set eval.every_steps too")
        if self.at_start and run.train.num_ranks > 1:
            raise Refused("at_start", "needs the whole starting weights in one process: not with train.num_ranks > 1")
        if self.every_steps and self.mode == "pass_at_k" and run.rollout.sampling.temperature == 0:
            raise Refused(
                "mode",
                "pass_at_k samples at rollout.sampling.temperature, which is 0 (greedy): every "
                "sample would be the same; use mode = 'greedy' or a temperature above 0",
            )


class QueueConfig(_Section):
    """TransferQueue."""

    num_shards: Annotated[Count, Meta(description="Storage shard processes.")] = 1
    capacity_rows: Annotated[
        NonNegInt, Meta(description="Most rows held at once (producers wait beyond it). 0: enough for staleness+2 steps.")
    ] = 0
    shm: Annotated[bool, Meta(description="Same-host shared-memory data path for tensor bytes.")] = True
    inline_max_bytes: Annotated[
        int,
        Meta(
            ge=0,
            le=1 << 20,
            description="A put of at most this many bytes travels with the shard's notice to the controllers, and the consumer gets it "
            "in the GetBatch reply: one round trip less for small rows. 0: every read goes to the shard.",
        ),
    ] = 16384

    def check(self, run: RunConfig) -> None:
        if self.capacity_rows and self.capacity_rows < run.rows_per_step:
            raise Refused("capacity_rows", f"must hold at least one global batch ({run.rows_per_step} rows) or be 0 (automatic)")
        headroom = run.refill_headroom_rows
        if self.capacity_rows and headroom and self.capacity_rows < run.rows_per_step + headroom:
            raise Refused(
                "capacity_rows",
                f"with algorithm.dynamic_sampling_max_rounds > 0 the queue keeps {headroom} rows free for refill rounds: "
                f"use at least {run.rows_per_step + headroom} or 0 (automatic)",
            )


class WorkflowConfig(_Section):
    """How the roles overlap."""

    mode: Annotated[
        Literal["sync", "async"],
        Meta(
            description="sync: generate the whole batch, then score, then train, then sync weights (the baseline). async: every role "
            "streams; rollout runs ahead by up to ``staleness``."
        ),
    ] = "async"
    staleness: Annotated[
        NonNegInt,
        Meta(
            description="Bound k: a sample generated by policy version v is trained at step s only if s - v <= k. Forced to 0 in sync "
            "mode."
        ),
    ] = 1
    substep_updates: Annotated[
        bool, Meta(description="Rollout replicas swap to new weights one at a time (capacity never drops to 0).")
    ] = True
    prefetch_batch: Annotated[
        bool,
        Meta(
            description="The trainer sends its request for step s + 1's batch while step s trains (``actors/_prefetch.py``), so "
            "the reply is usually in when the step ends: one queue round trip less on the critical path of an async step. "
            "The same rows, only asked for earlier; step s's rows are acked one request later. false: ask when the step starts."
        ),
    ] = True
    weight_timeout_s: Annotated[
        Seconds,
        Meta(
            description="How long one step of a weight transfer (a chunk over nng, a broadcast over the collective, building its "
            "group) may take before the replica gives up on that version and fetches the next one announced."
        ),
    ] = 120.0
    verify_weights: Annotated[
        Literal["error", "count", "off"],
        Meta(
            description="Version integrity: every row carries the digest of the weights that generated it and the trainer checks it "
            "against the version the row is tagged with (``engines/digest.py``). error: a mismatch fails the step, naming "
            "the row. count: counted in the ``weights_mismatch`` metric. off: no digests."
        ),
    ] = "error"
    weight_transport: Annotated[
        Literal["nng", "collective"],
        Meta(
            description="How the weight bytes reach rollout replicas. nng: chunks pulled over the actor transport (host-staged). "
            "collective: broadcast over a two-member torch.distributed group per replica (gloo on cpu, nccl on cuda, hccl "
            "on npu) into buffers on the replica's device; announcements and swap grants stay on nng. A replica whose "
            "trainer side has no such collective falls back to nng (logged)."
        ),
    ] = "nng"
    partial_rollout: Annotated[
        bool,
        Meta(
            description="Partial rollout (async only; the native engine): a replica generates as one continuous stream that "
            "admits prompt groups whenever a row frees up (at most prompts_per_call x group_size sequences decode at once), "
            "and swaps in new weights between two decode steps instead "
            "of between generate calls. In-flight sequences keep their tokens and KV cache and go on with the new weights; "
            "each token records the version that produced it (column ``token_versions``), and a row is tagged with its "
            "oldest token's version, so the staleness bound holds for every token. Pays on long-tailed response lengths."
        ),
    ] = False

    def check(self, run: RunConfig) -> None:
        if self.partial_rollout and self.mode != "async":
            raise Refused(
                "partial_rollout",
                'partial rollout needs workflow.mode = "async" (in sync mode weights never change during generation)',
                self.partial_rollout,
            )
        if self.partial_rollout and run.rollout.gateway.enabled:
            raise Refused(
                "partial_rollout",
                "partial rollout and [rollout.gateway] share one engine whose stream holds KV blocks between decode steps; "
                "they cannot run together yet: set workflow.partial_rollout = false or rollout.gateway.enabled = false",
                self.partial_rollout,
            )
        if self.partial_rollout and run.env.path:
            raise Refused(
                "partial_rollout",
                "partial rollout streams single-turn responses; multi-turn trajectories ([env] path) are driven unit by "
                "unit and do not record per-token versions yet: set workflow.partial_rollout = false or unset env.path",
                self.partial_rollout,
            )


class RoleEntry(_Section):
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


class ClusterConfig(_Section):
    """Where processes run."""

    launcher: Annotated[
        Literal["local", "ray"], Meta(description="local: every process on this machine. ray: placed by a running Ray cluster.")
    ] = "local"
    max_resumes: Annotated[
        NonNegInt,
        Meta(
            description="When a process that cannot be restarted alone dies (queue, shard, loader, a trainer rank) or its node is "
            "lost, stop cleanly and resume from the last checkpoint, up to this many times per `afctl up` (0: stop and "
            "print the resume command). Rollout, reward, reference and custom-role processes are restarted in place "
            "(within ``max_restarts_per_role``)."
        ),
    ] = 0
    max_restarts_per_role: Annotated[
        NonNegInt,
        Meta(
            description="Restarts of one role's processes (rollout, reward, reference, or a custom role; its workers share the count) "
            "allowed within any ``restart_window_s``. A worker that dies during its own restart counts again. One more "
            "death stops the run cleanly, which ``max_resumes`` then resumes from the last checkpoint. 0: never restart."
        ),
    ] = 10
    restart_window_s: Annotated[
        PosFloat, Meta(description="The window of ``max_restarts_per_role``, in seconds: older restarts no longer count.")
    ] = 300.0
    restart_backoff_s: Annotated[
        NonNegFloat,
        Meta(
            description="A role's first restart in the window is immediate; the next waits this long, and each one after twice as long "
            "as the one before (at most 60 s)."
        ),
    ] = 1.0
    device: Annotated[Literal["cpu", "cuda", "npu"], Meta(description="Device kind of rollout and training.")] = "cpu"
    transport: Annotated[
        TransportConfig, Meta(description="nng transport of the actors (scheme ipc on one host, tcp across hosts).")
    ] = msgspec.field(default_factory=TransportConfig)
    threads_per_process: Annotated[Count, Meta(description="torch intra-op threads per worker process (cpu).")] = 1
    pin_trainer_cores: Annotated[
        NonNegInt,
        Meta(
            description="Async mode, local launcher: this many of the cores the driver may use (the first ones) go to the trainer's "
            "processes alone; every other process shares the rest (Linux CPU affinity). On a machine the run has to "
            "itself, whose few cores every role shares, the trainer (the critical path of an async step) then never waits "
            "for a core (docs/performance.md); where other jobs load the machine it hurts (the trainer is held to its busy "
            "cores). 0: the OS places every process on every core. Sync mode ignores it: its phases take turns, each may "
            "use every core."
        ),
    ] = 0
    pin_only_when_idle: Annotated[
        bool,
        Meta(
            description="With pin_trainer_cores: pin only if the machine's cores were nearly idle as the run started (under 20% "
            "busy over 0.3 s, /proc/stat), so a run started beside other jobs leaves its processes to the OS; the run prints "
            "its decision and summary.json records it (pinned_trainer_cores). false: pin whatever the load."
        ),
    ] = True
    rollout_devices: Annotated[
        list[NonNegInt],
        Meta(
            description="Accelerator ids for rollout replicas, one per replica (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES of "
            "its process). Empty: the process sees every device."
        ),
    ] = msgspec.field(default_factory=list)
    train_devices: Annotated[
        list[NonNegInt],
        Meta(description="Accelerator ids of the trainer: all of them for one rank, one per rank with ``train.num_ranks > 1``."),
    ] = msgspec.field(default_factory=list)
    reference_devices: Annotated[list[NonNegInt], Meta(description="Accelerator ids for reference workers, one per worker.")] = (
        msgspec.field(default_factory=list)
    )
    reward_model_devices: Annotated[
        list[NonNegInt], Meta(description="Accelerator ids for reward-model replicas, one per replica.")
    ] = msgspec.field(default_factory=list)
    python_path: Annotated[
        list[str],
        Meta(
            description="Directories (relative to the config file, like every path in it, or absolute) added to every process's "
            "PYTHONPATH, so custom roles and rewards in your own modules import."
        ),
    ] = msgspec.field(default_factory=list)
    ray_address: Annotated[str, Meta(description="Ray cluster address (launcher = ray); empty: RAY_ADDRESS.")] = ""

    def check(self, run: RunConfig) -> None:
        if self.pin_trainer_cores and self.launcher != "local":
            raise Refused("pin_trainer_cores", "pins cores of this machine: use it with launcher = 'local', or set it to 0")
        ranks = run.train.num_ranks
        if ranks > 1 and self.train_devices and len(self.train_devices) != ranks:
            raise Refused("train_devices", f"give one device per trainer rank ({ranks} ids), or none")
        for key, devices, count in (
            ("rollout_devices", self.rollout_devices, run.rollout.num_replicas),
            ("reference_devices", self.reference_devices, run.reference.num_workers),
            ("reward_model_devices", self.reward_model_devices, run.reward_model.num_replicas),
        ):
            if devices and len(devices) != count:
                raise Refused(key, f"give one device id per worker ({count})")
        try:
            self.transport.validate()
        except ValueError as exc:  # the transport names its keys already
            raise ConfigError(str(exc).replace("[cluster.transport] ", "cluster.transport.")) from None


class LoggingConfig(_Section):
    """What the run writes besides metrics.jsonl."""

    progress: Annotated[bool, Meta(description="Print one progress line per trainer step.")] = True
    tensorboard: Annotated[bool, Meta(description="Write TensorBoard event files (extra: asyncflow[tensorboard]).")] = False
    wandb_project: Annotated[str, Meta(description="Log to Weights & Biases under this project (extra: asyncflow[wandb]).")] = ""
    hang_timeout_s: Annotated[
        Seconds,
        Meta(
            description="If no trainer step completes for this long, or for 3 x the slowest step so far (before the first: 3 x "
            "the preflight's estimate of a step) when that is longer, print what every role is doing and write every "
            "process's Python stacks to ``RUN_DIR/logs/stall-<n>.txt`` (docs/faults.md, 'Stalls')."
        ),
    ] = 300.0
    spans: Annotated[bool, Meta(description="Record what every role does over time into RUN_DIR/trace.json (afctl trace).")] = (
        True
    )
    trace_every_s: Annotated[
        NonNegFloat,
        Meta(description="Rewrite RUN_DIR/trace.json this often during the run (afctl trace on a live run); 0: only at the end."),
    ] = 30.0
    samples_every: Annotated[
        NonNegInt,
        Meta(
            description="Every N trainer steps (from step 0), write ``samples_per_step`` of the step's rows as text to "
            "RUN_DIR/samples.jsonl: prompt, response, reward, how it ended (docs/metrics.md, 'What the model writes'); "
            "0: never."
        ),
    ] = 10
    samples_per_step: Annotated[Count, Meta(description="Rows written to RUN_DIR/samples.jsonl at each ``samples_every``.")] = 2


class PlannerConfig(_Section):
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
    cores: Annotated[
        NonNegInt,
        Meta(
            description="With cluster.device = cpu: the cores every process shares (0: all of this machine's). There the planner adds "
            'or removes rollout replicas and never gives the trainer threads (docs/planner.md, "online reallocation on a '
            'CPU box").'
        ),
    ] = 0

    def check(self, run: RunConfig) -> None:
        if self.online and self.max_rollout_replicas < run.rollout.num_replicas:  # a limit of the online planner alone
            raise Refused(
                "max_rollout_replicas",
                f"the online planner starts from rollout.num_replicas = {run.rollout.num_replicas} replicas: raise "
                "it to at least that",
            )
        if self.online and run.train.num_ranks > 1:
            raise Refused(
                "online",
                "the online planner moves threads and replicas for a one-rank trainer only: set "
                "it to false, or train.num_ranks = 1",
            )


class EnvConfig(_Section):
    """Multi-turn environments (docs/environments.md): each rollout row becomes a
    trajectory of model turns and environment steps. Off while ``path`` is empty."""

    path: Annotated[
        str,
        Meta(
            description="The environment, ``package.module:Name`` (a class or zero-argument function making an "
            "``asyncflow.envs.Environment``), importable on every rollout host; e.g. ``asyncflow.envs.calc:CalcEnv``. "
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
            "and the trajectory ends unfinished. 0: no limit (keep turns within the model's context yourself)."
        ),
    ] = 0
    max_observation_chars: Annotated[
        NonNegInt,
        Meta(
            description="Longest observation (a tool's result) put into a trajectory: a text one is cut to this many "
            "characters before it is tokenised, with a marker saying so (``[observation cut: N chars, ...]``); one given "
            "as token ids, to this many ids. Counted (``observations_cut`` in the rollout's log). A 50 MB tool result "
            "once grew a rollout process to 19 GB. 0: no limit."
        ),
    ] = 16384


class RunConfig(_Section):
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
    field's own constraints while decoding.)"""
    check_tree(cfg)


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
                "(SmolLM2-135M: `afctl model import-gguf smollm2 DIR`)",
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


def _field(path: str) -> msgspec.inspect.Field | None:
    """msgspec's view of the field at a dotted key (``train.num_steps``,
    ``cluster.rollout_devices[1]``, ``roles[0].name``), if there is one."""
    parent, _, name = re.sub(r"\[\d+\]$", "", path).rpartition(".")
    cls = schema.struct_at(RunConfig, parent) if parent else RunConfig
    if cls is None and parent:  # a union ([algorithm.loss]): the first of its Structs that has the key
        cls = next((m for m in schema.union_at(RunConfig, parent) if name in m.__struct_fields__), None)
    if cls is None or name not in cls.__struct_fields__:
        return None
    return schema.field_info(cls, name)


def _choices(path: str) -> str:
    """``; use one of 'sync', 'async'`` for a key whose type is a Literal."""
    parent, _, name = path.rpartition(".")
    cls = schema.struct_at(RunConfig, parent) if parent else RunConfig
    hint = typing.get_type_hints(cls, include_extras=True).get(name) if cls else None
    values = schema.literal_values(hint)
    members = schema.union_at(RunConfig, parent) if parent else []
    if members and name == members[0].__struct_config__.tag_field:  # which loss: the registry's names
        values = tuple(m.__struct_config__.tag for m in members)
    return "; use one of " + ", ".join(repr(v) for v in values) if values else ""


def _range_of(path: str) -> str:
    """The allowed range of the numeric key at ``path`` from its field's constraints
    (``>= 1``, ``between 0 and 1``); empty when it has none."""
    field = _field(path)
    return schema.allowed_range(field.type) if field else ""


def _where(key: str) -> str:
    """Where a key is set: ``[train] num_steps, or --set train.num_steps=...``."""
    bare = re.sub(r"\[\d+\]", "", key)
    parent, _, name = bare.rpartition(".")
    if parent == "roles":  # an array of tables: --set cannot reach into it
        return f"[[roles]] {name}"
    return f"[{parent}] {name}, or --set {bare}=..." if parent else f"{name} at the top level, or --set {bare}=..."


def _raw_value(raw: dict, path: str):
    """The value at a dotted path of the parsed TOML (``None`` when absent)."""
    node = raw
    for part in re.findall(r"[^.\[\]]+", path):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return node


MOVED_KEYS = {
    "algorithm.clip_eps": "moved to the loss's own section: [algorithm.loss] clip_low and clip_high "
    "(--set algorithm.loss.clip_low=... --set algorithm.loss.clip_high=...)",
    "algorithm.loss_agg": 'moved to the loss\'s own section: [algorithm.loss] agg ("token-mean"; '
    '"seq-mean-token-mean" for the old "seq_mean"; or "seq-mean-token-sum")',
}
"""Keys that left a section, and where they went (the error of a config that still sets one)."""


def _format_error(
    exc: msgspec.ValidationError, source: str, raw: dict | None = None, overrides: Sequence[str] = ()
) -> ConfigError:
    import difflib

    text = str(exc)
    what, _, where = text.rpartition(" - at `$.")
    key = where.rstrip("`") if what else ""
    what = what or text
    given = {item.partition("=")[0].strip(): item for item in overrides}
    if key and key.split("[")[0] in given:  # the value came from the command line, not the file
        source = f"--set {given[key.split('[')[0]]}"
    if what.startswith("Object contains unknown field"):
        unknown = what.split("`")[1]
        moved = MOVED_KEYS.get(f"{key}.{unknown}" if key else unknown)
        if moved:
            return ConfigError(f"{key}.{unknown}: {moved} (in {source}; keys are documented in docs/config.md)")
        cls = schema.struct_at(RunConfig, key) if key else RunConfig
        known = list(cls.__struct_fields__) if cls else []
        for member in schema.union_at(RunConfig, key) if key else []:  # [algorithm.loss]: every loss's keys
            tag = member.__struct_config__.tag_field
            known += [k for k in (tag or "", *member.__struct_fields__) if k and k not in known]
        close = difflib.get_close_matches(unknown, known, n=1)
        full = f"{key}.{unknown}" if key else unknown
        if full in given:
            source = f"--set {given[full]}"
        fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return ConfigError(f"{full}: unknown key; {fix} (in {source}; keys are documented in docs/config.md)")
    allowed = _range_of(key) if key and ", got" not in what else ""
    if allowed:  # a constraint: the key, the value and the range
        return ConfigError(
            f"{key} = {_raw_value(raw or {}, key)!r}: out of range; use a value {allowed} "
            f"(in {source}; set it in {_where(key)}; docs/config.md says what it means)"
        )
    if key:
        return ConfigError(f"{key}: {what}{_choices(key)} (in {source}); set it in {_where(key)}")
    return ConfigError(f"{what} (in {source})")


def apply_overrides(raw: dict, overrides: Sequence[str]) -> dict:
    """Set ``KEY=VALUE`` items (``train.engine.lr=3e-4``) into a parsed config; VALUE
    is a TOML value (``true``, ``2``, ``"a"``, ``[0, 1]``), bare words are strings."""
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: write KEY=VALUE with a dotted key, e.g. --set train.num_steps=10")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare word: a string
        table = raw
        *parents, leaf = key.split(".")
        for depth, part in enumerate(parents):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parents[: depth + 1])} is a value, not a table")
        table[leaf] = value
    return raw


def load_config_text(
    text: str, source: str = "<string>", overrides: Sequence[str] = (), base_dir: str | os.PathLike | None = None
) -> RunConfig:
    """The config in ``text``. ``base_dir``: the directory relative paths in it are
    relative to (that of the config file); None: the working directory."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from None
    apply_overrides(raw, overrides)
    loss = raw.get("algorithm", {}).get("loss") if isinstance(raw.get("algorithm"), dict) else None
    if isinstance(loss, dict):  # a union of losses needs its tag: without one, the default loss's keys are meant
        loss.setdefault("name", "ppo_clip")
    try:
        cfg = msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as exc:
        raise _format_error(exc, source, raw, overrides) from None
    given = {item.partition("=")[0].strip() for item in overrides}  # a --set path is relative to the working directory
    _resolve_paths(cfg, Path(base_dir) if base_dir is not None else None, source, given)
    validate(cfg)
    check_paths(cfg)
    _warn(cfg)
    return cfg


def _resolve_paths(cfg: RunConfig, base: Path | None, source: str, given: AbstractSet[str] = frozenset()) -> None:
    """Paths in a config file are relative to the file's directory: ``model.path``,
    ``data.path``, ``cluster.python_path``, so a run works from any directory. A
    ``model.path`` that is a checkpoint (``checkpoints/step_N``, with the Hugging Face
    model in ``step_N/model``) means that model directory. A path given with
    ``--set`` (keys in ``given``) is relative to the working directory."""

    def resolve(key: str, value: str) -> str:
        if key in given:
            return os.path.abspath(value)
        if base is None or os.path.isabs(value):
            return value
        beside = base / value
        if not beside.exists() and os.path.exists(value):  # older configs: relative to the working directory
            log.warning(
                "%s = %r is relative to the working directory; paths in a config file are relative to "
                "the file (%s): write %r, or an absolute path",
                key,
                value,
                source,
                os.path.relpath(os.path.abspath(value), base),
            )
            return os.path.abspath(value)
        return str(beside.resolve())

    if cfg.model.path:
        cfg.model.path = resolve("model.path", cfg.model.path)
        if not os.path.isfile(os.path.join(cfg.model.path, "config.json")) and os.path.isfile(
            os.path.join(cfg.model.path, "model", "config.json")
        ):
            cfg.model.path = os.path.join(cfg.model.path, "model")  # a checkpoint directory: its model
    if cfg.data.path:
        cfg.data.path = resolve("data.path", cfg.data.path)
    if cfg.reward_model.path:
        cfg.reward_model.path = resolve("reward_model.path", cfg.reward_model.path)
    if base is not None and cfg.cluster.python_path:
        resolved = [str((base / p).resolve()) for p in cfg.cluster.python_path]
        for key_value, p in zip(cfg.cluster.python_path, resolved):
            if not os.path.isdir(p):
                raise ConfigError(
                    f"cluster.python_path: {key_value!r} is {p}, not a directory (paths are relative "
                    f"to the config file, {source})"
                )
        cfg.cluster.python_path = resolved


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> RunConfig:
    """The config in ``path``, with ``KEY=VALUE`` overrides (``afctl up --set``) applied;
    its relative paths are relative to ``path``'s directory."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    return load_config_text(path.read_text(), str(path), overrides, base_dir=path.parent)


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as TOML-compatible JSON-ish text (written to RUN_DIR/config.json)."""
    return msgspec.json.format(msgspec.json.encode(cfg).decode(), indent=2)


def _toml(value: object) -> str:
    """A default as it is written in cluster.toml."""
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return msgspec.json.encode(value).decode()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_toml, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    return repr(value)


def config_markdown() -> str:
    """docs/config.md, walked from the schema: every section and key with its type,
    default, allowed range and description (``Meta(description=...)`` on the field)."""
    lines = [
        "# cluster.toml reference",
        "",
        "Generated by `python -m asyncflow.config.run --markdown` from the schema "
        "(config/run.py, engines/config.py, core/transport.py).",
        "",
    ]

    def section(cls: type, path: str, defaults: object = None, about: str = "") -> None:
        """``defaults``: the section as its parent builds it (``[critic.engine]`` has
        ``critic = true``), None for a table that has no default (``[[roles]]``)."""
        title = f"## `[{path}]`" if path else "## top level"
        lines.extend([title, "", *([about, ""] if about else []), " ".join((cls.__doc__ or "").split()), ""])
        info = msgspec.inspect.type_info(cls)
        assert isinstance(info, msgspec.inspect.StructType)
        nested, rows = [], []
        if info.tag_field:  # a tagged Struct (a policy loss): its tag is the key that picks it
            rows.append(
                f"| `{info.tag_field}` | `{info.tag!r}` | `{_toml(info.tag)}` | Which Struct this section is "
                "(a key of the registry, algorithms/registry.py). |"
            )
        for field in info.fields:
            meaning = schema.description(field)
            hint = typing.get_type_hints(cls, include_extras=True)[field.name]
            members = schema.struct_types(hint)
            if len(members) > 1:  # a union of tagged Structs ([algorithm.loss]): a section for each
                default = getattr(defaults, field.name)
                sub_path = f"{path}.{field.name}" if path else field.name
                for member in members:
                    tag = member.__struct_config__
                    about = f"{meaning} This one: `{tag.tag_field} = {_toml(tag.tag)}`" + (
                        " (the default)." if isinstance(default, member) else "."
                    )
                    nested.append((member, sub_path, default if isinstance(default, member) else member(), about))
                continue
            sub = schema.struct_type(hint)
            if sub is not None and not isinstance(schema.bare_type(field.type), msgspec.inspect.ListType):
                nested.append((sub, f"{path}.{field.name}" if path else field.name, getattr(defaults, field.name), meaning))
                continue
            if field.required:
                default = "(required)"
            elif defaults is not None:
                default = f"`{_toml(getattr(defaults, field.name))}`"
            else:
                default = f"`{_toml(field.default if field.default_factory is msgspec.NODEFAULT else field.default_factory())}`"
            allowed = schema.allowed_range(field.type)
            values = schema.literal_values(hint)
            type_name = " | ".join(map(repr, values)) if values else schema.type_name(field.type)
            type_name += f" ({allowed})" if allowed else ""
            if sub is not None:
                meaning = meaning or f"An array of tables, one `[[{field.name}]]` per entry: see `[[{field.name}]]` below."
                type_name = f"list[{sub.__name__}]"
            cells = [f"`{field.name}`", f"`{type_name}`", default, meaning]
            rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells[:3]) + f" | {meaning} |")
        if rows:
            lines.extend(["| key | type | default | meaning |", "|---|---|---|---|", *rows])
        else:
            lines.append("No keys of its own: " + ", ".join(f"`[{p}]`" for _, p, _, _ in nested) + " below.")
        lines.append("")
        for sub_cls, sub_path, sub_defaults, sub_about in nested:
            section(sub_cls, sub_path, sub_defaults, sub_about)

    section(RunConfig, "", RunConfig())
    section(RoleEntry, "[roles]")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if "--markdown" in sys.argv:
        print(config_markdown())
