"""The hf rollout engine: generation with the model's own Hugging Face forward and KV
cache (``rollout.engine.type = "hf"``, and what ``"auto"`` takes for a model the native
engine does not implement: ``engines/families``). The slow fallback: any causal LM that
``AutoModelForCausalLM`` builds, under the native engine's contract.

Each sample of each prompt is a sequence. Sequences admitted together from one prompt
form a cohort that owns one transformers ``Cache`` with a row per sequence. The
scheduler loop, one iteration per ``HFStream.step`` (the native engine's):
1. admit waiting sequences, in order, while a row is free (``max_batch_size``, or the
   stream's ``max_running``) and the KV budget can reserve the sequence's worst case
   (``prompt_len + max_new_tokens - 1`` tokens at ``kv_bytes_per_token``, measured on the
   model's own cache at start);
2. prefill: each distinct prompt among the admitted runs once, a batch of one; its
   cache is repeated for its samples (``Cache.batch_repeat_interleave``), which sample
   their first tokens from its last logits (one ``sample`` call over every admitted
   sequence, in admission order);
3. decode: each cohort feeds the last token of each of its rows in one forward on its
   cache; one ``sample`` call over every running sequence;
4. a sequence that sampled a stop token or reached its ``max_new_tokens`` leaves: its row
   is dropped from its cohort's cache (``Cache.batch_select_indices``) and its
   reservation returned, so waiting sequences join on the next iteration.

A model whose cache is not made of plain key/value layers (a linear-attention or state
space hybrid, which those two cache methods do not reshape) runs every sequence as a
cohort of its own: nothing is shared or dropped, only released whole.

Invariants:
- No padding: the rows of a cohort always have the same length, so each forward is the
  model's own on unpadded sequences (its default positions and causal mask), and the
  log-probs are ``log_softmax(logits / temperature)`` of the sampled token before
  top-k/top-p truncation, as ``engines/sampling.py`` gives them (the native engine's;
  the training engine's within 1e-4 at temperature 1 in float32).
- KV memory: reservations are worst case and stay within ``kv_cache_bytes`` (or the
  fraction of free device memory; 64 MiB without either); a sequence that could never
  fit, or whose length passes the model's ``max_position_embeddings``, is refused by
  ``add`` before anything runs, naming the setting.
- Completions come back ordered by (prompt, sample) from ``generate``.
- Weights load in place; ``version`` changes only in ``load_weights``. In a stream
  (partial rollout) a running sequence keeps the cache its old weights computed: the
  tokens after a swap are sampled by the new weights attending to the old keys and
  values (the last token sampled before the swap is fed under the new weights), as in
  the native engine. Each token records the version that sampled it.
- LoRA adapters (``engines/lora.py``'s wire form, or ``model_dir/adapter`` at start) are
  merged onto the base weight kept aside, as the native engine merges them: each
  adapter replaces the one before.
- Weight names are the model's own (``named_parameters``); a tied alias
  (``lm_head.weight`` tied to the embeddings) is skipped, an unknown name is a KeyError
  naming it, a shape mismatch a ValueError.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

from asyncflow.core.phases import phase
from asyncflow.engines.base import Completion, RolloutEngine, RolloutStream
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.device import free_memory_bytes, set_cpu_threads, torch_device, torch_dtype
from asyncflow.engines.hf import load_model
from asyncflow.engines.lora import ADAPTER_DIR, Adapter, load_adapter, merge, split
from asyncflow.engines.sampling import sample

DEFAULT_KV_CACHE_BYTES = 64 * 2**20
"""The KV budget when the config gives neither ``kv_cache_bytes`` nor a fraction (the
native engine's)."""


@dataclass
class _Seq:
    prompt_index: int
    sample_index: int
    prompt: list[int]
    max_new: int
    reserved: int = 0  # KV bytes reserved for it while admitted
    out_ids: list[int] = field(default_factory=list)
    out_logps: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)


@dataclass
class _Cohort:
    """Sequences of one prompt admitted together: row ``i`` of ``cache`` is ``seqs[i]``'s."""

    seqs: list[_Seq]
    cache: Any  # a transformers Cache with len(seqs) rows


@dataclass
class HFStats:
    """What the last ``generate`` (or a stream) did, in the native engine's terms."""

    num_steps: int = 0
    """Decode iterations (each runs one forward per cohort)."""
    decode_rows: int = 0
    """Sequences decoded, summed over the decode iterations."""
    num_prefills: int = 0
    """Prefill forwards: one per distinct prompt admitted together."""
    prefill_rows: int = 0
    """Prompts run through prefill (its other samples copy its cache)."""
    prefill_tokens: int = 0
    """Prompt tokens run through prefill forwards."""
    max_running: int = 0
    """Most sequences running at once."""
    admitted_while_running: int = 0
    """Sequences admitted while others were still decoding."""
    peak_reserved_bytes: int = 0
    """Most KV bytes reserved at once; never above the budget."""


def _tensor_bytes(obj: Any, depth: int = 0) -> int:
    """Bytes of the tensors in a cache layer's attributes (tensors, dicts, lists)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth > 3:
        return 0
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, depth + 1) for v in obj)
    return 0


def _cache_bytes(cache: Any) -> int:
    layers = getattr(cache, "layers", None)
    if layers is None:  # a legacy tuple of (key, value) per layer
        return _tensor_bytes(cache)
    return sum(_tensor_bytes(vars(layer)) for layer in layers)


def _reshapable(cache: Any) -> bool:
    """Whether rows of this cache can be repeated and dropped: plain key/value layers."""
    layers: list[Any] = getattr(cache, "layers", None) or []
    return bool(layers) and all(
        isinstance(layer, DynamicLayer) and not isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers
    )


class HFRolloutEngine(RolloutEngine):
    def __init__(self, cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0):
        set_cpu_threads(cfg.num_threads)
        self.cfg = cfg
        self.device = torch_device(cfg.device, cfg.device_index)
        self.model: Any = load_model(model_dir, dtype=torch_dtype(cfg.dtype), device=self.device)
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self._params = dict(self.model.named_parameters())
        # tied aliases: names named_parameters drops because the tensor is another parameter's
        self._aliases = {n for n, _ in self.model.named_parameters(remove_duplicate=False)} - set(self._params)
        accepted = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in accepted else "past_key_values"
        self._keep_last = "logits_to_keep" in accepted
        self.kv_fixed_bytes, self.kv_bytes_per_token, self.shares_cache = self._measure_cache()
        self.budget_bytes = self._budget_bytes(cfg)
        self.reserved_bytes = 0
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._version = version
        self.stats = HFStats()
        self._lora_base: dict[str, torch.Tensor] = {}  # adapted weight -> its base (before any adapter)
        adapter_dir = Path(model_dir) / ADAPTER_DIR
        if (adapter_dir / "adapter_model.safetensors").is_file():  # a LoRA checkpoint: base weights + adapter
            self._merge(load_adapter(adapter_dir))

    def _budget_bytes(self, cfg: RolloutEngineConfig) -> int:
        if cfg.kv_cache_bytes is not None and cfg.kv_cache_fraction is not None:
            raise ValueError("set kv_cache_bytes or kv_cache_fraction, not both")
        if cfg.kv_cache_fraction is not None:
            return int(free_memory_bytes(self.device) * cfg.kv_cache_fraction)
        return cfg.kv_cache_bytes if cfg.kv_cache_bytes is not None else DEFAULT_KV_CACHE_BYTES

    @torch.inference_mode()
    def _forward(self, ids_BQ: torch.Tensor, cache: Any) -> tuple[torch.Tensor, Any]:
        """The model on ``ids_BQ`` after ``cache`` (None: from the start): the logits of
        the last position of each row [B, V], and the cache grown by ``ids_BQ``."""
        kw: dict[str, Any] = {"input_ids": ids_BQ, "use_cache": True}
        if cache is not None:
            kw[self._cache_arg] = cache
        if self._keep_last:
            kw["logits_to_keep"] = 1
        out = self.model(**kw)
        grown = getattr(out, "cache", None)
        if grown is None:
            grown = getattr(out, "past_key_values", None)
        if grown is None:
            raise ValueError(
                f"{type(self.model).__name__} returned no KV cache with use_cache=True: the hf engine needs one; "
                'use a model that caches (or rollout.engine.type = "vllm")'
            )
        return out.logits[:, -1], grown

    def _measure_cache(self) -> tuple[int, int, bool]:
        """(bytes a sequence's cache holds whatever its length, bytes per token, whether
        its rows can be repeated and dropped), from the model's own cache of one token
        and of two."""
        ids = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        _, cache = self._forward(ids, None)
        one = _cache_bytes(cache)
        _, cache = self._forward(ids, cache)
        per_token = max(_cache_bytes(cache) - one, 0)
        return max(one - per_token, 0), per_token, _reshapable(cache)

    def kv_bytes(self, num_tokens: int) -> int:
        """The bytes a sequence of ``num_tokens`` fed tokens reserves."""
        return self.kv_fixed_bytes + self.kv_bytes_per_token * num_tokens

    @property
    def version(self) -> int:
        return self._version

    def weights_digest(self) -> int:
        from asyncflow.engines.digest import weights_digest

        return weights_digest(self._params.items())

    @torch.inference_mode()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        full, adapters = split(named_tensors)
        for name, tensor in full:
            self._lora_base.pop(name, None)
            param = self._params.get(name)
            if param is None:
                if name in self._aliases:
                    continue  # tied to another parameter, which arrives under its own name
                raise KeyError(
                    f"weight {name!r} is not a parameter of the rollout model; do both engines load the same model_dir?"
                )
            if param.shape != tensor.shape:
                raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != model's {tuple(param.shape)}")
            param.copy_(tensor)
        self._merge(adapters)
        self._version = version

    @torch.inference_mode()
    def _merge(self, adapters: dict[str, Adapter]) -> None:
        """Each adapted weight := its base + the adapter (``lora.merge``)."""
        for module, adapter in adapters.items():
            name = module + ".weight"
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"adapter for {module!r}: the rollout model has no weight {name!r}; same model_dir on both sides?")
            shape = (adapter.B_OR.shape[0], adapter.A_RI.shape[1])
            if tuple(param.shape) != shape:
                raise ValueError(f"adapter for {module!r} makes a {shape} update of a {tuple(param.shape)} weight")
            base = self._lora_base.setdefault(name, param.detach().clone())
            param.copy_(merge(base, adapter, param.dtype))

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        stream = self.open_stream(params)
        try:
            stream.add(prompts)
            done: list[Completion] = []
            while stream.num_active:
                done.extend(stream.step())
        finally:
            stream.close()
        self.stats = stream.stats
        done.sort(key=lambda c: (c.prompt_index, c.sample_index))
        return done

    def open_stream(self, params: SamplingParams, max_running: int | None = None) -> HFStream:
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        return HFStream(self, params, max_running)

    def _reserve(self, q: _Seq) -> bool:
        need = self.kv_bytes(len(q.prompt) + q.max_new - 1)
        if self.reserved_bytes + need > self.budget_bytes:
            return False
        q.reserved = need
        self.reserved_bytes += need
        return True

    def _release(self, q: _Seq) -> None:
        self.reserved_bytes -= q.reserved
        q.reserved = 0

    def _append(self, seqs: list[_Seq], logits_BV: torch.Tensor, params: SamplingParams) -> None:
        with phase("sample"):
            token_B, logp_B = sample(logits_BV, params, self.generator)
        for q, t, lp in zip(seqs, token_B.tolist(), logp_B.tolist()):
            q.out_ids.append(t)
            q.out_logps.append(lp)
            q.out_versions.append(self._version)

    def _prefill(self, seqs: list[_Seq], params: SamplingParams) -> list[_Cohort]:
        """Run each distinct prompt of ``seqs`` once (each sequence alone where the cache
        cannot share rows), give its samples a copy of its cache, and sample every
        sequence's first token; returns the new cohorts."""
        groups: dict[int, list[_Seq]] = {}
        for i, q in enumerate(seqs):
            groups.setdefault(q.prompt_index if self.shares_cache else -1 - i, []).append(q)
        cohorts, last = [], {}
        with phase("prefill_model"):
            for key, members in groups.items():
                ids = torch.tensor([members[0].prompt], dtype=torch.long, device=self.device)
                last[key], cache = self._forward(ids, None)
                if len(members) > 1:
                    cache.batch_repeat_interleave(len(members))
                cohorts.append(_Cohort(members, cache))
        keys = [q.prompt_index if self.shares_cache else -1 - i for i, q in enumerate(seqs)]
        self._append(seqs, torch.cat([last[k] for k in keys]), params)
        return cohorts

    def _decode(self, cohorts: list[_Cohort], params: SamplingParams) -> None:
        """One token for every running sequence: a forward per cohort, one ``sample``."""
        logits = []
        with phase("decode_model"):
            for cohort in cohorts:
                ids = torch.tensor([[q.out_ids[-1]] for q in cohort.seqs], dtype=torch.long, device=self.device)
                logits_BV, cohort.cache = self._forward(ids, cohort.cache)
                logits.append(logits_BV)
        self._append([q for c in cohorts for q in c.seqs], torch.cat(logits), params)

    def close(self) -> None:
        del self.model


class HFStream(RolloutStream):
    """The scheduler loop of ``HFRolloutEngine`` (module docstring), one iteration per
    ``step``: prompts join with ``add`` at any time and finished sequences leave from
    ``step``; ``generate`` is one stream run to the end. Between two steps the engine's
    weights may be replaced: running sequences keep their caches (module docstring)."""

    def __init__(self, engine: HFRolloutEngine, params: SamplingParams, max_running: int | None = None):
        self.engine = engine
        self.params = params
        self.stop = set(params.stop_token_ids)
        self.max_rows = min(engine.cfg.max_batch_size, max_running or engine.cfg.max_batch_size)
        self.waiting: deque[_Seq] = deque()
        self.cohorts: list[_Cohort] = []
        self.stats = HFStats()
        self.num_prompts = 0

    @property
    def num_running(self) -> int:
        return sum(len(c.seqs) for c in self.cohorts)

    @property
    def num_active(self) -> int:
        return len(self.waiting) + self.num_running

    @property
    def num_free(self) -> int:
        return max(self.max_rows - self.num_running - len(self.waiting), 0)

    def add(self, prompts: Sequence[Sequence[int]], n: int | None = None, max_new_tokens: int | None = None) -> list[int]:
        engine, params = self.engine, self.params
        n = params.n if n is None else n
        max_new = params.max_new_tokens if max_new_tokens is None else max_new_tokens
        if n < 1 or max_new < 1:
            raise ValueError(f"n = {n} and max_new_tokens = {max_new} must be >= 1")
        for p, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompt {p} is empty; a prompt needs at least one token")
            need = len(prompt) + max_new - 1
            if engine.max_positions is not None and need > engine.max_positions:
                raise ValueError(
                    f"prompt {p}: {len(prompt)} tokens + max_new_tokens={max_new} exceeds the model's "
                    f"max_position_embeddings={engine.max_positions}; lower max_new_tokens"
                )
            if engine.kv_bytes(need) > engine.budget_bytes:
                raise ValueError(
                    f"prompt {p} needs {need} KV tokens ({engine.kv_bytes(need)} bytes) but the budget is "
                    f"{engine.budget_bytes} bytes; raise kv_cache_bytes or lower max_new_tokens"
                )
        indices = []
        for prompt in prompts:
            for s in range(n):
                self.waiting.append(_Seq(self.num_prompts, s, list(prompt), max_new))
            indices.append(self.num_prompts)
            self.num_prompts += 1
        return indices

    def _leave(self, cohort: _Cohort, done: list[_Seq]) -> None:
        """Sequences of ``cohort`` that finished leave it (and its cache)."""
        keep = [i for i, q in enumerate(cohort.seqs) if not (q.out_ids[-1] in self.stop or len(q.out_ids) >= q.max_new)]
        if len(keep) == len(cohort.seqs):
            return
        for i, q in enumerate(cohort.seqs):
            if i not in keep:
                self.engine._release(q)
                done.append(q)
        if keep:
            cohort.cache.batch_select_indices(torch.tensor(keep, device=self.engine.device))
            cohort.seqs = [cohort.seqs[i] for i in keep]
        else:
            cohort.seqs, cohort.cache = [], None

    def step(self) -> list[Completion]:
        engine, stats = self.engine, self.stats
        done: list[_Seq] = []
        admitted: list[_Seq] = []
        running = self.num_running
        while self.waiting and running + len(admitted) < self.max_rows and engine._reserve(self.waiting[0]):
            admitted.append(self.waiting.popleft())
        stats.peak_reserved_bytes = max(stats.peak_reserved_bytes, engine.reserved_bytes)
        if admitted:
            if running:
                stats.admitted_while_running += len(admitted)
            try:
                new = engine._prefill(admitted, self.params)
            except BaseException:
                for q in admitted:
                    engine._release(q)
                raise
            stats.num_prefills += len(new)
            stats.prefill_rows += len(new)
            stats.prefill_tokens += sum(len(c.seqs[0].prompt) for c in new)
            for cohort in new:
                self._leave(cohort, done)
            self.cohorts.extend(c for c in new if c.seqs)
        running = self.num_running
        stats.max_running = max(stats.max_running, running)
        if self.cohorts:
            engine._decode(self.cohorts, self.params)
            stats.num_steps += 1
            stats.decode_rows += running
            for cohort in self.cohorts:
                self._leave(cohort, done)
            self.cohorts = [c for c in self.cohorts if c.seqs]
        return [
            Completion(
                prompt_index=q.prompt_index,
                sample_index=q.sample_index,
                response_ids=q.out_ids,
                logprobs=q.out_logps,
                finish_reason="stop" if q.out_ids[-1] in self.stop else "length",
                version=q.out_versions[0],
                token_versions=q.out_versions,
            )
            for q in done
        ]

    def close(self) -> None:
        # an error mid-generation must not leak reservations into the next call
        for cohort in self.cohorts:
            for q in cohort.seqs:
                self.engine._release(q)
        self.cohorts = []
        self.waiting.clear()
