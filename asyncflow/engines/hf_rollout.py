"""The hf rollout engine: generation with the model's own Hugging Face forward and KV
cache (``rollout.engine.type = "hf"``, and what ``"auto"`` takes for a model the native
engine does not implement: ``engines/families``). The slow fallback: any causal LM that
``AutoModelForCausalLM`` builds, under the native engine's contract.

Each sample of each prompt is a sequence; sequences that share a cache form a batch.
How they may share one is the cache's layout (``engines/hf_cache.py``): with plain
key/value layers (most models) every running sequence is a row of one batch, left-padded
to the longest, with an attention mask and each row's own position ids; with sliding
windows only the samples of one prompt admitted together (always of one length) share
one; with linear-attention or state space layers every sequence has its own. The
scheduler loop, one iteration per ``HFStream.step`` (the native engine's):
1. admit waiting sequences, in order, while a row is free (``max_batch_size``, or the
   stream's ``max_running``) and the KV budget holds the running sequences' worst case
   with it (each at ``prompt_len + max_new_tokens - 1`` tokens, padded ones all at the
   longest of them, at ``kv_bytes_per_token`` measured on the model's own cache at start);
2. prefill: each distinct prompt among the admitted runs once, a batch of one with no
   padding; its cache is repeated for its samples (``Cache.batch_repeat_interleave``),
   which sample their first tokens from its last logits (one ``sample`` call over every
   admitted sequence, in admission order); with plain layers they then join the batch;
3. decode: each batch feeds the last token of each of its rows in one forward on its
   cache; one ``sample`` call over every running sequence;
4. a sequence that sampled a stop token or reached its ``max_new_tokens`` leaves: its row
   is dropped from its batch's cache (``Cache.batch_select_indices``, then the padding
   every row still has), its reservation returned, so waiting sequences join on the next
   iteration.

Invariants:
- A row's tokens sit at their own positions and attend exactly to their sequence's
  earlier tokens (padding is masked, and prompts run unpadded), so the log-probs are
  ``log_softmax(logits / temperature)`` of the sampled token before top-k/top-p
  truncation, as ``engines/sampling.py`` gives them (the native engine's; the training
  engine's within 1e-4 at temperature 1 in float32).
- KV memory: reservations are worst case (padding included) and stay within
  ``kv_cache_bytes`` (or the fraction of free device memory; 64 MiB without either;
  the copies a cache's growth makes in passing are not counted); a sequence that could
  never fit, or whose length passes the model's ``max_position_embeddings``, is refused
  by ``add`` before anything runs, naming the setting.
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
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asyncflow.core.phases import phase
from asyncflow.engines import hf_cache
from asyncflow.engines.base import Completion, RolloutEngine, RolloutStream, run_stream
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.device import set_cpu_threads, torch_device, torch_dtype
from asyncflow.engines.hf import load_model
from asyncflow.engines.inplace_weights import InPlaceWeights, kv_budget_bytes
from asyncflow.engines.sampling import sample


@dataclass
class _Seq:
    prompt_index: int
    sample_index: int
    prompt: list[int]
    max_new: int
    worst: int = 0  # tokens reserved for it while admitted (prompt + max_new - 1), 0 when not
    out_ids: list[int] = field(default_factory=list)
    out_logps: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)


@dataclass
class _Batch:
    """Sequences sharing one cache: row ``i`` is ``seqs[i]``'s, left-padded by ``pads[i]``
    columns (the padded layout; 0 in the others)."""

    seqs: list[_Seq]
    cache: Any  # a transformers Cache with len(seqs) rows
    pads: list[int]


@dataclass
class HFStats:
    """What the last ``generate`` (or a stream) did, in the native engine's terms."""

    num_steps: int = 0
    """Decode iterations (each runs one forward per batch: one in the padded layout)."""
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


class HFRolloutEngine(RolloutEngine):
    def __init__(self, cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0):
        set_cpu_threads(cfg.num_threads)
        self.cfg = cfg
        self.device = torch_device(cfg.device, cfg.device_index)
        self.model: Any = load_model(model_dir, dtype=torch_dtype(cfg.dtype), device=self.device)
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)
        accepted = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in accepted else "past_key_values"
        self._keep_last = "logits_to_keep" in accepted
        self._takes_mask = "attention_mask" in accepted and "position_ids" in accepted
        self.kv_fixed_bytes, self.kv_bytes_per_token, self.layout = self._measure_cache()
        self.budget_bytes = kv_budget_bytes(cfg, self.device)
        self._held: Counter[int] = Counter()  # worst-case lengths of the admitted sequences
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._version = version
        self.stats = HFStats()
        self.weights = InPlaceWeights(self.model, model_dir)

    @torch.inference_mode()
    def _forward(self, ids_BQ: torch.Tensor, cache: Any, pads: list[int] | None = None) -> tuple[torch.Tensor, Any]:
        """The model on ``ids_BQ`` after ``cache`` (None: from the start): the logits of
        the last position of each row [B, V], and the cache grown by ``ids_BQ``. With
        ``pads`` (the padded layout): row ``b``'s first ``pads[b]`` columns are masked and
        its positions count from the column after them."""
        kw: dict[str, Any] = {"input_ids": ids_BQ, "use_cache": True}
        if cache is not None:
            kw[self._cache_arg] = cache
        if pads is not None and any(pads):
            past = hf_cache.width(cache) if cache is not None else 0
            cols_K = torch.arange(past + ids_BQ.shape[1], device=self.device)
            pad_B1 = torch.tensor(pads, device=self.device).unsqueeze(1)
            kw["attention_mask"] = (cols_K >= pad_B1).long()
            kw["position_ids"] = cols_K[past:] - pad_B1
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

    def _measure_cache(self) -> tuple[int, int, hf_cache.Layout]:
        """(bytes a sequence's cache holds whatever its length, bytes per token, its
        layout), from the model's own cache of one token and of two."""
        token = 1 if getattr(self.model.config, "pad_token_id", None) == 0 else 0  # not padding (transformers warns)
        ids = torch.full((1, 1), token, dtype=torch.long, device=self.device)
        _, cache = self._forward(ids, None)
        one = hf_cache.cache_bytes(cache)
        _, cache = self._forward(ids, cache)
        per_token = max(hf_cache.cache_bytes(cache) - one, 0)
        return max(one - per_token, 0), per_token, hf_cache.layout(cache, self._takes_mask)

    def kv_bytes(self, num_tokens: int) -> int:
        """The bytes a sequence of ``num_tokens`` fed tokens holds."""
        return self.kv_fixed_bytes + self.kv_bytes_per_token * num_tokens

    def _held_bytes(self, held: Counter[int]) -> int:
        """The worst case of sequences of these worst-case lengths: padded ones each at the longest."""
        rows = sum(held.values())
        if self.layout == "padded":
            return rows * self.kv_bytes(max(held)) if rows else 0
        return sum(self.kv_bytes(length) * count for length, count in held.items())

    @property
    def reserved_bytes(self) -> int:
        """KV bytes the admitted sequences may come to hold (their worst case)."""
        return self._held_bytes(self._held)

    @property
    def version(self) -> int:
        return self._version

    def weights_digest(self) -> int:
        return self.weights.digest()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.weights.load(named_tensors)
        self._version = version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        stream = self.open_stream(params)
        done = run_stream(stream, prompts)
        self.stats = stream.stats
        return done

    def open_stream(self, params: SamplingParams, max_running: int | None = None) -> HFStream:
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        return HFStream(self, params, max_running)

    def _reserve(self, q: _Seq) -> bool:
        """Hold ``q``'s worst case; False (nothing held) when the budget cannot."""
        worst = len(q.prompt) + q.max_new - 1
        self._held[worst] += 1
        if self._held_bytes(self._held) > self.budget_bytes:
            self._held -= Counter({worst: 1})
            return False
        q.worst = worst
        return True

    def _release(self, q: _Seq) -> None:
        if q.worst:
            self._held -= Counter({q.worst: 1})
            q.worst = 0

    def _append(self, seqs: list[_Seq], logits_BV: torch.Tensor, params: SamplingParams) -> None:
        with phase("sample"):
            token_B, logp_B = sample(logits_BV, params, self.generator)
        for q, t, lp in zip(seqs, token_B.tolist(), logp_B.tolist()):
            q.out_ids.append(t)
            q.out_logps.append(lp)
            q.out_versions.append(self._version)

    def _prefill(self, seqs: list[_Seq], params: SamplingParams) -> list[_Batch]:
        """Run each distinct prompt of ``seqs`` once, unpadded (each sequence alone in the
        single layout), give its samples a copy of its cache, and sample every sequence's
        first token; returns a batch per prompt."""
        key = [q.prompt_index if self.layout != "single" else -1 - i for i, q in enumerate(seqs)]
        groups: dict[int, list[_Seq]] = {}
        for k, q in zip(key, seqs):
            groups.setdefault(k, []).append(q)
        batches, last = [], {}
        with phase("prefill_model"):
            for k, members in groups.items():
                ids = torch.tensor([members[0].prompt], dtype=torch.long, device=self.device)
                last[k], cache = self._forward(ids, None)
                if len(members) > 1:
                    cache.batch_repeat_interleave(len(members))
                batches.append(_Batch(members, cache, [0] * len(members)))
        self._append(seqs, torch.cat([last[k] for k in key]), params)
        return batches

    def _decode(self, batches: list[_Batch], params: SamplingParams) -> None:
        """One token for every running sequence: a forward per batch, one ``sample``."""
        logits = []
        with phase("decode_model"):
            for b in batches:
                ids = torch.tensor([[q.out_ids[-1]] for q in b.seqs], dtype=torch.long, device=self.device)
                logits_BV, b.cache = self._forward(ids, b.cache, b.pads if self.layout == "padded" else None)
                logits.append(logits_BV)
        self._append([q for b in batches for q in b.seqs], torch.cat(logits), params)

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
        self.batches: list[_Batch] = []
        self.stats = HFStats()
        self.num_prompts = 0

    @property
    def num_running(self) -> int:
        return sum(len(b.seqs) for b in self.batches)

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

    def _leave(self, batch: _Batch, done: list[_Seq]) -> None:
        """Sequences of ``batch`` that finished leave it (their rows of its cache, then the
        padding every row left still has)."""
        keep = [i for i, q in enumerate(batch.seqs) if not (q.out_ids[-1] in self.stop or len(q.out_ids) >= q.max_new)]
        if len(keep) == len(batch.seqs):
            return
        for i, q in enumerate(batch.seqs):
            if i not in keep:
                self.engine._release(q)
                done.append(q)
        if not keep:
            batch.seqs, batch.cache, batch.pads = [], None, []
            return
        batch.cache.batch_select_indices(torch.tensor(keep, device=self.engine.device))
        batch.seqs = [batch.seqs[i] for i in keep]
        common = min(batch.pads[i] for i in keep)
        hf_cache.crop_left(batch.cache, common)
        batch.pads = [batch.pads[i] - common for i in keep]

    def _join(self, new: list[_Batch]) -> None:
        """New batches run beside the others; in the padded layout their rows join the one batch."""
        for b in new:
            if self.engine.layout == "padded" and self.batches:
                into = self.batches[0]
                into.pads = hf_cache.merge(into.cache, into.pads, b.cache, b.pads)
                into.seqs += b.seqs
            else:
                self.batches.append(b)

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
            stats.prefill_tokens += sum(len(b.seqs[0].prompt) for b in new)
            for b in new:
                self._leave(b, done)
            self._join([b for b in new if b.seqs])
        running = self.num_running
        stats.max_running = max(stats.max_running, running)
        if self.batches:
            engine._decode(self.batches, self.params)
            stats.num_steps += 1
            stats.decode_rows += running
            for b in self.batches:
                self._leave(b, done)
            self.batches = [b for b in self.batches if b.seqs]
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
        for b in self.batches:
            for q in b.seqs:
                self.engine._release(q)
        self.batches = []
        self.waiting.clear()
