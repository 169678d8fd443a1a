"""Engine configuration: msgspec Structs, every field with a default and a comment.

Invariants:
- Structs are ``kw_only`` and ``forbid_unknown_fields``: a misspelt key in a TOML file
  is an error at load time, never a silently ignored setting.
- ``type`` picks the implementation in ``asyncflow.engines.factory``; nothing else in
  the code base names a concrete engine class.
- Units are in field names (``_bytes``, ``_fraction``).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

Device = Literal["cpu", "cuda", "npu"]
DType = Literal["float32", "bfloat16", "float16"]

# Ranges of numeric keys, checked by msgspec when a config is loaded (the error names
# the key and the range: core/config.py):
Count = Annotated[int, Meta(ge=1)]
"""1 or more."""
NonNegInt = Annotated[int, Meta(ge=0)]
"""0 or more (0 usually: off, or automatic)."""
Seconds = Annotated[float, Meta(gt=0)]
"""A positive duration."""
PosFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]
"""0 to 1."""


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How a rollout engine samples. Log-probs returned by every engine are those of
    the sampled token under ``softmax(logits / temperature)`` (before top-k/top-p
    truncation), so a trainer recomputes them with the same temperature."""

    temperature: NonNegFloat = 1.0
    """Softmax temperature; 0 means greedy (log-probs are then those at temperature 1)."""
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    top_k: NonNegInt = 0
    """Keep only the k most likely tokens; 0 disables it."""
    max_new_tokens: Count = 64
    """Upper bound on response tokens per sample (the stop token counts)."""
    stop_token_ids: tuple[NonNegInt, ...] = ()
    """A response ends after emitting any of these (the stop token is kept in the
    response and has a log-prob). Empty: the tokenizer's eos is used by the caller."""
    n: Count = 1
    """Samples per prompt (the GRPO group size)."""
    seed: NonNegInt | None = None
    """Seed of the engine's sampling generator for this call; None keeps its stream."""


class RolloutEngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rollout (generation) engine."""

    type: Literal["native", "vllm", "vllm_ascend"] = "native"
    """native: PyTorch, KV cache + continuous batching, cpu/cuda/npu.
    vllm: vLLM on CUDA. vllm_ascend: vLLM with the vllm-ascend plugin on NPU."""
    device: Device = "cpu"
    """Where the model runs."""
    device_index: NonNegInt = 0
    """Which accelerator on the host (ignored on cpu)."""
    dtype: DType = "float32"
    """Weights and KV-cache dtype. Log-prob consistency with training needs float32."""
    kv_cache_bytes: Count | None = None
    """KV-cache budget in bytes. Exactly one of this and ``kv_cache_fraction`` may be
    set; neither: 64 MiB."""
    kv_cache_fraction: Annotated[float, Meta(gt=0, le=1)] | None = None
    """KV-cache budget as a fraction of the device's free memory (cuda/npu only for
    native; vLLM's gpu_memory_utilization)."""
    kv_block_tokens: Count = 16
    """Tokens per KV-cache block (native engine's allocation unit)."""
    max_batch_size: Count = 64
    """Most sequences decoded together in one step."""
    seed: NonNegInt = 0
    """Seed of the sampling generator."""
    num_threads: Count | None = None
    """torch intra-op threads on cpu; None leaves torch's setting alone."""
    tensor_parallel_size: Count = 1
    """vLLM only: tensor-parallel degree."""
    enforce_eager: bool = False
    """vLLM only: disable CUDA/NPU graphs (faster start, slower decode)."""


class TrainEngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A training engine."""

    type: Literal["torch"] = "torch"
    """torch: PyTorch, one process or FSDP2 over torch.distributed."""
    device: Device = "cpu"
    """Where the model trains."""
    dtype: DType = "float32"
    """Parameter dtype (optimizer states follow it)."""
    lr: PosFloat = 1e-5
    """AdamW learning rate (the peak, with a schedule)."""
    lr_warmup_steps: NonNegInt = 0
    """Optimizer steps of linear warmup: step k (0-based) of the first this many uses
    ``lr * (k + 1) / lr_warmup_steps``. 0: no warmup. In a run the policy takes one
    optimizer step per trainer step and epoch (``algorithm.epochs``), the PPO critic one
    per trainer step."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warmup: constant keeps ``lr``; cosine decays it along half a cosine to
    ``lr * lr_min_ratio`` at the run's last optimizer step. The lr is a function of the
    optimizer step count alone, so a resumed run continues the schedule where it was."""
    lr_min_ratio: Fraction = 0.0
    """Cosine only: the final lr as a fraction of ``lr`` (0 to 1)."""
    betas: tuple[Annotated[float, Meta(ge=0, lt=1)], Annotated[float, Meta(ge=0, lt=1)]] = (0.9, 0.999)
    """AdamW betas."""
    weight_decay: NonNegFloat = 0.0
    """AdamW decoupled weight decay."""
    grad_clip: NonNegFloat = 1.0
    """Max global grad norm; 0 disables clipping."""
    micro_batch_size: Count = 8
    """Sequences per forward/backward; gradients accumulate over a step's micro-batches."""
    fsdp: bool = False
    """Shard parameters, grads and optimizer state with FSDP2 (``fully_shard``) over
    the initialised default process group."""
    critic: bool = False
    """Add a scalar value head (PPO critic); ``forward`` then returns values."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""
    seed: NonNegInt = 0
    """Seed for the value head's initialisation."""
    num_threads: Count | None = None
    """torch intra-op threads on cpu; None leaves torch's setting alone."""
