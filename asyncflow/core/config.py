"""``cluster.toml``: the typed schema of a run, and its loader.

Every section is a msgspec Struct with defaults; unknown keys are errors. A wrong
key or value fails at load time with the key's dotted name and what to change:

    >>> load_config_text('[workflow]\\nmode = "fast"')
    ConfigError: workflow.mode = 'fast': Expected `'sync' | 'async'` ... (in <string>)

Docs of every key: ``docs/config.md`` (generated from these docstrings by
``python -m asyncflow.core.config --markdown``).
"""

from __future__ import annotations

import logging
import os
import tomllib
from pathlib import Path
from typing import Annotated, Literal, Sequence

import msgspec
from msgspec import Meta

from asyncflow.core.transport import TransportConfig
from asyncflow.engines.config import (
    Count, Fraction, NonNegFloat, NonNegInt, PosFloat, RolloutEngineConfig, SamplingParams, Seconds, TrainEngineConfig,
)


log = logging.getLogger(__name__)


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelConfig(_Section):
    """The policy model."""

    path: str = ""
    """Local Hugging Face directory (config.json, safetensors, tokenizer), relative to
    the config file or absolute; a run's checkpoint (``checkpoints/step_N``, or the
    link ``checkpoints/latest``) works too. Empty: build the tiny model (``tiny``)
    into ``RUN_DIR/model``. docs/your-model-and-data.md."""
    tiny: Literal["qwen2", "llama"] = "qwen2"
    """Architecture of the tiny model built when ``path`` is empty."""
    tiny_warm_start: bool = True
    """Warm-start the tiny model with a short supervised pass on the task, stopped
    early (about 10% greedy accuracy), so RL has a signal from step one."""
    tiny_warm_start_steps: NonNegInt = 100
    """Supervised steps of that warm start (more: a stronger start, less left to learn)."""


class DataConfig(_Section):
    """Prompts: a local JSONL or Parquet file with ``prompt`` and ``answer`` fields."""

    path: str = ""
    """The data file, relative to the config file or absolute (fields:
    docs/your-model-and-data.md). Empty: generate the tiny arithmetic task
    (``task``) into ``RUN_DIR/data.jsonl``."""
    task: str = "add"
    """Built-in task when ``path`` is empty (see asyncflow.engines.tiny)."""
    num_prompts: Count = 2000
    """Prompts generated for the built-in task."""
    chat_template: bool = True
    """Apply the tokenizer's chat template to each prompt."""
    shuffle: bool = True
    """Shuffle the prompts (with ``seed``) before each epoch."""
    seed: NonNegInt = 0
    """Seed of the shuffle and of generated tasks."""


class AlgorithmConfig(_Section):
    """The RL algorithm and its knobs."""

    name: Literal["grpo", "ppo"] = "grpo"
    """grpo: group-normalised advantages, no critic. ppo: critic + GAE."""
    group_size: Count = 8
    """Responses sampled per prompt (GRPO's n)."""
    std_normalize: bool = True
    """GRPO: divide group-centred rewards by the group's std."""
    clip_eps: PosFloat = 0.2
    """Policy ratio clip range (PPO-clip)."""
    kl_coef: NonNegFloat = 0.0
    """Weight of the KL to the reference policy; 0 disables the reference role."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator."""
    kl_in_reward: bool = False
    """Put the KL penalty into the reward instead of the loss, estimated by
    ``kl_estimator`` on the rollout log-probs. GRPO: each response's reward minus
    kl_coef x its KL summed over the response tokens, before the group normalisation.
    PPO: minus kl_coef x the token's KL on every response token's reward, before GAE."""
    entropy_coef: NonNegFloat = 0.0
    """Entropy bonus weight."""
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    """Aggregate the per-token loss by token mean or by sequence mean."""
    is_truncation: NonNegFloat = 2.0
    """Off-policy correction: cap of the importance weight pi_prox / mu between the
    trainer's policy before the update and the rollout policy of stale samples (0
    disables; with ``clip_against = "proximal"`` only). Per token or per sequence by
    ``is_level``."""
    gamma: Fraction = 1.0
    """PPO: discount."""
    lam: Fraction = 0.95
    """PPO: GAE lambda."""
    value_clip: NonNegFloat = 0.2
    """PPO: value clipping range."""
    epochs: Count = 1
    """Optimizer passes over each global batch. Above 1, the trainer first recomputes
    the batch's log-probs (one forward pass, pi_prox) so that every pass clips its
    ratio against the policy before the first one."""
    clip_against: Literal["proximal", "behaviour"] = "behaviour"
    """What the PPO ratio is clipped against. behaviour (the default) is what keeps
    async runs learning as much as sync (docs/results.md). proximal (decoupled PPO): pi / pi_prox,
    pi_prox the policy before this update, times the truncated importance weight
    pi_prox / mu (``is_truncation``); with one optimizer step per batch the ratio is 1
    and only that weight corrects staleness. behaviour (coupled PPO): pi / mu, mu the
    rollout policy that generated the sample, with no separate weight
    (``is_truncation`` unused): a trust region around the data's policy, which limits
    drift on stale samples. See docs/algorithms.md."""
    is_level: Literal["token", "sequence"] = "token"
    """Level of the importance ratio pi_prox / mu used by ``is_truncation`` and the
    mask: each token's own, or one per sequence (the product of its token ratios,
    exp of the sum of their logs over the response) on every token of it."""
    is_mask_low: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    """Masked importance sampling (IcePop style): tokens (whole sequences with
    ``is_level = "sequence"``) whose pi_prox / mu is below this are dropped from the
    policy-gradient term; counted in the metric ``is_masked_frac``. 0: no lower
    bound; otherwise below 1 (e.g. 0.5)."""
    is_mask_high: NonNegFloat = 0.0
    """Masked importance sampling: tokens (sequences) whose pi_prox / mu is above this
    are dropped too. 0: no upper bound; otherwise above 1 (e.g. 2.0). Both bounds 0:
    no mask."""


class RolloutConfig(_Section):
    """Rollout replicas (generation)."""

    engine: RolloutEngineConfig = msgspec.field(default_factory=RolloutEngineConfig)
    """Engine of every replica (see engines/config.py)."""
    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    """Sampling; ``n`` is ignored (the algorithm's group_size is used)."""
    num_replicas: Count = 1
    """Replica processes; each takes whole prompt groups from the queue."""
    prompts_per_call: Count = 4
    """Prompt groups per generate call (the unit between weight swaps)."""


class ReferenceConfig(_Section):
    """Reference policy log-probs (for the KL term)."""

    num_workers: Count = 1
    """Worker processes (used only when algorithm.kl_coef > 0)."""
    micro_batch_size: Count = 16
    """Rows per forward pass."""


class RewardConfig(_Section):
    """Reward workers."""

    functions: list[str] = msgspec.field(default_factory=lambda: ["math_answer"])
    """Rewards summed (with ``weights``): built-ins ``exact_match``, ``math_answer``, or
    dotted paths ``package.module:function`` of custom rewards, each called on a batch
    as ``fn(prompts, responses, answers, finish_reasons) -> list[float]``."""
    weights: list[float] = msgspec.field(default_factory=list)
    """Weight per function (default 1 each)."""
    num_workers: Count = 1
    """Worker processes."""
    batch_size: Count = 256
    """Most rows scored per call (async mode takes whatever is ready, up to this; a
    call costs a few queue round trips, so small calls waste CPU)."""


class CriticConfig(_Section):
    """PPO critic (value model), initialised from the policy with a value head."""

    engine: TrainEngineConfig = msgspec.field(default_factory=lambda: TrainEngineConfig(critic=True, lr=1e-4))
    """Training engine of the critic."""


class TrainConfig(_Section):
    """The trainer (actor update)."""

    engine: TrainEngineConfig = msgspec.field(default_factory=TrainEngineConfig)
    """Training engine (see engines/config.py)."""
    num_steps: Count = 60
    """Trainer steps (policy versions) in the run."""
    prompts_per_step: Count = 8
    """Prompt groups per global batch (samples per step = this * group_size)."""
    num_ranks: Count = 1
    """Trainer processes (data parallel with FSDP2: needs ``engine.fsdp = true``). Rank 0
    reads the batch plan and publishes weights; every rank reads its own rows from the
    queue. With ``cluster.train_devices``, give one device per rank."""
    dist_port: Annotated[int, Meta(ge=0, le=65535)] = 0
    """Port of rank 0's torch.distributed store (0: any free port, published through the
    directory). Set it when only some ports are open between nodes."""
    dist_timeout_s: Seconds = 600.0
    """How long trainer ranks wait for each other (rendezvous, each collective) before
    failing: a rank whose peer vanished fails after this, it never hangs."""
    checkpoint_every: NonNegInt = 0
    """Save a Hugging Face checkpoint and the queue state every N steps (0: at the end only)."""


class EvalConfig(_Section):
    """Evaluation of the policy on held-out prompts during the run (docs/metrics.md,
    ``val/*``). The trainer evaluates in its own process, with a private native
    rollout engine on its device holding the weights it has just published (whatever
    ``rollout.engine.type``; its KV cache: ``rollout.engine.kv_cache_bytes``, or 64 MiB);
    only trainer rank 0 evaluates, the other ranks wait for it."""

    every_steps: NonNegInt = 0
    """Evaluate after every this many trainer steps and after the last one; 0 disables
    evaluation (and the held-out split: every prompt is trained on)."""
    num_prompts: Count = 20
    """Held-out prompts: this many distinct prompts drawn (with ``data.seed``) from the
    data file; every row with one of them is left out of training. The data must have
    more distinct prompts than this (the built-in ``add`` task has 100)."""
    mode: Literal["greedy", "pass_at_k"] = "greedy"
    """greedy: one response per prompt at temperature 0. pass_at_k: ``k`` responses per
    prompt at ``rollout.sampling.temperature``; a prompt passes if any is correct."""
    k: Count = 4
    """Responses per prompt in pass_at_k mode."""
    max_new_tokens: NonNegInt = 0
    """Most response tokens; 0: ``rollout.sampling.max_new_tokens``."""
    correct_reward: float = 0.999
    """A response counts as correct when its reward (``reward.functions`` with
    ``reward.weights``) is at least this. The built-in tasks give 1.0 to an exact answer."""
    save_best: bool = True
    """At each evaluation whose ``val/accuracy`` beats every earlier one, save the
    weights (a Hugging Face directory, no optimizer) to ``checkpoints/best_<version>``
    and point the link ``checkpoints/best`` at it (``checkpoints/best.json`` says which)."""


class QueueConfig(_Section):
    """TransferQueue."""

    num_shards: Count = 1
    """Storage shard processes."""
    capacity_rows: NonNegInt = 0
    """Most rows held at once (producers wait beyond it). 0: enough for staleness+2 steps."""
    shm: bool = True
    """Same-host shared-memory data path for tensor bytes."""
    inline_max_bytes: Annotated[int, Meta(ge=0, le=1 << 20)] = 16384
    """A put of at most this many bytes travels with the shard's notice to the
    controllers, and the consumer gets it in the GetBatch reply: one round trip less
    for small rows. 0: every read goes to the shard."""


class WorkflowConfig(_Section):
    """How the roles overlap."""

    mode: Literal["sync", "async"] = "async"
    """sync: generate the whole batch, then score, then train, then sync weights (the
    baseline). async: every role streams; rollout runs ahead by up to ``staleness``."""
    staleness: NonNegInt = 1
    """Bound k: a sample generated by policy version v is trained at step s only if
    s - v <= k. Forced to 0 in sync mode."""
    substep_updates: bool = True
    """Rollout replicas swap to new weights one at a time (capacity never drops to 0)."""
    weight_timeout_s: Seconds = 120.0
    """How long one step of a weight transfer (a chunk over nng, a broadcast over the
    collective, building its group) may take before the replica gives up on that
    version and fetches the next one announced."""
    verify_weights: Literal["error", "count", "off"] = "error"
    """Version integrity: every row carries the digest of the weights that generated it
    and the trainer checks it against the version the row is tagged with
    (``engines/digest.py``). error: a mismatch fails the step, naming the row. count:
    counted in the ``weights_mismatch`` metric. off: no digests."""
    weight_transport: Literal["nng", "collective"] = "nng"
    """How the weight bytes reach rollout replicas. nng: chunks pulled over the actor
    transport (host-staged). collective: broadcast over a two-member torch.distributed
    group per replica (gloo on cpu, nccl on cuda, hccl on npu) into buffers on the
    replica's device; announcements and swap grants stay on nng. A replica whose
    trainer side has no such collective falls back to nng (logged)."""


class RoleEntry(_Section):
    """A custom role: any Actor subclass, started in its own process."""

    name: str
    """Actor name (unique)."""
    cls: str
    """Dotted path ``package.module:Class`` of an asyncflow Actor."""
    kwargs: dict = msgspec.field(default_factory=dict)
    """Keyword arguments of its constructor (after ``ctx``; ``run_dir`` is always given)."""
    task: str = ""
    """A queue task to create for this role (``tq.controller.<task>``): rows are freed
    only after the role acked them. Empty: the role reads no rows."""
    reward_column: str = ""
    """A column this role puts (one float per row) that the trainer waits for and adds
    to the reward, times ``reward_weight``."""
    reward_weight: float = 1.0
    """Weight of ``reward_column`` in the reward."""


class ClusterConfig(_Section):
    """Where processes run."""

    launcher: Literal["local", "ray"] = "local"
    """local: every process on this machine. ray: placed by a running Ray cluster."""
    max_resumes: NonNegInt = 0
    """When a process that cannot be restarted alone dies (queue, shard, loader, a
    trainer rank) or its node is lost, stop cleanly and resume from the last
    checkpoint, up to this many times per `afctl up` (0: stop and print the resume
    command). Rollout, reward, reference and custom-role processes are restarted
    in place (within ``max_restarts_per_role``)."""
    max_restarts_per_role: NonNegInt = 10
    """Restarts of one role's processes (rollout, reward, reference, or a custom role;
    its workers share the count) allowed within any ``restart_window_s``. A worker that
    dies during its own restart counts again. One more death stops the run cleanly,
    which ``max_resumes`` then resumes from the last checkpoint. 0: never restart."""
    restart_window_s: PosFloat = 300.0
    """The window of ``max_restarts_per_role``, in seconds: older restarts no longer count."""
    restart_backoff_s: NonNegFloat = 1.0
    """A role's first restart in the window is immediate; the next waits this long,
    and each one after twice as long as the one before (at most 60 s)."""
    device: Literal["cpu", "cuda", "npu"] = "cpu"
    """Device kind of rollout and training."""
    transport: TransportConfig = msgspec.field(default_factory=TransportConfig)
    """nng transport of the actors (scheme ipc on one host, tcp across hosts)."""
    threads_per_process: Count = 1
    """torch intra-op threads per worker process (cpu)."""
    pin_trainer_cores: NonNegInt = 0
    """Async mode, local launcher: this many of the cores the driver may use (the
    first ones) go to the trainer's processes alone; every other process shares the
    rest (Linux CPU affinity). On a machine the run has to itself, whose few cores
    every role shares, the trainer (the critical path of an async step) then never
    waits for a core (docs/performance.md); where other jobs load the machine it
    hurts (the trainer is held to its busy cores). 0: the OS places every process on
    every core. Sync mode ignores it: its phases take turns, each may use every core."""
    rollout_devices: list[NonNegInt] = msgspec.field(default_factory=list)
    """Accelerator ids for rollout replicas, one per replica (CUDA_VISIBLE_DEVICES /
    ASCEND_RT_VISIBLE_DEVICES of its process). Empty: the process sees every device."""
    train_devices: list[NonNegInt] = msgspec.field(default_factory=list)
    """Accelerator ids of the trainer: all of them for one rank, one per rank with
    ``train.num_ranks > 1``."""
    reference_devices: list[NonNegInt] = msgspec.field(default_factory=list)
    """Accelerator ids for reference workers, one per worker."""
    python_path: list[str] = msgspec.field(default_factory=list)
    """Directories (relative to the config file, like every path in it, or absolute) added to every process's
    PYTHONPATH, so custom roles and rewards in your own modules import."""
    ray_address: str = ""
    """Ray cluster address (launcher = ray); empty: RAY_ADDRESS."""


class LoggingConfig(_Section):
    """What the run writes besides metrics.jsonl."""

    progress: bool = True
    """Print one progress line per trainer step."""
    tensorboard: bool = False
    """Write TensorBoard event files (extra: asyncflow[tensorboard])."""
    wandb_project: str = ""
    """Log to Weights & Biases under this project (extra: asyncflow[wandb])."""
    hang_timeout_s: Seconds = 300.0
    """If no trainer step completes for this long, print what every role waits on."""
    spans: bool = True
    """Record what every role does over time into RUN_DIR/trace.json (afctl trace)."""
    trace_every_s: NonNegFloat = 30.0
    """Rewrite RUN_DIR/trace.json this often during the run (afctl trace on a live run);
    0: only at the end."""


class PlannerConfig(_Section):
    """The planner actor (online reallocation; docs/planner.md)."""

    online: bool = False
    """Move worker processes between rollout and training during the run."""
    imbalance_threshold: NonNegFloat = 0.2
    """Busy-fraction gap (rollout - training) beyond which one side counts as
    waiting on the other in a step."""
    patience_steps: Count = 3
    """Steps in a row that must lean the same way before a move, and steps between moves."""
    min_gain: NonNegFloat = 0.05
    """Predicted step-time gain (fraction) a move must bring to be made."""
    max_rollout_replicas: Count = 4
    """Most rollout replica processes the planner may run (it never adds beyond)."""
    train_threads: NonNegInt = 0
    """torch threads of the trainer at start (its workers, the ones the planner moves
    to rollout); 0: cluster.threads_per_process."""
    measure_steps: Count = 3
    """Steps after a move over which its measured gain is recorded in planner.jsonl."""
    cores: NonNegInt = 0
    """With cluster.device = cpu: the cores every process shares (0: all of this
    machine's). There the planner adds or removes rollout replicas and never gives
    the trainer threads (docs/planner.md, "online reallocation on a CPU box")."""


class RunConfig(_Section):
    """A whole run (one cluster.toml)."""

    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    algorithm: AlgorithmConfig = msgspec.field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    reference: ReferenceConfig = msgspec.field(default_factory=ReferenceConfig)
    reward: RewardConfig = msgspec.field(default_factory=RewardConfig)
    critic: CriticConfig = msgspec.field(default_factory=CriticConfig)
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    queue: QueueConfig = msgspec.field(default_factory=QueueConfig)
    workflow: WorkflowConfig = msgspec.field(default_factory=WorkflowConfig)
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    planner: PlannerConfig = msgspec.field(default_factory=PlannerConfig)
    roles: list[RoleEntry] = msgspec.field(default_factory=list)
    seed: NonNegInt = 0
    """Global seed."""

    @property
    def staleness(self) -> int:
        return 0 if self.workflow.mode == "sync" else self.workflow.staleness

    @property
    def samples_per_step(self) -> int:
        return self.train.prompts_per_step * self.algorithm.group_size


class ConfigError(ValueError):
    """A config value is wrong; the message names the key and the fix."""


def _need(ok: bool, key: str, value, fix: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r}: {fix}")


def _check(cfg: RunConfig) -> None:
    need = _need
    need(
        cfg.algorithm.name != "grpo" or cfg.algorithm.group_size >= 2,
        "algorithm.group_size", cfg.algorithm.group_size, "GRPO needs at least 2 responses per prompt",
    )
    _check_algorithm(cfg.algorithm)
    ranks = cfg.train.num_ranks
    if ranks > 1:
        need(cfg.train.engine.fsdp, "train.engine.fsdp", cfg.train.engine.fsdp,
             f"train.num_ranks = {ranks} trains data parallel with FSDP2: set [train.engine] fsdp = true")
        need(cfg.algorithm.name != "ppo" or cfg.critic.engine.fsdp, "critic.engine.fsdp", cfg.critic.engine.fsdp,
             f"the PPO critic trains on the same {ranks} ranks: set [critic.engine] fsdp = true")
        need(cfg.train.prompts_per_step % ranks == 0, "train.prompts_per_step", cfg.train.prompts_per_step,
             f"every rank trains whole prompt groups: use a multiple of train.num_ranks ({ranks})")
        need(not cfg.cluster.train_devices or len(cfg.cluster.train_devices) == ranks, "cluster.train_devices",
             cfg.cluster.train_devices, f"give one device per trainer rank ({ranks} ids), or none")
        need(not cfg.planner.online, "planner.online", cfg.planner.online,
             "the online planner moves threads and replicas for a one-rank trainer only: set it to false, "
             "or train.num_ranks = 1")
    need(
        not cfg.reward.weights or len(cfg.reward.weights) == len(cfg.reward.functions),
        "reward.weights", cfg.reward.weights, f"give one weight per function ({len(cfg.reward.functions)})",
    )
    need(
        cfg.queue.capacity_rows == 0 or cfg.queue.capacity_rows >= cfg.samples_per_step,
        "queue.capacity_rows", cfg.queue.capacity_rows,
        f"must hold at least one global batch ({cfg.samples_per_step} rows) or be 0 (automatic)",
    )
    if cfg.model.path:
        need(os.path.isdir(cfg.model.path), "model.path", cfg.model.path,
             "no such directory; give a local Hugging Face model directory (relative to the config file), "
             "or a checkpoint of a run (RUN_DIR/checkpoints/latest)")
        need(os.path.isfile(os.path.join(cfg.model.path, "config.json")), "model.path", cfg.model.path,
             "not a Hugging Face model directory (no config.json); give a directory saved with save_pretrained, "
             "or a checkpoint of a run (RUN_DIR/checkpoints/step_N or RUN_DIR/checkpoints/latest)")
    if cfg.data.path:
        need(os.path.isfile(cfg.data.path), "data.path", cfg.data.path,
             "no such file; give a .jsonl or .parquet file (relative to the config file, or absolute)")
        need(
            cfg.data.path.endswith((".jsonl", ".parquet")), "data.path", cfg.data.path, "use a .jsonl or .parquet file",
        )
    names = [r.name for r in cfg.roles]
    need(cfg.cluster.pin_trainer_cores == 0 or cfg.cluster.launcher == "local", "cluster.pin_trainer_cores",
         cfg.cluster.pin_trainer_cores, "pins cores of this machine: use it with launcher = 'local', or set it to 0")
    need(len(names) == len(set(names)), "roles.name", names, "role names must be unique")
    builtin = {"loader", "trainer", "weights", "collector", "directory"}
    for r in cfg.roles:
        need(r.name not in builtin and not r.name.startswith(("rollout.", "reward.", "reference.", "tq.", "host.")),
             "roles.name", r.name, "this name belongs to a built-in role; choose another")
        need(not r.reward_column or bool(r.task), "roles.reward_column", r.reward_column,
             f"role {r.name!r} must also set `task` (the queue task it reads rows from)")
    ev = cfg.eval
    if ev.every_steps:
        need(ev.mode != "pass_at_k" or cfg.rollout.sampling.temperature > 0, "eval.mode", ev.mode,
             "pass_at_k samples at rollout.sampling.temperature, which is 0 (greedy): every sample would be "
             "the same; use mode = 'greedy' or a temperature above 0")
    need(
        cfg.planner.max_rollout_replicas >= cfg.rollout.num_replicas, "planner.max_rollout_replicas",
        cfg.planner.max_rollout_replicas, f"must be at least rollout.num_replicas ({cfg.rollout.num_replicas})",
    )
    try:
        cfg.cluster.transport.validate()
    except ValueError as exc:  # the transport names its keys already
        raise ConfigError(str(exc).replace("[cluster.transport] ", "cluster.transport.")) from None
    for key, devices, count in (("rollout_devices", cfg.cluster.rollout_devices, cfg.rollout.num_replicas),
                                ("reference_devices", cfg.cluster.reference_devices, cfg.reference.num_workers)):
        need(not devices or len(devices) == count, f"cluster.{key}", devices, f"give one device id per worker ({count})")


def _check_algorithm(alg: AlgorithmConfig) -> None:
    need = _need
    need(alg.is_mask_high == 0 or alg.is_mask_high > 1, "algorithm.is_mask_high", alg.is_mask_high,
         "use 0 (no upper bound) or a ratio above 1 such as 2.0")


def _warn(cfg: RunConfig) -> None:
    """Loud warnings for configs that are valid but likely wrong."""
    alg = cfg.algorithm
    uncorrected = (alg.is_truncation == 0 and alg.is_mask_low == 0 and alg.is_mask_high == 0
                   and alg.clip_against == "proximal")
    if cfg.staleness > 0 and uncorrected:
        log.warning(
            "workflow.staleness = %d in async mode trains on samples up to %d policy versions old, with no "
            "off-policy correction: set algorithm.is_truncation (e.g. 2.0), algorithm.is_mask_low / "
            "algorithm.is_mask_high (e.g. 0.5 / 2.0) or algorithm.clip_against = \"behaviour\" "
            "(see docs/algorithms.md)", cfg.staleness, cfg.staleness)


def _struct_at(path: str) -> type | None:
    """The Struct type at a dotted config path (``rollout.engine``), if any."""
    import typing

    cls: type = RunConfig
    for part in [p for p in path.replace("]", "").replace("[", ".").split(".") if p and not p.isdigit()]:
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        hint = hints[part]
        hint = typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint
        if not (isinstance(hint, type) and issubclass(hint, msgspec.Struct)):
            return None
        cls = hint
    return cls


def _field_hint(path: str) -> str:
    import typing

    parent, _, name = path.rpartition(".")
    cls = _struct_at(parent) if parent else RunConfig
    if cls is None:
        return ""
    hint = typing.get_type_hints(cls).get(name)
    if typing.get_origin(hint) is Literal:
        return "; use one of " + ", ".join(repr(v) for v in typing.get_args(hint))
    return ""


def _range_of(path: str) -> str:
    """The allowed range of the numeric key at ``path`` (``train.num_steps``,
    ``cluster.rollout_devices[1]``), from its field's msgspec constraints: ``>= 1``,
    ``between 0 and 1``; empty when it has none."""
    import re
    import typing

    parent, _, name = re.sub(r"\[\d+\]$", "", path).rpartition(".")
    cls = _struct_at(parent) if parent else RunConfig
    if cls is None:
        return ""
    hint = typing.get_type_hints(cls, include_extras=True).get(name)
    metas: list[msgspec.Meta] = []

    def collect(h) -> None:
        if typing.get_origin(h) is Annotated:
            metas.extend(m for m in typing.get_args(h)[1:] if isinstance(m, msgspec.Meta))
            return
        for arg in typing.get_args(h):
            collect(arg)

    collect(hint)
    if not metas:
        return ""
    m = metas[0]
    low = (">=", m.ge) if m.ge is not None else ((">", m.gt) if m.gt is not None else None)
    high = ("<=", m.le) if m.le is not None else (("<", m.lt) if m.lt is not None else None)
    if low and high and low[0] == ">=" and high[0] == "<=":
        return f"between {low[1]} and {high[1]}"
    return " and ".join(f"{bound[0]} {bound[1]}" for bound in (low, high) if bound)


def _raw_value(raw: dict, path: str):
    """The value at a dotted path of the parsed TOML (``None`` when absent)."""
    import re

    node = raw
    for part in re.findall(r"[^.\[\]]+", path):
        try:
            node = node[int(part)] if isinstance(node, list) else node[part]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
    return node


def _format_error(exc: msgspec.ValidationError, source: str, raw: dict | None = None,
                  overrides: Sequence[str] = ()) -> ConfigError:
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
        cls = _struct_at(key) if key else RunConfig
        known = list(cls.__struct_fields__) if cls else []
        close = difflib.get_close_matches(unknown, known, n=1)
        full = f"{key}.{unknown}" if key else unknown
        if full in given:
            source = f"--set {given[full]}"
        fix = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
        return ConfigError(f"{full}: unknown key; {fix} (in {source}; keys are documented in docs/config.md)")
    allowed = _range_of(key) if key and ", got" not in what else ""
    if allowed:  # a constraint: the key, the value and the range
        return ConfigError(f"{key} = {_raw_value(raw or {}, key)!r}: out of range; use a value {allowed} "
                           f"(in {source}; docs/config.md says what it means)")
    if key:
        return ConfigError(f"{key}: {what}{_field_hint(key)} (in {source})")
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
                raise ConfigError(f"--set {item!r}: {'.'.join(parents[:depth + 1])} is a value, not a table")
        table[leaf] = value
    return raw


def load_config_text(text: str, source: str = "<string>", overrides: Sequence[str] = (),
                     base_dir: str | os.PathLike | None = None) -> RunConfig:
    """The config in ``text``. ``base_dir``: the directory relative paths in it are
    relative to (that of the config file); None: the working directory."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from None
    apply_overrides(raw, overrides)
    try:
        cfg = msgspec.convert(raw, RunConfig)
    except msgspec.ValidationError as exc:
        raise _format_error(exc, source, raw, overrides) from None
    given = {item.partition("=")[0].strip() for item in overrides}  # a --set path is relative to the working directory
    _resolve_paths(cfg, Path(base_dir) if base_dir is not None else None, source, given)
    _check(cfg)
    _warn(cfg)
    return cfg


def _resolve_paths(cfg: RunConfig, base: Path | None, source: str, given: set[str] = frozenset()) -> None:
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
            log.warning("%s = %r is relative to the working directory; paths in a config file are relative to "
                        "the file (%s): write %r, or an absolute path", key, value, source,
                        os.path.relpath(os.path.abspath(value), base))
            return os.path.abspath(value)
        return str(beside.resolve())

    if cfg.model.path:
        cfg.model.path = resolve("model.path", cfg.model.path)
        if not os.path.isfile(os.path.join(cfg.model.path, "config.json")) and \
                os.path.isfile(os.path.join(cfg.model.path, "model", "config.json")):
            cfg.model.path = os.path.join(cfg.model.path, "model")  # a checkpoint directory: its model
    if cfg.data.path:
        cfg.data.path = resolve("data.path", cfg.data.path)
    if base is not None and cfg.cluster.python_path:
        resolved = [str((base / p).resolve()) for p in cfg.cluster.python_path]
        for key_value, p in zip(cfg.cluster.python_path, resolved):
            if not os.path.isdir(p):
                raise ConfigError(f"cluster.python_path: {key_value!r} is {p}, not a directory (paths are relative "
                                  f"to the config file, {source})")
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


def _field_docs(cls: type) -> dict[str, str]:
    """Field docstrings (the string literal under each field) read from the source."""
    import ast
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


_DOCS_OUTSIDE = {  # keys of Structs defined outside this module whose source has no field docstring yet
    ("TransportConfig", "scheme"): "``inproc`` (every actor in one process: tests), ``ipc`` (one host: unix sockets "
    "in ``ipc_dir``) or ``tcp`` (several hosts).",
    ("TransportConfig", "bind_host"): "tcp: the address listeners bind. Loopback by default; any other address needs "
    "``secret`` or ``tls_dir`` (docs/security.md), and a wildcard (``0.0.0.0``) needs ``advertise_host``.",
    ("TransportConfig", "max_message_bytes"): "The largest frame an actor listener accepts (nng drops a bigger one): "
    "bounds weight chunks and queue batches.",
    ("TransportConfig", "connect_timeout_s"): "Seconds to wait when dialing a peer and for the directory's answers "
    "(register, look up) before failing.",
}
"""Descriptions for docs/config.md of keys whose defining module (core/transport.py)
has no docstring under them; a docstring written there takes precedence."""


def config_markdown() -> str:
    """docs/config.md: every section and key with its type, default and meaning."""
    import re
    import typing

    lines = ["# cluster.toml reference", "", "Generated by `python -m asyncflow.core.config --markdown`.", ""]

    def section(cls: type, path: str) -> None:
        lines.extend([f"## `[{path}]`" if path else "## top level", "", " ".join((cls.__doc__ or "").split()), ""])
        docs = _field_docs(cls)
        nested, rows = [], []
        for f in msgspec.structs.fields(cls):
            hint = typing.get_type_hints(cls)[f.name]
            if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
                nested.append((hint, f"{path}.{f.name}" if path else f.name))
                continue
            default = f.default if f.default is not msgspec.NODEFAULT else (
                f.default_factory() if f.default_factory is not msgspec.NODEFAULT else "(required)")
            type_name = hint.__name__ if isinstance(hint, type) and not typing.get_args(hint) else re.sub(r"[\w.]+\.(\w+)", r"\1", str(hint))
            allowed = _range_of(f"{path}.{f.name}" if path else f.name)
            type_name = type_name.replace("Optional[", "").rstrip("]") + " | None" if type_name.startswith("Optional[") else type_name
            type_name = (type_name + (f" ({allowed})" if allowed else "")).replace("|", "\\|")
            meaning = docs.get(f.name) or _DOCS_OUTSIDE.get((cls.__name__, f.name), "")
            element = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
            if not meaning and isinstance(element, type) and issubclass(element, msgspec.Struct):
                meaning = f"An array of tables, one `[[{f.name}]]` per entry: see `[[{f.name}]]` below."
            rows.append(f"| `{f.name}` | `{type_name}` | `{default!r}` | {meaning} |")
        if rows:
            lines.extend(["| key | type | default | meaning |", "|---|---|---|---|", *rows])
        else:
            lines.append("No keys of its own: " + ", ".join(f"`[{p}]`" for _, p in nested) + " below.")
        lines.append("")
        for sub, sub_path in nested:
            section(sub, sub_path)

    section(RunConfig, "")
    section(RoleEntry, "[roles]")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if "--markdown" in sys.argv:
        print(config_markdown())
