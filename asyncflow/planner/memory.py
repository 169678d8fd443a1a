"""Memory per process, from a model's shape and a run config: the pieces each role's
spec adds up for its own instances (``RoleSpec.memory``, ``RoleSpec.working_memory``),
which the preflight sums and checks against the host (``actors/driver/preflight.py``).

Pure functions. ``cfg`` is a run config (``config/``), read by attribute.

Two kinds of figure:
- states (``memory``): weights, optimizer states, KV budgets, staged snapshots: a
  lower bound, known before the data is read;
- working (``working_memory``): the process's runtime and the trainer's activations and
  kept logits of one micro-batch at the data's mean prompt length: an estimate, not a
  bound (allocator slack comes on top: SmolLM2-135M, examples/smollm2.toml: trainer
  5.2 GiB estimated, 6.7 GiB RSS measured; replica 1.4 and 2.0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from asyncflow.planner.models import Lora, ModelShape, adapted_params, total_params, trainable_params

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROCESS_BYTES = 350 << 20
"""What a worker process holds before any model: Python, torch and transformers imported
(measured here: 0.35-0.4 GiB RSS for the loader, which loads no weights)."""
LOGIT_COPIES = 4
"""float32 copies of a micro-batch's kept logits the loss holds for the backward pass
(the logits, their log-softmax, its exp for the entropy, the gradient)."""
DEFAULT_KV_BYTES = 64 << 20
"""The native engine's KV-cache budget when the config gives none."""


@dataclass(frozen=True)
class MemoryFacts:
    """What the run's files say, read once by the preflight."""

    shape: ModelShape
    """The policy's."""
    reward_model_params: int
    """The reward model's parameters (the policy's for a judge without a path; 0 without one)."""
    prompt_tokens: float | None = None
    """The data's mean prompt length in tokens; None: working figures are not asked for."""


def trainer_state_bytes(shape: ModelShape, lora: Lora, dtype_bytes: int) -> int:
    """A trained model's state at the parameter dtype: the weights of every parameter
    (base + adapters), and a gradient and two AdamW moments per trainable one. Without
    LoRA: 4 x params x dtype_bytes."""
    return dtype_bytes * (total_params(shape, lora) + 3 * trainable_params(shape, lora))


def adapted_weight_params(shape: ModelShape, lora: Lora) -> int:
    """Parameters of the weights LoRA adapts (0 without LoRA)."""
    if lora.rank == 0:
        return 0
    return adapted_params(shape, lora.target_modules)


def synced_params(cfg: Any, shape: ModelShape) -> int:
    """What a weight sync carries: every weight, or the adapters (+ norms)."""
    return trainable_params(shape, Lora.of(cfg.train.engine.lora))


def training_state_bytes(cfg: Any, shape: ModelShape) -> float:
    """One training rank's share of the policy's (and a critic's) state: FSDP2 shards it
    over ``train.num_ranks``."""
    train_b = DTYPE_BYTES[cfg.train.engine.dtype]
    state = trainer_state_bytes(shape, Lora.of(cfg.train.engine.lora), train_b)
    if cfg.algorithm.needs_critic:
        state += trainer_state_bytes(shape, Lora.of(cfg.critic.engine.lora), train_b)
    return state / cfg.train.num_ranks


def training_step_bytes(cfg: Any, facts: MemoryFacts) -> float:
    """One training rank's runtime and its share of one micro-batch's activations (per
    token and layer, 6 x hidden + 4 x intermediate values saved for the backward pass:
    norms, q/k/v, attention output, residuals, the MLP's gate, up, product and input of
    down) and kept logits (``engines/torch_train.logits_start``: the response positions)."""
    shape, prompt_tokens = facts.shape, facts.prompt_tokens or 0.0
    micro = min(cfg.train.engine.micro_batch_size, cfg.samples_per_step)
    new = cfg.rollout.sampling.max_new_tokens
    tokens = micro * (prompt_tokens + new)
    per_token_layer = 6 * shape.hidden_size + 4 * shape.active_intermediate_size  # a mixture: its tokens' experts
    activations = tokens * shape.num_layers * per_token_layer * DTYPE_BYTES[cfg.train.engine.dtype]
    logits = micro * (new + 1) * shape.vocab_size * 4 * LOGIT_COPIES
    return PROCESS_BYTES + (activations + logits) / cfg.train.num_ranks
