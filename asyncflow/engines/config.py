"""Engine configuration: msgspec Structs, every field with a default and a description.

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

from asyncflow.core.protocol import MAX_WAIT_S
from asyncflow.core.schema import Refused

Device = Literal["cpu", "cuda", "npu"]
DType = Literal["float32", "bfloat16", "float16"]

# Ranges of numeric keys, checked by msgspec when a config is loaded (the error names
# the key and the range: config/load.py). A field adds its description with a second
# Meta: ``Annotated[Count, Meta(description=...)]``; a rule between fields is the
# Struct's ``check`` method (core/schema.py).
Count = Annotated[int, Meta(ge=1)]
"""1 or more."""
NonNegInt = Annotated[int, Meta(ge=0)]
"""0 or more (0 usually: off, or automatic)."""
Seconds = Annotated[float, Meta(gt=0, le=MAX_WAIT_S)]
"""A positive duration that sets a timer: at most ``MAX_WAIT_S`` (core/protocol.py: a longer
one would stop the process's timers)."""
Delay = Annotated[float, Meta(ge=0, le=MAX_WAIT_S)]
"""A duration that sets a timer, 0 allowed (usually: off)."""
PosFloat = Annotated[float, Meta(gt=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]
"""0 to 1."""


VLLM_TYPES = ("vllm", "vllm_ascend")
"""The rollout engine types that run vLLM (the keys marked "vLLM only" apply to them)."""

LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a decoder block that LoRA may adapt (``LoraConfig.target_modules``)."""


class SamplingParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How a rollout engine samples. Log-probs returned by every engine are those of
    the sampled token under the distribution it was drawn from: ``softmax(logits /
    temperature)`` over the tokens top-k/top-p keep (engines/sampling.py; vLLM's
    processed log-probs), so a trainer recomputes them with the same temperature and
    truncation and an on-policy ratio is 1."""

    temperature: Annotated[
        NonNegFloat, Meta(description="Softmax temperature; 0 means greedy (log-probs are then those at temperature 1).")
    ] = 1.0
    top_p: Annotated[float, Meta(gt=0, le=1, description="Nucleus sampling mass in (0, 1]; 1 disables it.")] = 1.0
    top_k: Annotated[NonNegInt, Meta(description="Keep only the k most likely tokens; 0 disables it.")] = 0
    max_new_tokens: Annotated[Count, Meta(description="Upper bound on response tokens per sample (the stop token counts).")] = 64
    stop_token_ids: Annotated[
        tuple[NonNegInt, ...],
        Meta(
            description="A response ends after emitting any of these (the stop token is kept in the response and has a log-prob). "
            "Empty: the tokenizer's eos is used by the caller."
        ),
    ] = ()
    n: Annotated[Count, Meta(description="Samples per prompt (the GRPO group size).")] = 1
    seed: Annotated[
        NonNegInt | None, Meta(description="Seed of the engine's sampling generator for this call; None keeps its stream.")
    ] = None


class EmulatedConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What the emulated engines (``type = "emulated"``) stand for: a named model on named
    hardware, whose device time the planner's cost model gives (docs/scale.md, "The
    emulated engines"). Both engines of a run emulate one model: the rollout's and the
    train engine's ``model``, ``hardware`` and ``time_scale`` must agree."""

    model: Annotated[
        Literal["7b", "32b"], Meta(description="The planner's preset the engines time and count bytes for (Qwen2.5-7B, -32B).")
    ] = "7b"
    hardware: Annotated[
        Literal["910b", "h100", "a100", "h200"], Meta(description="The planner's hardware profile a device of it is.")
    ] = "910b"
    time_scale: Annotated[
        PosFloat,
        Meta(
            description="Emulated seconds per modelled second: 1e-3 makes a 30 s generate call sleep 30 ms. The sleep "
            "waits on an event, using no core."
        ),
    ] = 1e-3
    rollout_tp: Annotated[Count, Meta(description="Devices (tensor parallel) of one rollout replica.")] = 1
    train_devices: Annotated[
        Count, Meta(description="Devices the emulated trainer trains on: train_tp x train_pp x the data-parallel degree.")
    ] = 8
    train_tp: Annotated[
        Count, Meta(description="Tensor-parallel degree of the emulated trainer (a model too big for one device).")
    ] = 1
    train_pp: Annotated[Count, Meta(description="Pipeline-parallel degree of the emulated trainer.")] = 1
    token_scale: Annotated[
        PosFloat,
        Meta(
            description="Modelled tokens per emulated token: the lengths the cost model is given are the real ones times this "
            "(64 stands a 32-token response for 2,048), while the queue carries only the emulated tokens."
        ),
    ] = 1.0
    response_median_fraction: Annotated[
        Annotated[float, Meta(gt=0, le=1)],
        Meta(
            description="Median response length as a fraction of ``rollout.sampling.max_new_tokens``; lengths are "
            "log-normal around it (a long right tail) and capped at max_new_tokens."
        ),
    ] = 0.25
    response_sigma: Annotated[
        NonNegFloat, Meta(description="The log-normal's sigma: 0 gives every response the median; 1 a tail past 4x it.")
    ] = 1.0
    seed: Annotated[NonNegInt, Meta(description="Seed of the emulated responses' lengths and tokens.")] = 0


class RolloutEngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A rollout (generation) engine."""

    type: Annotated[
        Literal["auto", "native", "hf", "vllm", "vllm_ascend", "emulated"],
        Meta(
            description="auto: native where it implements the model's family (``engines/families``, read from config.json), "
            "else hf; the run's first lines say which and why. native: PyTorch, "
            "paged KV cache + continuous batching, cpu/cuda/npu. hf: the model's own Hugging Face forward and KV cache, any "
            "causal LM transformers builds; the slower fallback (no paged cache, no prefix cache). vllm: vLLM on "
            "CUDA. vllm_ascend: vLLM with the vllm-ascend plugin on NPU. emulated: no model; the device time of "
            "``emulated.model`` on ``emulated.hardware`` from the planner's cost model, hashed log-probs (docs/scale.md); "
            'needs train.engine.type = "emulated".'
        ),
    ] = "auto"
    device: Annotated[Device, Meta(description="Where the model runs.")] = "cpu"
    device_index: Annotated[NonNegInt, Meta(description="Which accelerator on the host (ignored on cpu).")] = 0
    dtype: Annotated[
        DType,
        Meta(
            description="Weights and KV-cache dtype. Log-prob consistency with training needs float32. bfloat16 is faster on a "
            "CPU with bfloat16 instructions (docs/real-model.md, 'In bfloat16' for generation and 'With the rollout in "
            "bfloat16' for learning, one seed); the trainer's float32 log-probs then differ more from the rollout's."
        ),
    ] = "float32"
    kv_cache_bytes: Annotated[
        Count | None,
        Meta(description="KV-cache budget in bytes. Exactly one of this and ``kv_cache_fraction`` may be set; neither: 64 MiB."),
    ] = None
    kv_cache_fraction: Annotated[
        Annotated[float, Meta(gt=0, le=1)] | None,
        Meta(
            description="KV-cache budget as a fraction of the device's free memory (cuda/npu only for native and hf; vLLM's "
            "gpu_memory_utilization)."
        ),
    ] = None
    kv_block_tokens: Annotated[Count, Meta(description="Tokens per KV-cache block (native engine's allocation unit).")] = 16
    prefix_cache: Annotated[
        bool,
        Meta(
            description="Native engine: keep the full KV blocks of finished sequences for later prompts that start with "
            "the same tokens under the same weights (the next turn of an environment or a gateway session, the later "
            "samples of a group), so their prefill runs only the rest; new weights empty it, and its blocks give way "
            "to any admission. false: every prompt runs from its first token (engines/prefix_cache.py)."
        ),
    ] = True
    max_batch_size: Annotated[Count, Meta(description="Most sequences decoded together in one step.")] = 64
    max_prefill_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Native engine: most prompt tokens one step's prefill forward computes, counted as that forward "
            "pads them: its distinct prompts (a group's samples share one) times the longest. Admission stops at the "
            "prompt that would pass it, which waits for the next step, while the running sequences decode every step; "
            "so a long prompt arriving among many short ones does not pad them all to its length. A prompt longer than "
            "the budget runs alone in its step. 0: no limit (every prompt that fits the batch and the KV cache joins "
            "the one forward)."
        ),
    ] = 0
    compile: Annotated[
        Literal["auto", "on", "off"],
        Meta(
            description="Native engine: compile the decode step with torch.compile (on cuda with mode reduce-overhead, "
            "which captures CUDA graphs). Its rows are padded to powers of two from 8 up to max_batch_size and its key "
            "positions to powers of two from 64, one graph per pair, each compiled on first use (SmolLM2-135M on the "
            "2-core CPU: about 1 to 2 minutes a graph); weight syncs copy into the same parameters, so graphs are kept. "
            "The eager step attends over the same keys buckets, and the graph calls eager's RMSNorm kernel, so compiling "
            "changes no number (SmolLM2-135M, 30 layers: log-probs equal to the bit). Prefill and sampling stay eager. "
            "auto: on only on a device where it measured faster by enough to repay its "
            "compiles, which is none yet: off on cpu (SmolLM2-135M, 1.06x to 1.10x eager per step at 8 to 256 rows: "
            "docs/performance.md), and on cuda and npu until measured there (scripts/cuda_check.sh unit measures cuda; "
            "set on to use it now). Mixture-of-experts models cannot be one graph (on: an error). "
            "engines/compiled_decode.py."
        ),
    ] = "auto"
    seed: Annotated[NonNegInt, Meta(description="Seed of the sampling generator.")] = 0
    num_threads: Annotated[
        Count | None, Meta(description="torch intra-op threads on cpu; None leaves torch's setting alone.")
    ] = None
    tensor_parallel_size: Annotated[Count, Meta(description="vLLM only: tensor-parallel degree.")] = 1
    enforce_eager: Annotated[bool, Meta(description="vLLM only: disable CUDA/NPU graphs (faster start, slower decode).")] = False
    weight_transfer: Annotated[
        Literal["auto", "ipc", "rpc"],
        Meta(
            description="vLLM only: how the weights a replica received reach vLLM's workers. ipc: vLLM's weight-transfer "
            "API with its CUDA IPC engine (the worker reads this process's GPU buffers, no copy through the host; "
            "tensor_parallel_size 1). rpc: collective_rpc into the model's load_weights (tensors pickled to every worker; "
            "any tensor_parallel_size, and the Ascend path). auto: ipc for vllm with one GPU, else rpc. docs/vllm.md."
        ),
    ] = "auto"
    partial_kv: Annotated[
        Literal["keep", "recompute"],
        Meta(
            description="vLLM only: when weights change in the middle of a generation (partial rollout), keep the KV "
            "cache the old weights computed for the tokens so far (no recomputation; the context's keys and values are "
            "one version stale), or drop it so vLLM recomputes the prefix under the new weights when it resumes."
        ),
    ] = "keep"
    max_lora_rank: Annotated[
        NonNegInt,
        Meta(
            description="vLLM only: start vLLM with LoRA support for adapters up to this rank (``train.engine.lora``; it "
            "must be at least ``train.engine.lora.rank``). 0: no LoRA. The native and hf engines need nothing: they merge adapters."
        ),
    ] = 0
    emulated: Annotated[
        EmulatedConfig, Meta(description='type = "emulated" only: the model, hardware and time scale it emulates.')
    ] = msgspec.field(default_factory=EmulatedConfig)

    def check(self, run: object) -> None:
        """Cross-field rules (core/schema.py); ``run``: the whole config (its train engine's LoRA rank)."""
        train = getattr(run, "train", None)
        if train is not None and (self.type == "emulated") != (train.engine.type == "emulated"):
            raise Refused(
                "type",
                f"rollout.engine.type = {self.type!r} with train.engine.type = {train.engine.type!r}: the emulated engines "
                'hash the log-probs and weights a real engine computes, so set both to "emulated" or neither',
            )
        if self.type == "emulated":
            return
        if self.kv_cache_bytes is not None and self.kv_cache_fraction is not None:
            raise Refused("kv_cache_fraction", "set kv_cache_bytes or kv_cache_fraction, not both")
        train = getattr(run, "train", None)
        rank = train.engine.lora.rank if train is not None else 0
        if self.type in VLLM_TYPES and rank > self.max_lora_rank:
            raise Refused(
                "max_lora_rank",
                f"train.engine.lora.rank = {rank} needs vLLM started with LoRA: set rollout.engine.max_lora_rank >= {rank}",
            )

        if self.type not in VLLM_TYPES:  # native, hf, or auto (one of the two)
            if self.weight_transfer != "auto":
                raise Refused("weight_transfer", 'only the vLLM engines take it: remove it, or set type = "vllm"')
            if self.partial_kv != "keep":
                raise Refused("partial_kv", 'only the vLLM engines take it: remove it, or set type = "vllm"')
            if self.type == "hf" and self.compile == "on":
                raise Refused("compile", 'only the native engine compiles its decode step: remove it, or set type = "native"')
            if self.type == "hf" and self.max_prefill_tokens:
                raise Refused(
                    "max_prefill_tokens", 'only the native engine budgets its prefills: remove it, or set type = "native"'
                )
            return
        if self.max_prefill_tokens:
            raise Refused("max_prefill_tokens", "vLLM budgets its own prefills (max_num_batched_tokens): remove it")
        if self.compile == "on":
            raise Refused("compile", "vLLM compiles its own graphs (enforce_eager = false): remove compile")
        if self.type == "vllm_ascend" and self.weight_transfer == "ipc":
            raise Refused("weight_transfer", "CUDA IPC needs CUDA: use 'rpc' (or 'auto') with vllm_ascend")
        if self.weight_transfer == "ipc" and self.tensor_parallel_size > 1:
            raise Refused(
                "weight_transfer",
                "ipc hands vLLM buffers on this process's one GPU; with tensor_parallel_size > 1 use 'rpc' (or 'auto')",
            )


class LoraConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """LoRA adapters on the policy (``[train.engine.lora]``); ``rank = 0``: off."""

    rank: Annotated[
        NonNegInt,
        Meta(
            description="Adapter rank r. 0: off, every weight trains. Above 0: the base weights are frozen, adapters (peft's "
            "LoRA layers) train on ``target_modules``, and only the adapters travel to the rollout replicas at each sync."
        ),
    ] = 0
    alpha: Annotated[PosFloat, Meta(description="LoRA alpha: the adapter's update is scaled by ``alpha / rank``.")] = 16.0
    dropout: Annotated[
        Annotated[float, Meta(ge=0, lt=1)],
        Meta(description="Dropout on the adapter's input in training (0 to <1; training forwards only, like peft)."),
    ] = 0.0
    target_modules: Annotated[
        tuple[str, ...],
        Meta(
            description="Linear layers of each decoder block that get adapters, by name: any of q_proj, k_proj, v_proj, o_proj, "
            "gate_proj, up_proj, down_proj."
        ),
    ] = ("q_proj", "k_proj", "v_proj", "o_proj")
    train_norms: Annotated[
        bool,
        Meta(
            description="Also train the RMSNorm weights in full (hidden_size floats each) and sync them beside the adapters. "
            "They let the policy rescale its logits (sharpen), which adapters on linear layers do slowly."
        ),
    ] = False
    save_merged: Annotated[
        bool,
        Meta(
            description="Checkpoints also write the merged model (base + adapter) to ``step_N/model/merged``, a Hugging Face "
            "directory loadable as is. The adapter (``step_N/model/adapter``, peft's layout) is always written."
        ),
    ] = False

    def check(self, run: object) -> None:
        """Cross-field rules (core/schema.py)."""
        unknown = [m for m in self.target_modules if m not in LINEAR_MODULES]
        if unknown:
            raise Refused("target_modules", f"{unknown} are not adaptable layers: use a subset of {list(LINEAR_MODULES)}")
        if self.rank and not self.target_modules:
            raise Refused("target_modules", "name at least one layer to adapt, or set rank = 0")


class TrainEngineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A training engine."""

    type: Annotated[
        Literal["torch", "emulated"],
        Meta(
            description="torch: PyTorch, one process or FSDP2 over torch.distributed. emulated: no model; the step time of "
            "``emulated.model`` on ``emulated.train_devices`` from the planner's cost model (docs/scale.md); needs "
            'rollout.engine.type = "emulated".'
        ),
    ] = "torch"
    device: Annotated[Device, Meta(description="Where the model trains.")] = "cpu"
    dtype: Annotated[DType, Meta(description="Parameter dtype (optimizer states follow it).")] = "float32"
    autocast: Annotated[
        Literal["off", "bfloat16", "auto"],
        Meta(
            description="Mixed precision: the forward and backward run their matmuls in this dtype (``torch.autocast``) "
            "while parameters, gradients and optimizer states stay in ``dtype`` (float32); log-probs, entropy and the loss "
            "are still computed in float32 from the logits. On a CPU with avx512_bf16 or AMX it trains faster "
            "(SmolLM2-135M, one core: the measured ratio is in docs/real-model.md, 'Training at real size'); on one "
            "without bf16 instructions torch emulates it, several times slower than float32 (the preflight warns). "
            "auto: bfloat16 where the trainer's host runs it natively (a CPU with avx512_bf16 or amx_bf16, a GPU "
            "with bf16 support, an NPU), off elsewhere; the preflight's lines say which (engines/precision.py). "
            "The trainer's log-probs then differ from a float32 rollout's by bfloat16 rounding, which the importance "
            "ratio sees. float16 is not offered: it needs loss scaling."
        ),
    ] = "off"
    lr: Annotated[PosFloat, Meta(description="AdamW learning rate (the peak, with a schedule).")] = 1e-5
    lr_warmup_steps: Annotated[
        NonNegInt,
        Meta(
            description="Optimizer steps of linear warmup: step k (0-based) of the first this many uses ``lr * (k + 1) / "
            "lr_warmup_steps``. 0: no warmup. In a run the policy takes one optimizer step per trainer step and epoch "
            "(``algorithm.epochs``), the PPO critic one per trainer step."
        ),
    ] = 0
    lr_schedule: Annotated[
        Literal["constant", "cosine"],
        Meta(
            description="After warmup: constant keeps ``lr``; cosine decays it along half a cosine to ``lr * lr_min_ratio`` at the "
            "run's last optimizer step. The lr is a function of the optimizer step count alone, so a resumed run continues "
            "the schedule where it was."
        ),
    ] = "constant"
    lr_min_ratio: Annotated[Fraction, Meta(description="Cosine only: the final lr as a fraction of ``lr`` (0 to 1).")] = 0.0
    lr_schedule_convention: Annotated[
        Literal["asyncflow", "huggingface"],
        Meta(
            description="How warmup and cosine count steps. asyncflow: warmup step k uses ``lr * (k + 1) / "
            "lr_warmup_steps`` (the first step moves the weights) and the cosine reaches ``lr * lr_min_ratio`` at the "
            "last step. huggingface: the lr of transformers' schedulers (constant_with_warmup, cosine_with_min_lr), "
            "which TRL and the HF Trainer use: warmup step k uses ``lr * k / lr_warmup_steps`` (step 0 at 0, its "
            "gradient only fills AdamW's moments) and the cosine reaches its minimum one step after the last. For a "
            "run that must match one of theirs step for step (afctl bench peer gives TRL the config's)."
        ),
    ] = "asyncflow"
    betas: Annotated[
        tuple[Annotated[float, Meta(ge=0, lt=1)], Annotated[float, Meta(ge=0, lt=1)]], Meta(description="AdamW betas.")
    ] = (0.9, 0.999)
    weight_decay: Annotated[NonNegFloat, Meta(description="AdamW decoupled weight decay.")] = 0.0
    grad_clip: Annotated[NonNegFloat, Meta(description="Max global grad norm; 0 disables clipping.")] = 1.0
    micro_batch_size: Annotated[
        Count, Meta(description="Sequences per forward/backward; gradients accumulate over a step's micro-batches.")
    ] = 8
    micro_batch_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Micro-batches sized by tokens instead of rows: a step's rows sorted by length (a group's rows kept "
            "together with share_prompts) and cut into micro-batches of at most this many tokens (rows x the longest row "
            "of the micro-batch), each trimmed to its longest row, so the model computes on little padding and few, large "
            "micro-batches (each one casts the weights under autocast and adds to the gradients). micro_batch_size is then "
            "not used; a row longer than the budget gets a micro-batch of its own. The same loss and gradients up to float "
            "rounding. 0: micro_batch_size rows per micro-batch. Not with packing (pack_tokens sizes packed rows) or fsdp."
        ),
    ] = 0
    logit_chunk: Annotated[
        NonNegInt,
        Meta(
            description="Token positions whose logits are formed at once when the log-probs and entropies are computed: "
            "the LM head and the float32 log-softmax over the vocabulary run chunk by chunk, forward and again in backward "
            "(engines/chunked_logp.py), so no float32 [tokens, vocabulary] tensor is kept for the backward. The same "
            "log-probs and gradients up to float rounding. 0: the whole micro-batch at once. The plain path is taken "
            "anyway for a critic, FSDP, sampling truncation (top_k/top_p) and a head that is not a plain linear layer "
            "(soft-capped or scaled logits, LoRA on the head)."
        ),
    ] = 1024
    attention: Annotated[
        Literal["auto", "eager", "sdpa"],
        Meta(
            description="The attention kernel of the trainer's model (transformers' attn_implementation). eager: the "
            "scores as matmuls and a float32 softmax, holding [rows, heads, tokens, tokens] a layer for the backward; sdpa: "
            "torch's scaled_dot_product_attention, whose CPU kernel's bfloat16 backward is slow on short rows. auto: eager "
            "on the CPU for a micro-batch whose rows are at most 256 tokens (SmolLM2-135M, 64 rows of 62 tokens under "
            "bfloat16 autocast: the SDPA kernel's backward was the largest single operator of the step; "
            "docs/performance.md), else the model's own (sdpa, or what the model's config names). The same loss up to "
            "float rounding."
        ),
    ] = "auto"
    packing: Annotated[
        bool,
        Meta(
            description="Sequence packing: lay a step's sequences (prompt + response) end to end in rows of ``pack_tokens`` "
            "tokens, position ids restarting with each sequence and attention kept within it, instead of right-padding every "
            "row to the longest of its micro-batch. A micro-batch is then at most ``micro_batch_size`` packed rows. Losses, "
            "their normalisation and log-probs are those of the padded path (up to float rounding); only the padding the "
            "model computes on shrinks. With FSDP each rank packs its own part (docs/algorithms.md)."
        ),
    ] = False
    pack_tokens: Annotated[
        NonNegInt,
        Meta(
            description="Packing: the token budget of a packed row. 0: the longest sequence of the batch being packed, so "
            "a packed micro-batch is never larger than the padded path's largest. A sequence longer than the budget gets a "
            "row of its own."
        ),
    ] = 0
    pack_attention: Annotated[
        Literal["auto", "position_ids", "mask"],
        Meta(
            description="Packing: how attention stays within a sequence. position_ids: only position ids are passed and "
            "transformers builds the block-diagonal causal mask from them (``masking_utils.find_packed_sequence_indices``); "
            "mask: an explicit 4-D block-diagonal additive mask. auto: position_ids if a probe at start shows the model "
            "keeps packed sequences apart that way, else mask."
        ),
    ] = "auto"
    fsdp: Annotated[
        bool,
        Meta(
            description="Shard parameters, grads and optimizer state with FSDP2 (``fully_shard``) over the initialised default process "
            "group."
        ),
    ] = False
    critic: Annotated[bool, Meta(description="Add a scalar value head (PPO critic); ``forward`` then returns values.")] = False
    gradient_checkpointing: Annotated[bool, Meta(description="Recompute activations in backward to save memory.")] = False
    share_prompts: Annotated[
        bool,
        Meta(
            description="Run each distinct prompt of a micro-batch once and every sample's response on its keys and values, "
            "instead of every row whole (engines/shared_prompts.py): a group's samples share one prompt, so with 50-token "
            "prompts, 16-token responses and 8 samples a prompt the decoder sees a third of the tokens. The same log-probs "
            "and gradients up to float rounding. For a policy trainer of one rank without packing or gradient "
            "checkpointing (a critic keeps the padded path); micro_batch_size a multiple of algorithm.group_size keeps "
            "groups whole (docs/performance.md)."
        ),
    ] = False
    seed: Annotated[NonNegInt, Meta(description="Seed for the value head's initialisation.")] = 0
    num_threads: Annotated[
        Count | None, Meta(description="torch intra-op threads on cpu; None leaves torch's setting alone.")
    ] = None
    lora: Annotated[
        LoraConfig, Meta(description="LoRA adapters with adapter-only weight sync (docs/algorithms.md); off by default.")
    ] = msgspec.field(default_factory=LoraConfig)
    emulated: Annotated[
        EmulatedConfig,
        Meta(description='type = "emulated" only: the model, hardware and time scale, as the rollout\'s ``emulated``.'),
    ] = msgspec.field(default_factory=EmulatedConfig)

    def check(self, run: object) -> None:
        """Cross-field rules (core/schema.py); ``run``: the whole config (its rollout engine's emulated model)."""
        if self.type == "emulated":
            self._check_emulated(run)
        if self.autocast != "off" and self.dtype != "float32":
            raise Refused(
                "autocast",
                f"the parameters are already {self.dtype}: autocast computes in {self.autocast} from float32 master "
                f"weights; set dtype = 'float32' or autocast = 'off'",
            )
        for key, on in (("fsdp", self.fsdp), ("packing", self.packing), ("gradient_checkpointing", self.gradient_checkpointing)):
            if self.share_prompts and on:
                raise Refused(
                    "share_prompts", f"it runs a prompt once for one rank's unpacked rows, not with {key} = true: leave one out"
                )
        if self.packing and self.micro_batch_tokens:
            raise Refused(
                "micro_batch_tokens",
                "packing sizes its rows by pack_tokens and micro_batch_size: set micro_batch_tokens = 0, or packing = false",
            )
        if self.fsdp and self.micro_batch_tokens:
            raise Refused(
                "micro_batch_tokens",
                "with fsdp every rank must run as many micro-batches as the others, which a token budget does not keep: "
                "set micro_batch_tokens = 0 (micro_batch_size rows), or fsdp = false",
            )
        if not self.packing and self.pack_tokens != 0:
            raise Refused("pack_tokens", "it applies only with packing = true: set packing = true, or leave pack_tokens out")
        if not self.packing and self.pack_attention != "auto":
            raise Refused(
                "pack_attention", "it applies only with packing = true: set packing = true, or leave pack_attention out"
            )

    def _check_emulated(self, run: object) -> None:
        """The emulated trainer: one model with the rollout's, and none of what it does not emulate."""
        rollout = getattr(run, "rollout", None)
        if rollout is not None:
            mine, theirs = self.emulated, rollout.engine.emulated
            for key in ("model", "hardware", "time_scale"):
                if getattr(mine, key) != getattr(theirs, key):
                    raise Refused(
                        f"emulated.{key}",
                        f"{getattr(mine, key)!r} but rollout.engine.emulated.{key} = {getattr(theirs, key)!r}: both engines "
                        "emulate one model on one kind of device; set them equal",
                    )
        if self.emulated.train_devices % (self.emulated.train_tp * self.emulated.train_pp):
            raise Refused(
                "emulated.train_devices",
                f"{self.emulated.train_devices} devices do not split into train_tp x train_pp = "
                f"{self.emulated.train_tp} x {self.emulated.train_pp} groups: make it a multiple of their product",
            )
        train = getattr(run, "train", None)
        if train is not None and train.num_ranks > 1:
            raise Refused(
                "type",
                f"the emulated trainer is one rank (its devices: emulated.train_devices), not train.num_ranks = "
                f"{train.num_ranks}: set train.num_ranks = 1 and fsdp = false",
            )
        workflow = getattr(run, "workflow", None)
        if workflow is not None and workflow.stream_step:
            raise Refused("type", "the emulated train engine takes whole steps: set workflow.stream_step = false")
        for key, on in (("fsdp", self.fsdp), ("critic", self.critic), ("packing", self.packing), ("lora.rank", self.lora.rank)):
            if on:
                raise Refused(key, "the emulated train engine has no model to shard, pack or adapt: leave it out")
