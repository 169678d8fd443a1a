"""The PyTorch training engine: one process, or FSDP2 (``fully_shard``) over the
default process group (gloo on cpu, nccl on cuda, hccl on npu).

Shape legend: B sequences, T tokens, V vocabulary, E hidden.

Invariants:
- ``logp_BT[b, t] = log softmax(logits[b, t-1] / temperature)[ids[b, t]]``, over the
  tokens the sampling's top-k/top-p keep when it has them (``shift_logp``), at every
  position from the batch's first response token on (the padded path computes the
  logits of those positions only: over a real vocabulary the LM head and its softmax
  cost as much as a few decoder layers per position; ``logits_start``), 0 before it
  and in column 0; ``values_BT[b, t]`` is the critic's value of the state in which token t is
  chosen (from the hidden state at t-1), column 0 is 0. Same alignment as the
  rollout engine's log-probs, so the two compare position by position.
- One ``train_step`` is one optimizer step: gradients of all micro-batches
  accumulate, are clipped to ``grad_clip`` (global norm, across ranks), then AdamW
  with the lr of ``lr_schedule.lr_at`` at this step count (reported as ``lr``).
- With FSDP every rank must call ``train_step``/``forward``/``export_weights``/
  ``save_checkpoint`` together with the same number of micro-batches (collectives);
  a mismatch is detected and raised before any forward, not left to hang.
- Packing (``packing = true``): a micro-batch is a set of whole sequences packed into
  at most ``micro_batch_size`` rows of ``pack_tokens`` (``batching.plan_packing``);
  the model sees them with position ids restarting per sequence and attention kept
  within each (``pack_attention``: transformers' detection from position ids, or an
  explicit 4-D mask), and its per-token outputs are put back at ``[b, t]`` before the
  loss, which gets the micro-batch's rows as a padded ``TokenBatch``: the loss, its
  step totals and the log-probs are those of the padded path. With FSDP a rank with
  fewer packed micro-batches than another splits rows until the counts agree.
- Token-sized micro-batches (``micro_batch_tokens``): the step's rows sorted by length (in
  their order with ``share_prompts``) and cut at the token budget (rows x longest); the loss
  sees each micro-batch's rows as a padded ``TokenBatch`` and ``forward`` puts outputs back
  at their rows, so only the grouping changes.
- The chunked head (``logit_chunk``, ``engines/chunked_logp.py``): where the head is a plain
  linear layer, ``_Net`` returns the decoder's hidden states (``hidden_only``) and the log-probs
  and entropies are taken from them and the head's weight chunk by chunk, in the weight's dtype
  (float32 under autocast, as ``_head``); the same values as ``token_logp``/``token_entropy``
  of the whole logits up to float rounding.
- Attention (``attention``): set per micro-batch from its row length (``_set_attention``):
  "auto" is eager on the CPU up to ``EAGER_MAX_TOKENS``, else the model's own.
- Mixed precision (``autocast = "bfloat16"``): the decoder runs under ``torch.autocast``
  in ``forward`` and ``train_step`` alike, the LM head in float32 (bfloat16 logits
  would be off by ~0.1); parameters, gradients, AdamW states and checkpoints stay in
  ``dtype`` (float32).
- Any causal LM of transformers trains (``engines/hf.py``): the decoder is the model's
  ``base_model``, the head its output embeddings, FSDP shards the family's decoder blocks
  (``_no_split_modules``), a tied head is saved once. Dropout is off (``no_dropout``): the
  log-probs and ratios are the policy's, as the rollout computes them. ``share_prompts``
  takes the padded path for a micro-batch as long as a sliding window (Gemma 3, Mistral):
  the shared prompt's cache would keep only the window.
- Checkpoints are Hugging Face directories: ``model.safetensors`` + config +
  tokenizer (loadable by transformers/vLLM as is), plus ``optimizer.pt``,
  ``value_head.safetensors`` (critic) and ``trainer_state.json``.
- LoRA (``lora.rank > 0``): peft's LoRA layers are injected into the Hugging Face
  model in place (``peft.inject_adapter_in_model``: the module tree keeps its names,
  so FSDP wraps the same decoder layers), seeded by ``seed`` so every FSDP rank
  starts from the same adapter; only they (and a critic's value head) train and are
  in the optimizer. ``export_weights`` yields only the adapters (``engines/lora.py``'s
  wire form, gathered whole under FSDP); ``published_digest`` is the digest of the
  merged weights a replica holds after loading them, from base samples cached at
  start. A checkpoint's ``model.safetensors`` holds the base weights, its ``adapter/``
  the adapter in peft's layout, ``merged/`` (``lora.save_merged``) the merged model.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import safetensors.torch
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from asyncflow.core.phases import phase
from asyncflow.engines.base import (
    Accumulated,
    ForwardOutput,
    LossContext,
    LossFn,
    TokenBatch,
    TrainEngine,
    TrainStepResult,
)
from asyncflow.engines.batching import PackedRows, block_causal_mask, pack_batch, plan_packing
from asyncflow.engines.chunked_logp import head_logp
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.device import set_cpu_threads, torch_device, torch_dtype
from asyncflow.engines.hf import TOKENIZER_FILES, load_model
from asyncflow.engines.lora import language_model, lora_targets, within
from asyncflow.engines.lr_schedule import lr_at
from asyncflow.engines.precision import resolve_autocast
from asyncflow.engines.sampling import truncated_logits, truncates
from asyncflow.engines.shared_prompts import SharedPlan, plan_shared, shared_hidden

if TYPE_CHECKING:
    from asyncflow.engines.lora import Adapter


class _Net(torch.nn.Module):
    """The HF causal LM, plus a scalar value head for a critic."""

    lm: Any  # a Hugging Face causal LM: torch types its submodules as Tensor | Module

    def __init__(self, lm: torch.nn.Module, critic: bool, seed: int):
        super().__init__()
        self.lm = lm
        self.value_head = None
        if critic:
            hidden = self.lm.config.get_text_config().hidden_size
            param = next(lm.parameters())
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.value_head = torch.nn.Linear(hidden, 1, dtype=param.dtype, device=param.device)
                torch.nn.init.normal_(self.value_head.weight, std=1.0 / hidden**0.5)
                torch.nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids_BT: torch.Tensor,
        attention_mask_BT: torch.Tensor | None,
        position_ids_BT: torch.Tensor | None = None,
        logits_from: int = 0,
        shared: SharedPlan | None = None,
        hidden_only: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Logits (of positions ``logits_from`` on only: the LM head and the softmax over a
        real vocabulary cost as much as a few decoder layers per position) or values.
        With ``shared`` (``train.engine.share_prompts``): the logits [B, R, V] that predict
        each row's response part, each distinct prompt run once (engines/shared_prompts.py).
        With ``hidden_only``: the decoder's last hidden states in the logits' place, for the head
        to take chunk by chunk (``train.engine.logit_chunk``)."""
        if hidden_only:
            return self.hidden(input_ids_BT, attention_mask_BT, position_ids_BT, logits_from, shared), None
        if shared is not None:
            return self._head(shared_hidden(self.lm.base_model, shared)), None
        kw: dict[str, Any] = {
            "input_ids": input_ids_BT,
            "attention_mask": attention_mask_BT,
            "position_ids": position_ids_BT,
            "use_cache": False,
        }
        if self.value_head is None:
            device = input_ids_BT.device.type
            if torch.is_autocast_enabled(device):
                return self._head(self.lm.base_model(**kw).last_hidden_state[:, logits_from:]), None
            if logits_from > 0:
                kw["logits_to_keep"] = input_ids_BT.shape[1] - logits_from
            return self.lm(**kw).logits, None
        hidden_BTE = self.lm.base_model(**kw).last_hidden_state
        return None, self.value_head(hidden_BTE).squeeze(-1)

    def hidden(
        self,
        input_ids_BT: torch.Tensor,
        attention_mask_BT: torch.Tensor | None,
        position_ids_BT: torch.Tensor | None = None,
        start: int = 0,
        shared: SharedPlan | None = None,
    ) -> torch.Tensor:
        """The decoder's last hidden states [B, T - start, E] (with ``shared``: those [B, R, E]
        that predict each row's response part), for the LM head to take chunk by chunk."""
        if shared is not None:
            return shared_hidden(self.lm.base_model, shared)
        kw = {"input_ids": input_ids_BT, "attention_mask": attention_mask_BT, "position_ids": position_ids_BT}
        return self.lm.base_model(**kw, use_cache=False).last_hidden_state[:, start:]

    def _head(self, hidden_BTE: torch.Tensor) -> torch.Tensor:
        """The LM head. Under mixed precision (the decoder in the autocast dtype) in float32:
        logits are tens, and bfloat16's 8-bit mantissa would put ~0.1 of error into every log-prob."""
        device = hidden_BTE.device.type
        head = self.lm.get_output_embeddings()
        if not torch.is_autocast_enabled(device):
            return head(hidden_BTE)
        with torch.autocast(device, enabled=False):
            return head(hidden_BTE.float())


log = logging.getLogger(__name__)

PackAttention = Literal["position_ids", "mask"]


@dataclass
class _MicroBatch:
    """One forward's worth: the rows of the step's batch it holds (indices), those
    rows as a padded batch (what the loss sees) and, with packing, their packing."""

    rows: slice | list[int]
    batch: TokenBatch
    packed: PackedRows | None = None


@torch.no_grad()
def probe_pack_attention(net: _Net, vocab_size: int, device: torch.device) -> PackAttention:
    """``position_ids`` when the model keeps packed sequences apart from their position
    ids alone, else ``mask``: a short sequence packed after a longer one must give the
    outputs it gives alone, and far closer to them than the unseparated forward (all
    ranks call this together under FSDP: it is a forward)."""
    g = torch.Generator().manual_seed(0)
    first, second = (torch.randint(0, vocab_size, (1, n), generator=g).to(device) for n in (12, 4))
    ids = torch.cat([first, second], dim=1)
    pos = torch.cat([torch.arange(12), torch.arange(4)]).unsqueeze(0).to(device)

    def out(ids: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        logits, values = net(ids, None, pos)
        result = logits if logits is not None else values
        assert result is not None  # the net returns one of them
        return result[:, -4:].float()

    alone = out(second, None)
    packed = (out(ids, pos) - alone).abs().max().item()
    unseparated = (out(ids, None) - alone).abs().max().item()
    return "position_ids" if packed <= 0.1 * unseparated else "mask"


def hf_name(name: str) -> str:
    """The Hugging Face name of a parameter of a model with peft's LoRA layers injected
    (``q_proj.base_layer.weight`` -> ``q_proj.weight``, ``lora_A.default.weight`` ->
    ``lora_A.weight``); other names unchanged."""
    return name.replace(".base_layer.", ".").replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")


def norm_names(lm: torch.nn.Module, prefix: str = "") -> set[str]:
    """The parameters of the model's normalisation layers (under ``prefix``), by name: of
    every module whose class is a norm (``LlamaRMSNorm``, ``Qwen3RMSNorm`` of q and k,
    Gemma3's four a block, ``LayerNorm`` ...), whatever the family calls the module."""
    return {
        f"{module}.{name}" if module else name
        for module, m in lm.named_modules()
        if type(m).__name__.endswith("Norm") and within(module, prefix)
        for name, _ in m.named_parameters(recurse=False)
    }


def no_dropout(lm: torch.nn.Module) -> None:
    """Dropout off in every layer, as transformers' eval mode has it, while the model stays in
    train mode (gradient checkpointing runs only there): the log-probs and the ratios of RL are
    those of the policy itself, not of a random sub-network (GPT-2 drops 10% by default). The
    ``nn.Dropout`` modules and the rates a layer keeps as a number (``attention_dropout``, OPT's
    ``dropout``); the model's config is unchanged. Before LoRA's layers: their dropout stays."""
    for module in lm.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr, value in vars(module).items():
            if "dropout" in attr and isinstance(value, float):
                setattr(module, attr, 0.0)


def sliding_window(config: Any) -> int | None:
    """The window of the model's sliding-window attention layers, if it has any (Gemma 3's
    ``layer_types``, Mistral's ``sliding_window``, not Qwen2's with ``use_sliding_window`` off)."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    if not window or getattr(text, "use_sliding_window", True) is False:
        return None
    if layer_types is not None and not any("sliding" in str(t) for t in layer_types):
        return None
    return int(window)


def right_padded(mask_BT: torch.Tensor) -> bool:
    """Every row of the 0/1 attention mask is ones then zeros (an all-zero row too)."""
    return mask_BT.shape[1] < 2 or bool((mask_BT[:, 1:] <= mask_BT[:, :-1]).all())


def logits_start(response_mask_BT: torch.Tensor) -> int:
    """The first position whose logits any row's response needs (the one before its
    first response token); 0 when no row has a response token."""
    has = response_mask_BT > 0
    rows = has.any(dim=1)
    if not bool(rows.any()):
        return 0
    first = has[rows].float().argmax(dim=1)  # each such row's first response position
    return max(int(first.min()) - 1, 0)


EAGER_MAX_TOKENS = 256
"""``attention = "auto"`` on the CPU: micro-batches whose rows are at most this long run eager
attention (its [rows, heads, T, T] scores are small there, and its backward is matmuls; the CPU
SDPA kernel's bfloat16 backward took about half of SmolLM2-135M's step at 62 tokens)."""

TRUNCATE_CHUNK = 1024
"""Token positions whose top-k/top-p sets are found at once (the sort of a 49k-vocabulary
row of each: bounds the memory of that pass)."""


def shift_logp(
    logits_BTV: torch.Tensor, ids_BT: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Per-token log-probs aligned with ``ids_BT`` (column 0 is 0), float32: under the
    distribution the rollout drew from, ``logits / temperature`` truncated by the
    sampling's ``top_k``/``top_p`` (``engines/sampling.py``; the token itself always
    kept, so its log-prob is finite)."""
    return F.pad(token_logp(logits_BTV[:, :-1], ids_BT[:, 1:], temperature, top_k, top_p), (1, 0))


def token_logp(
    logits_BTV: torch.Tensor, target_BT: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """The log-prob of ``target_BT[b, t]`` under ``logits_BTV[b, t]`` (the logits that
    predict it), float32, as ``shift_logp`` takes it."""
    logits = logits_BTV.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    target = target_BT.unsqueeze(-1)
    if temperature != 0.0 and truncates(top_k, top_p, logits.shape[-1]):
        B, T, V = logits.shape
        flat_NV, token_N = logits.reshape(B * T, V), target.reshape(B * T)
        parts = [
            truncated_logits(flat_NV[i : i + TRUNCATE_CHUNK], top_k, top_p, token_N[i : i + TRUNCATE_CHUNK])
            for i in range(0, B * T, TRUNCATE_CHUNK)
        ]
        logits = torch.cat(parts).reshape(B, T, V)
    return logits.gather(-1, target).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def shift_entropy(logits_BTV: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of the distribution that chose token t (column 0 is 0), float32."""
    return F.pad(token_entropy(logits_BTV[:, :-1], temperature), (1, 0))


def token_entropy(logits_BTV: torch.Tensor, temperature: float) -> torch.Tensor:
    """Entropy of each position's distribution ``logits_BTV[b, t] / temperature``, float32."""
    logits = logits_BTV.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


class TorchTrainEngine(TrainEngine):
    def __init__(self, cfg: TrainEngineConfig, model_dir: str | Path, total_steps: int = 0):
        set_cpu_threads(cfg.num_threads)
        self.cfg = cfg
        self.total_steps = total_steps  # optimizer steps of the run (the cosine schedule's length)
        self.model_dir = Path(model_dir)
        self.device = torch_device(cfg.device, torch.cuda.current_device() if cfg.device == "cuda" else 0)
        lm: Any = load_model(model_dir, dtype=torch_dtype(cfg.dtype), device=self.device)
        no_dropout(lm)
        # parameters shared with another (an LM head tied to the embeddings): saved once, as transformers does
        self._tied = {n for n, _ in lm.named_parameters(remove_duplicate=False)} - {n for n, _ in lm.named_parameters()}
        self._norms = norm_names(lm, prefix=language_model(lm))
        self.lora = cfg.lora.rank > 0
        self._base_samples: list[tuple[str, tuple[int, ...], torch.Tensor, torch.Tensor | None]] = []
        if self.lora:
            self._add_adapters(lm)
        if cfg.gradient_checkpointing:
            lm.gradient_checkpointing_enable()
            if self.lora:
                lm.enable_input_require_grads()  # frozen embeddings: checkpointed blocks still get an input with grad
        lm.train()
        self.net = _Net(lm, cfg.critic, cfg.seed)
        self.distributed = cfg.fsdp
        self.share_prompts = cfg.share_prompts and not cfg.critic  # a critic's values keep the padded path
        self.window = sliding_window(lm.config)
        """Sliding-window attention's window (None: none): a prompt's cache shared by its rows keeps
        only that many tokens, so longer micro-batches take the padded path."""
        if cfg.fsdp:
            if not dist.is_initialized():
                raise RuntimeError(
                    "fsdp=true needs torch.distributed initialised first "
                    "(asyncflow.engines.device.init_process_group, or torchrun)"
                )
            from torch.distributed.fsdp import fully_shard

            blocks = set(getattr(lm, "_no_split_modules", None) or ())  # the family's decoder block classes
            for layer in [m for m in lm.modules() if type(m).__name__ in blocks]:
                fully_shard(layer)
            fully_shard(self.net)
        self.dp_size = dist.get_world_size() if self.distributed else 1
        self.rank = dist.get_rank() if self.distributed else 0
        # the fused kernel (cpu, cuda): one call for every parameter instead of ~10 small ops each
        # (0.8 -> 0.2 ms a step for the tiny model); FSDP's sharded parameters keep the default
        fused = True if self.device.type in ("cpu", "cuda") and not cfg.fsdp else None
        trained = [p for p in self.net.parameters() if p.requires_grad] if self.lora else self.net.parameters()
        self.optimizer = torch.optim.AdamW(trained, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, fused=fused)
        self._step = 0
        self.autocast = resolve_autocast(cfg.autocast, self.device.type)
        """``cfg.autocast`` on this host ("auto" resolved: ``engines/precision.py``)."""
        if cfg.autocast == "auto":
            log.info("train.engine.autocast = 'auto': %s on this host", self.autocast)
        self.compute_dtype = torch_dtype(self.autocast if self.autocast != "off" else cfg.dtype)
        """The dtype the matmuls run in (``autocast``'s, else the parameters')."""
        self._model_attention = str(lm.config._attn_implementation)
        """The attention implementation the model loaded with (``attention = "auto"`` off the CPU or for long rows)."""
        self._chunk_head = self._chunkable_head(lm)
        """The LM head's weight where log-probs are taken chunk by chunk (``logit_chunk``), else None."""
        self.pack_attention: PackAttention | None = None
        """With packing: how attention is kept within packed sequences (the path that runs)."""
        if cfg.packing:
            self.pack_attention = (
                probe_pack_attention(self.net, lm.config.get_text_config().vocab_size, self.device)
                if cfg.pack_attention == "auto"
                else cfg.pack_attention
            )
            log.info("sequence packing: attention kept within sequences by %s", self.pack_attention)

    def _chunkable_head(self, lm: Any) -> torch.nn.Parameter | None:
        """The head's weight when ``logit_chunk`` applies: a policy on one rank whose logits are
        exactly ``hidden @ weight^T`` (a bias-free linear head, no soft-capping or scaling of the
        logits, no LoRA on the head)."""
        if not self.cfg.logit_chunk or self.cfg.critic or self.cfg.fsdp:
            return None
        head = lm.get_output_embeddings()
        text = lm.config.get_text_config()
        scaled = any(
            getattr(text, k, None) not in (None, 1.0) for k in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        )
        if type(head) is not torch.nn.Linear or head.bias is not None or scaled:
            log.info("train.engine.logit_chunk: the LM head (%s) is not a plain linear layer; whole logits", type(head).__name__)
            return None
        return head.weight

    def _head_outputs(
        self, hidden_BTE: torch.Tensor, target_BT: torch.Tensor, temperature: float, with_entropy: bool, top_k: int, top_p: float
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs, entropies or None) of ``target_BT`` under the head on ``hidden_BTE``,
        chunk by chunk (``engines/chunked_logp.py``) or, with truncated sampling, whole."""
        weight = self._chunk_head
        assert weight is not None  # only called where _chunk_head is set
        if temperature != 0.0 and truncates(top_k, top_p, weight.shape[0]):
            with self._compute():
                logits = self.net._head(hidden_BTE)
            entropy = token_entropy(logits, temperature) if with_entropy else None
            return token_logp(logits, target_BT, temperature, top_k, top_p), entropy
        # the head in the weight's dtype (float32 under autocast, as ``_Net._head``)
        return head_logp(hidden_BTE.to(weight.dtype), weight, target_BT, temperature, self.cfg.logit_chunk, with_entropy)

    def _add_adapters(self, lm: Any) -> None:
        """peft's LoRA layers on ``lora.target_modules`` (seeded: the same on every rank),
        the base weights frozen, and the digest's samples of the base weights cached
        (before FSDP shards them)."""
        from peft import LoraConfig, inject_adapter_in_model

        from asyncflow.engines.digest import sample_index

        spec = self.cfg.lora
        self.lora_targets = lora_targets(lm, spec.target_modules)
        """``lora.target_modules`` under this model's names (a fused layer for its parts)."""
        decoder = language_model(lm)
        self.lora_excluded = sorted(
            name
            for name, m in lm.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in self.lora_targets and not within(name, decoder)
        )
        """Layers of those names outside the language model (a vision tower's): not adapted."""
        peft_cfg = LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int; it takes any number (alpha / r)
            lora_dropout=spec.dropout,
            target_modules=self.lora_targets,
            exclude_modules=self.lora_excluded or None,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)
            inject_adapter_in_model(peft_cfg, lm)
        for name, param in lm.named_parameters():
            param.requires_grad_(".lora_" in name or (spec.train_norms and name in self._norms))
            if ".lora_" not in name:
                index = sample_index(param.numel(), param.device)
                flat = param.detach().reshape(-1)
                picked = (flat if index is None else flat[index]).to("cpu", copy=True)
                self._base_samples.append((hf_name(name), tuple(param.shape), picked, None if index is None else index.cpu()))
        self.adapted = sorted(n.removesuffix(".base_layer") for n, _ in lm.named_modules() if n.endswith(".base_layer"))
        if not self.adapted:
            raise ValueError(f"lora.target_modules = {list(spec.target_modules)} matched no layer of the model")
        log.info("LoRA rank %d on %d layers (%s)", spec.rank, len(self.adapted), ", ".join(self.lora_targets))

    def adapters(self) -> dict[str, Adapter]:
        """This engine's adapters by Hugging Face module name, whole (a gather under
        FSDP: every rank calls it), on cpu."""
        from asyncflow.engines.lora import Adapter

        def whole(p: torch.Tensor) -> torch.Tensor:
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            return full.detach().to("cpu", copy=True)

        modules = dict(self.net.lm.named_modules())
        out = {}
        for module in self.adapted:
            layer = modules[module]
            out[module] = Adapter(
                whole(layer.lora_A["default"].weight),
                whole(layer.lora_B["default"].weight),
                torch.tensor(float(layer.scaling["default"]), dtype=torch.float32),
            )
        return out

    def published_digest(self, snapshot: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> int:
        """With LoRA the snapshot is adapters only: the digest of the merged weights a
        replica holds once it applied them, from the cached base samples."""
        if not self.lora:
            return super().published_digest(snapshot, dtype)
        from asyncflow.engines.digest import digest_samples, sample
        from asyncflow.engines.lora import merged_sample, split

        full, adapters = split(snapshot)
        whole = dict(full)  # trained in full (train_norms): they replace the base
        samples = []
        for name, shape, base, index in self._base_samples:
            adapter = adapters.get(name.removesuffix(".weight"))
            if name in whole:
                samples.append((name, shape, sample(whole.pop(name))))
            else:
                samples.append((name, shape, base if adapter is None else merged_sample(base, index, adapter, dtype)))
        if whole:
            raise ValueError(f"a LoRA snapshot holds {sorted(whole)[0]!r}, not a parameter of this model")
        return digest_samples(samples, dtype)

    @property
    def version(self) -> int:
        return self._step

    def _compute(self) -> contextlib.AbstractContextManager[Any]:
        """Where the model runs: under ``torch.autocast`` with ``autocast`` set (its
        backward follows the forward's dtypes), else as is."""
        if self.autocast == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    def _set_attention(self, width: int) -> None:
        """The attention implementation for a micro-batch of rows ``width`` tokens long (``attention``)."""
        want: str = self.cfg.attention
        if want == "auto":
            want = "eager" if self.device.type == "cpu" and width <= EAGER_MAX_TOKENS else self._model_attention
        if self.net.lm.config._attn_implementation != want:
            self.net.lm.set_attn_implementation(want)

    def _run(self, mb: _MicroBatch, temperature: float, with_entropy: bool, top_k: int = 0, top_p: float = 1.0) -> ForwardOutput:
        self._set_attention((mb.packed.input_ids if mb.packed is not None else mb.batch.input_ids).shape[1])
        if mb.packed is not None:
            return self._run_packed(mb.packed.to(self.device), temperature, with_entropy, top_k, top_p)
        fits = self.window is None or mb.batch.input_ids.shape[1] < self.window
        shared = plan_shared(mb.batch) if self.share_prompts and fits else None
        if shared is not None:
            return self._run_shared(shared.to(self.device), temperature, with_entropy, top_k, top_p)
        ids = mb.batch.input_ids.to(self.device)
        # Right padding (every row's ones first): causal attention alone never lets a real
        # token see a pad, so the mask changes nothing at real positions (up to float rounding) and
        # the model skips building and applying it. Any other mask is passed as is.
        mask = None if right_padded(mb.batch.attention_mask) else mb.batch.attention_mask.to(self.device)
        start = 0 if self.cfg.critic else logits_start(mb.batch.response_mask)
        if self._chunk_head is not None:
            with self._compute():
                hidden_BTE, _ = self.net(ids, mask, None, start, hidden_only=True)
            assert hidden_BTE is not None
            logp, entropy = self._head_outputs(hidden_BTE[:, :-1], ids[:, start + 1 :], temperature, with_entropy, top_k, top_p)
            return ForwardOutput(
                logp=F.pad(logp, (start + 1, 0)), entropy=F.pad(entropy, (start + 1, 0)) if entropy is not None else None
            )
        with self._compute():
            logits, values = self.net(ids, mask, None, start)
        if values is not None:
            return ForwardOutput(logp=torch.zeros_like(values, dtype=torch.float32), values=F.pad(values[:, :-1].float(), (1, 0)))
        # logits of positions start.. only: the log-probs of tokens start + 1.., and 0 before (never a response token)
        entropy = F.pad(shift_entropy(logits, temperature), (start, 0)) if with_entropy else None
        logp = shift_logp(logits, ids[:, start:], temperature, top_k, top_p)
        return ForwardOutput(logp=F.pad(logp, (start, 0)), entropy=entropy)

    def _run_shared(
        self, plan: SharedPlan, temperature: float, with_entropy: bool, top_k: int = 0, top_p: float = 1.0
    ) -> ForwardOutput:
        """Each distinct prompt once, each row's response part on its keys and values
        (``train.engine.share_prompts``); outputs at the rows' [b, t], column 0 zero."""
        if self._chunk_head is not None:
            with self._compute():
                hidden_BRE, _ = self.net(plan.response_BR, None, shared=plan, hidden_only=True)
            assert hidden_BRE is not None
            logp_BR, entropy_BR = self._head_outputs(hidden_BRE, plan.response_BR, temperature, with_entropy, top_k, top_p)
            return ForwardOutput(logp=plan.back(logp_BR), entropy=plan.back(entropy_BR) if entropy_BR is not None else None)
        with self._compute():
            logits_BRV, _ = self.net(plan.response_BR, None, shared=plan)
        assert logits_BRV is not None  # the shared path has no value head
        entropy = plan.back(token_entropy(logits_BRV, temperature)) if with_entropy else None
        logp = plan.back(token_logp(logits_BRV, plan.response_BR, temperature, top_k, top_p))
        return ForwardOutput(logp=logp, entropy=entropy)

    def _run_packed(
        self, packed: PackedRows, temperature: float, with_entropy: bool, top_k: int = 0, top_p: float = 1.0
    ) -> ForwardOutput:
        """The model on packed rows [R, N]; outputs put back at the rows' [b, t], column 0 zero."""
        ids_RN, pos_RN = packed.input_ids, packed.position_ids
        mask = block_causal_mask(pos_RN, self.compute_dtype) if self.pack_attention == "mask" else None

        def back(x_RN: torch.Tensor) -> torch.Tensor:
            # x_RN[r, n] is about the token at n given what precedes it; a sequence's first
            # token has no context of its own (padded path: column 0 is 0)
            x_BT = packed.unpack(x_RN)
            x_BT[:, 0] = 0.0
            return x_BT

        if self._chunk_head is not None:
            with self._compute():
                hidden_RNE, _ = self.net(ids_RN, mask, pos_RN, hidden_only=True)
            assert hidden_RNE is not None
            logp_RN, entropy_RN = self._head_outputs(hidden_RNE[:, :-1], ids_RN[:, 1:], temperature, with_entropy, top_k, top_p)
            entropy = back(F.pad(entropy_RN, (1, 0))) if entropy_RN is not None else None
            return ForwardOutput(logp=back(F.pad(logp_RN, (1, 0))), entropy=entropy)
        with self._compute():
            logits, values = self.net(ids_RN, mask, pos_RN)
        if values is not None:
            values_BT = back(F.pad(values[:, :-1].float(), (1, 0)))
            return ForwardOutput(logp=torch.zeros_like(values_BT), values=values_BT)
        entropy = back(shift_entropy(logits, temperature)) if with_entropy else None
        return ForwardOutput(logp=back(shift_logp(logits, ids_RN, temperature, top_k, top_p)), entropy=entropy)

    def _micro_batches(self, batch: TokenBatch) -> list[_MicroBatch]:
        if self.cfg.packing:
            return self._packed_micro_batches(batch)
        if self.cfg.micro_batch_tokens:
            mbs = [_MicroBatch(rows, batch.select(rows)) for rows in self._token_sized(batch)]
        else:
            step = self.cfg.micro_batch_size
            mbs = [_MicroBatch(slice(s, s + step), batch.select(slice(s, s + step))) for s in range(0, batch.batch_size, step)]
        if self.distributed:
            counts = torch.tensor([len(mbs), -len(mbs)], dtype=torch.long)
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
            if counts[0].item() != -counts[1].item():
                raise ValueError(
                    f"rank {self.rank} has {len(mbs)} micro-batches but another rank differs; give every "
                    "data-parallel rank the same number of rows per step"
                )
        return mbs

    def _token_sized(self, batch: TokenBatch) -> list[list[int]]:
        """``micro_batch_tokens``: the rows by length (with ``share_prompts`` in their order,
        which keeps a group's rows together), cut where rows x the longest would pass the budget."""
        lengths = batch.attention_mask.sum(dim=1).tolist()
        order = list(range(len(lengths))) if self.share_prompts else sorted(range(len(lengths)), key=lambda b: lengths[b])
        budget = self.cfg.micro_batch_tokens
        groups: list[list[int]] = []
        longest = 0
        for b in order:
            width = max(longest, int(lengths[b]), 1)
            if groups and width * (len(groups[-1]) + 1) <= budget:
                groups[-1].append(b)
                longest = width
            else:
                groups.append([b])
                longest = max(int(lengths[b]), 1)
        return groups

    def _packed_micro_batches(self, batch: TokenBatch) -> list[_MicroBatch]:
        if not right_padded(batch.attention_mask):
            raise ValueError("packing needs right-padded rows (attention_mask ones then zeros); set train.engine.packing = false")
        lengths = batch.attention_mask.sum(dim=1).tolist()
        budget = self.cfg.pack_tokens or max(lengths, default=1)
        plan = plan_packing(lengths, budget, self.cfg.micro_batch_size)
        if self.distributed:
            # every rank runs as many forwards as the rank with most micro-batches; one with fewer
            # splits rows, down to one sequence per micro-batch (all ranks refuse together otherwise)
            most = sum(n > 0 for n in lengths)
            counts = torch.tensor([len(plan), -most], dtype=torch.long)
            dist.all_reduce(counts, op=dist.ReduceOp.MAX)
            needed, fewest = int(counts[0].item()), -int(counts[1].item())
            if needed > fewest:
                raise ValueError(
                    f"a rank packs its part into {needed} micro-batches but another has only {fewest} non-empty rows; "
                    "give every data-parallel rank the same number of rows per step"
                )
            if needed > len(plan):
                plan = plan_packing(lengths, budget, self.cfg.micro_batch_size, min_micro_batches=needed)
        mbs = []
        for rows in plan:
            order = [b for row in rows for b in row]
            where = {b: j for j, b in enumerate(order)}
            sub = batch.select(order)
            mbs.append(_MicroBatch(order, sub, pack_batch(sub, [[where[b] for b in row] for row in rows])))
        return mbs

    @torch.no_grad()
    def forward(
        self, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False, top_k: int = 0, top_p: float = 1.0
    ) -> ForwardOutput:
        mbs = self._micro_batches(batch)
        outs = [self._run(mb, temperature, with_entropy, top_k, top_p) for mb in mbs]

        def gather(key: str) -> torch.Tensor | None:
            if getattr(outs[0], key) is None:
                return None
            full_BT = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
            for mb, out in zip(mbs, outs):
                part = getattr(out, key)
                full_BT[mb.rows, : part.shape[1]] = part.cpu()
            return full_BT

        logp = gather("logp")
        assert logp is not None  # every forward computes log-probs
        return ForwardOutput(logp=logp, entropy=gather("entropy"), values=gather("values"))

    def train_step(
        self, batch: TokenBatch, loss_fn: LossFn, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
    ) -> TrainStepResult:
        mask = batch.response_mask.float()
        totals = torch.tensor([mask.sum().item(), (mask.sum(dim=1) > 0).sum().item()], dtype=torch.float64)
        if self.distributed:
            dist.all_reduce(totals)
        ctx = LossContext(num_tokens=max(totals[0].item(), 1.0), num_seqs=max(totals[1].item(), 1.0), dp_size=self.dp_size)
        part = self.accumulate(batch, loss_fn, ctx, temperature, top_k, top_p)
        grad_norm, lr = self.apply_gradients()
        total_loss, metrics = part.loss, part.metrics
        if self.distributed:
            # Each rank's loss was scaled by dp_size (FSDP averages gradients): the
            # step's figures are the ranks' sums divided by dp_size.
            names = sorted(metrics)
            figures = torch.tensor([total_loss] + [metrics[k] for k in names], dtype=torch.float64)
            dist.all_reduce(figures)
            figures /= self.dp_size
            total_loss = figures[0].item()
            metrics = {k: figures[i + 1].item() for i, k in enumerate(names)}
        metrics["lr"] = lr
        return TrainStepResult(
            loss=total_loss,
            grad_norm=grad_norm,
            num_tokens=int(totals[0].item()),
            metrics=metrics,
            step=self._step,
            num_fed_tokens=part.num_fed_tokens,
        )

    def accumulate(
        self,
        batch: TokenBatch,
        loss_fn: LossFn,
        ctx: LossContext,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> Accumulated:
        mbs = self._micro_batches(batch)
        self.net.train()
        total_loss = 0.0
        metrics: dict[str, float] = {}
        num_fed_tokens = sum((mb.packed.input_ids if mb.packed is not None else mb.batch.input_ids).numel() for mb in mbs)
        for mb in mbs:
            with phase("forward"):
                out = self._run(mb, temperature, True, top_k, top_p)
            with phase("loss"):
                loss, mb_metrics = loss_fn(out, mb.batch.to(self.device), ctx)
            with phase("backward"):
                loss.backward()
            total_loss += float(loss.detach())
            for k, v in mb_metrics.items():
                metrics[k] = metrics.get(k, 0.0) + float(v)
        return Accumulated(loss=total_loss, metrics=metrics, num_fed_tokens=num_fed_tokens)

    def apply_gradients(self, grad_scale: float = 1.0) -> tuple[float, float]:
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        with phase("optimizer"):
            if grad_scale != 1.0:
                for param in self.net.parameters():
                    if param.grad is not None:
                        param.grad.mul_(grad_scale)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), max_norm)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            lr = lr_at(self.cfg, self._step, self.total_steps)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self._step += 1
        return float(grad_norm), lr

    @torch.no_grad()
    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.lora:
            for module, adapter in self.adapters().items():
                yield from adapter.tensors(module)
            if self.cfg.lora.train_norms:  # trained in full: they travel in full
                for name, param in self.net.lm.named_parameters():
                    if name in self._norms:
                        full = param.full_tensor() if hasattr(param, "full_tensor") else param
                        yield name, full.detach().to("cpu", copy=True)
            return
        for name, param in self.net.lm.named_parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            yield name, full.detach().to("cpu", copy=True)

    def _full_options(self) -> StateDictOptions:
        return StateDictOptions(full_state_dict=True, cpu_offload=True)

    def save_checkpoint(self, path: str | Path, with_optimizer: bool = True) -> None:
        out = Path(path)
        state: dict[str, Any] = get_model_state_dict(self.net, options=self._full_options())  # tensors, full
        optim = get_optimizer_state_dict(self.net, self.optimizer, options=self._full_options()) if with_optimizer else None
        if self.rank != 0:
            return
        out.mkdir(parents=True, exist_ok=True)
        lm = {hf_name(k.removeprefix("lm.")): v.contiguous() for k, v in state.items() if k.startswith("lm.")}
        for name in self._tied:
            lm.pop(name, None)
        adapters: dict[str, Adapter] = {}
        if self.lora:  # the base weights as loaded; the adapter beside them
            from asyncflow.engines.lora import LORA_A, LORA_B, Adapter, is_adapter_name

            scaling = torch.tensor(self.cfg.lora.alpha / self.cfg.lora.rank, dtype=torch.float32)
            adapters = {
                k.removesuffix(LORA_A): Adapter(v, lm[k.removesuffix(LORA_A) + LORA_B], scaling)
                for k, v in lm.items()
                if k.endswith(LORA_A)
            }
            lm = {k: v for k, v in lm.items() if not is_adapter_name(k)}
        safetensors.torch.save_file(lm, out / "model.safetensors", metadata={"format": "pt"})
        self._save_config(out)
        if self.lora:
            self._save_lora(out, lm, adapters)
        head = {k.removeprefix("value_head."): v.contiguous() for k, v in state.items() if k.startswith("value_head.")}
        if head:
            safetensors.torch.save_file(head, out / "value_head.safetensors")
        if optim is not None:
            torch.save(optim, out / "optimizer.pt")
        (out / "trainer_state.json").write_text(json.dumps({"step": self._step}))

    def _save_config(self, out: Path) -> None:
        """config.json and the tokenizer files of the model this engine started from."""
        self.net.lm.config.save_pretrained(out)
        for name in TOKENIZER_FILES:
            if (self.model_dir / name).is_file() and self.model_dir.resolve() != out.resolve():
                shutil.copy(self.model_dir / name, out / name)

    def _save_lora(self, out: Path, base: dict[str, torch.Tensor], adapters: dict[str, Adapter]) -> None:
        """``out/adapter`` in peft's layout and, with ``lora.save_merged``, ``out/merged``."""
        from asyncflow.engines.lora import ADAPTER_DIR, merge, save_adapter

        spec = self.cfg.lora
        # trained norms are in this checkpoint's model.safetensors: the adapter's base is then this directory
        base_model = str(out.resolve()) if spec.train_norms else str(self.model_dir)
        save_adapter(
            out / ADAPTER_DIR, adapters, spec.rank, spec.alpha, spec.dropout, self.lora_targets, base_model, self.lora_excluded
        )
        if spec.save_merged:
            merged = dict(base)
            for module, adapter in adapters.items():
                merged[module + ".weight"] = merge(base[module + ".weight"], adapter, base[module + ".weight"].dtype)
            (out / "merged").mkdir(exist_ok=True)
            safetensors.torch.save_file(merged, out / "merged" / "model.safetensors", metadata={"format": "pt"})
            self._save_config(out / "merged")

    def load_checkpoint(self, path: str | Path, with_optimizer: bool = True) -> None:
        src = Path(path)
        state: dict[str, Any] = {"lm." + k: v for k, v in safetensors.torch.load_file(src / "model.safetensors").items()}
        if self.lora:
            state = self._lora_state(src, state)
        if (src / "value_head.safetensors").is_file():
            state.update({"value_head." + k: v for k, v in safetensors.torch.load_file(src / "value_head.safetensors").items()})
        set_model_state_dict(self.net, state, options=StateDictOptions(full_state_dict=True, strict=False))
        if with_optimizer and (src / "optimizer.pt").is_file():
            optim = torch.load(src / "optimizer.pt", weights_only=False)
            set_optimizer_state_dict(self.net, self.optimizer, optim, options=StateDictOptions(full_state_dict=True))
        if (src / "trainer_state.json").is_file():
            self._step = json.loads((src / "trainer_state.json").read_text())["step"]

    def _lora_state(self, src: Path, state: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's base weights and ``adapter/`` under this model's parameter names."""
        from asyncflow.engines.lora import ADAPTER_DIR, LORA_A, LORA_B, load_adapter

        if not (src / ADAPTER_DIR).is_dir():
            raise FileNotFoundError(
                f"{src} has no {ADAPTER_DIR}/: it is not a LoRA checkpoint; resume it with train.engine.lora.rank = 0"
            )
        adapted = {"lm." + m + ".weight" for m in self.adapted}
        out = {(k.removesuffix(".weight") + ".base_layer.weight" if k in adapted else k): v for k, v in state.items()}
        for module, adapter in load_adapter(src / ADAPTER_DIR).items():
            if module not in self.adapted:
                raise ValueError(f"{src / ADAPTER_DIR} adapts {module!r}, which this run's lora.target_modules do not")
            out["lm." + module + LORA_A.replace(".weight", ".default.weight")] = adapter.A_RI
            out["lm." + module + LORA_B.replace(".weight", ".default.weight")] = adapter.B_OR
        return out
