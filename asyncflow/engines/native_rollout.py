"""The native rollout engine: batched PyTorch generation with a paged KV cache and
continuous batching. Default on cpu; also runs on cuda and npu.

Each sample of each prompt is a sequence. The scheduler loop:
1. admit waiting sequences, in order, while a batch row is free (``max_batch_size``),
   the KV pool can reserve ``prompt_len + max_new_tokens - 1`` token slots
   for them (the worst case: the last sampled token is never fed back), and, with
   ``max_prefill_tokens``, the padded prefill (distinct prompts x the longest) stays
   within it (the first prompt of a step is admitted whatever its length);
2. prefill the admitted prompts in one padded forward and sample their first token
   (each distinct prompt runs once; its other samples get a copy of its prompt KV;
   a token prefix common to all the distinct prompts, such as a chat template's system
   prompt, runs once too, and the others get a copy of its KV; a prompt whose samples
   were admitted earlier and still run copies its KV from one of them and runs only its
   last token: ``_prefill``);
3. decode one token for every running sequence in one forward (with ``compile``, a
   graph per bucket of rows and key positions: ``engines/compiled_decode.py``);
4. sequences that sampled a stop token or reached ``max_new_tokens`` leave: their
   blocks and row are freed at once, so waiting sequences join on the next iteration.
   With ``prefix_cache`` (the default) their full blocks stay in the pool, idle, for a
   later prompt that starts with the same tokens under the same weights: at admission
   (1) such a prompt takes them and its prefill runs only the rest
   (``engines/prefix_cache.py``; the next turn of a conversation, a group's samples
   admitted after others finished). Idle blocks give way to any admission.

Invariants:
- KV memory: the pool is allocated once within ``kv_cache_bytes`` (or the fraction of
  free device memory) and reservations are worst case, so generation never needs
  more than it holds; a sequence that could never fit fails before anything runs,
  saying which setting to change.
- Completions come back ordered by (prompt, sample), whatever the finishing order.
- Weights load in place between ``generate`` calls; ``version`` changes only there.
  A ``NativeStream`` (``open_stream``: partial rollout) also lets them load between
  two decode steps; each token records the version that sampled it.
- LoRA adapters (``engines/lora.py``'s wire form, or ``model_dir/adapter`` at start)
  are merged into the weights they adapt: the decode path stays the plain one (no
  per-token adapter cost), and the base weight is kept on the side the first time a
  layer is adapted, so each adapter is merged onto the base and replaces the one
  before (never accumulates). A full tensor for an adapted weight replaces its base
  and drops the adapter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asyncflow.core.phases import phase
from asyncflow.engines.base import Completion, RolloutEngine, RolloutStream, run_stream
from asyncflow.engines.compiled_decode import CompiledDecode, key_buckets, pad_keys, resolve_compile
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.device import set_cpu_threads, torch_device, torch_dtype
from asyncflow.engines.hf import load_model
from asyncflow.engines.inplace_weights import InPlaceWeights, kv_budget_bytes
from asyncflow.engines.kv_cache import KVBlockPool
from asyncflow.engines.native_model import NativeDecoder
from asyncflow.engines.prefix_cache import PrefixCache
from asyncflow.engines.sampling import sample

MIN_SHARED_PREFIX = 8
"""A prefix common to the distinct prompts of one prefill is run once when it is at
least this many tokens (shorter, the extra forward costs more than it saves)."""


@dataclass
class _Seq:
    prompt_index: int
    sample_index: int
    prompt: list[int]
    blocks: list[int] = field(default_factory=list)
    row: int = -1
    out_ids: list[int] = field(default_factory=list)
    out_logps: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)
    max_new: int = 0  # max_new_tokens of this sequence (its stream's, or the one its add gave)
    cached: int = 0  # leading prompt tokens whose KV came from the prefix cache (whole blocks, shared)
    epoch: int = 0  # the prefix cache's epoch (weights) at admission
    kv_version: int = -1  # the weights version its prompt's keys and values were computed under (-1: not yet)


@dataclass
class SchedulerStats:
    """What the last ``generate`` did (for tests and benchmarks)."""

    num_steps: int = 0
    """Decode forwards."""
    decode_rows: int = 0
    """Sequences decoded, summed over the decode forwards (``decode_rows / num_steps``:
    the mean decode batch)."""
    num_prefills: int = 0
    """Prefill forwards."""
    prefill_rows: int = 0
    """Sequences run through prefill forwards: one per distinct prompt admitted together
    (its other samples copy its prompt KV)."""
    prefill_tokens: int = 0
    """Prompt tokens run through prefill forwards: a distinct prompt's tokens once, less
    the prefix it shares with the others admitted with it (which runs once for all), less
    what the prefix cache served."""
    prefill_padded_tokens: int = 0
    """Token positions the prefill forwards computed: each forward's distinct prompts times
    its longest run (the padding included), plus a shared prefix's tokens once. One
    step's share stays within ``max_prefill_tokens`` when it admitted two prompts or more."""
    prefix_cached_tokens: int = 0
    """Prompt tokens of the distinct prompts whose KV the prefix cache served (not run)."""
    max_running: int = 0
    """Most sequences running at once."""
    admitted_while_running: int = 0
    """Sequences admitted while others were still decoding (continuous batching)."""
    peak_kv_used_bytes: int = 0
    """Most KV bytes reserved at once; never above ``kv_capacity_bytes``."""


class NativeRolloutEngine(RolloutEngine):
    def __init__(self, cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0):
        set_cpu_threads(cfg.num_threads)
        self.cfg = cfg
        self.device = torch_device(cfg.device, cfg.device_index)
        self.model = load_model(model_dir, dtype=torch_dtype(cfg.dtype), device=self.device)
        self.decoder = NativeDecoder(self.model)
        self.weights = InPlaceWeights(self.model, model_dir)
        compiled = resolve_compile(cfg.compile, self.device, self.decoder)
        self.pool = KVBlockPool(
            num_layers=self.decoder.num_layers,
            num_kv_heads=self.decoder.num_kv_heads,
            head_dim=self.decoder.head_dim,
            budget_bytes=kv_budget_bytes(cfg, self.device),
            block_tokens=cfg.kv_block_tokens,
            dtype=torch_dtype(cfg.dtype),
            device=self.device,
        )
        self.compiled = CompiledDecode(self.decoder, self.pool, cfg.max_batch_size) if compiled else None
        self.key_sizes = key_buckets(self.decoder, self.pool)
        """A decode step attends over a bucket of key positions, compiled or not: the same
        arithmetic, so compiling changes no number (engines/compiled_decode.py)."""
        self.prefix = PrefixCache(self.pool) if cfg.prefix_cache else None
        self.generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        self._version = version
        self.stats = SchedulerStats()

    @property
    def version(self) -> int:
        return self._version

    def weights_digest(self) -> int:
        return self.weights.digest()

    @property
    def kv_capacity_bytes(self) -> int:
        return self.pool.capacity_bytes

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        self.weights.load(named_tensors)
        self._version = version
        if self.prefix is not None:
            self.prefix.clear()  # keys and values computed under the old weights are not served again

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        stream = self.open_stream(params)
        done = run_stream(stream, prompts)
        self.stats = stream.stats
        return done

    def open_stream(self, params: SamplingParams, max_running: int | None = None) -> NativeStream:
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        return NativeStream(self, params, max_running)

    def _append(self, seqs: list[_Seq], logits_BV: torch.Tensor, params: SamplingParams) -> None:
        with phase("sample"):
            token_B, logp_B = sample(logits_BV, params, self.generator)
            # the step's one read back from the device: tokens (exact in float64) and log-probs together
            tokens, logps = torch.stack((token_B.double(), logp_B.double())).tolist()
        for q, t, lp in zip(seqs, tokens, logps):
            q.out_ids.append(int(t))
            q.out_logps.append(lp)
            q.out_versions.append(self._version)

    def _fill_slots(self, seqs: list[_Seq], slot_table_RK: torch.Tensor) -> None:
        """Each admitted sequence's row of the slot table: the token slots of its blocks,
        in order (one scatter for all of them; past its blocks the row is never read
        unmasked)."""
        n_S = np.fromiter((len(q.blocks) for q in seqs), dtype=np.int64, count=len(seqs))
        blocks_SN = np.zeros((len(seqs), int(n_S.max())), dtype=np.int64)
        blocks_SN[np.arange(blocks_SN.shape[1]) < n_S[:, None]] = np.concatenate([q.blocks for q in seqs])
        bt = self.pool.block_tokens
        slots_SK = (blocks_SN[:, :, None] * bt + np.arange(bt)).reshape(len(seqs), -1)
        rows = torch.tensor([q.row for q in seqs], device=self.device)
        slot_table_RK[rows, : slots_SK.shape[1]] = torch.from_numpy(slots_SK).to(self.device)

    def _prefill(
        self, seqs: list[_Seq], slot_table_RK: torch.Tensor, params: SamplingParams, running: Sequence[_Seq] = ()
    ) -> tuple[int, int, int]:
        """Prefill the admitted sequences and sample their first tokens. The samples of
        one prompt share it, so each distinct prompt is run once (its first sample, the
        leader, in admission order); the others get a copy of the leader's prompt KV and
        the leader's last logits. Every sequence still samples its own first token, from
        one ``sample`` call over all of them in admission order, as if each had been run.

        The leaders' common token prefix (at least ``MIN_SHARED_PREFIX`` tokens, and
        short of the shortest prompt by one, so that every leader runs a token) runs
        once, in the first leader's slots; its KV is copied into the other leaders'
        slots, and the forward runs only what follows it, at its true positions.

        A leader whose prompt a sequence in ``running`` holds, computed under the current
        weights (a group split over two admissions), copies that prompt's KV but its last
        token, and runs only that token (whose logits its samples draw from).
        Returns the rows, the prompt tokens the forwards ran, and the positions they
        computed (padding included)."""
        leader_of: dict[int, int] = {}  # prompt index -> position of its leader in seqs
        lead_S = [leader_of.setdefault(q.prompt_index, s) for s, q in enumerate(seqs)]
        leaders = [seqs[s] for s in leader_of.values()]
        rows = torch.tensor([q.row for q in leaders], device=self.device)
        holders = {q.prompt_index: q for q in running if q.kv_version == self._version}
        copied = self._copy_running_prompts(leaders, holders, slot_table_RK)
        cached = any(q.cached for q in leaders) or bool(copied)
        shared = 0 if cached else self._run_shared_prefix(leaders, rows, slot_table_RK)
        # each leader runs its prompt from its first token not served: a running sample's copy, the cache's or the shared prefix's end
        start_B = np.fromiter(
            (copied.get(b) or q.cached or shared for b, q in enumerate(leaders)), dtype=np.int64, count=len(leaders)
        )
        n_B = np.fromiter((len(q.prompt) for q in leaders), dtype=np.int64, count=len(leaders)) - start_B
        Q = int(n_B.max())
        col_Q = np.arange(Q)
        valid = col_Q < n_B[:, None]
        ids = np.zeros((len(leaders), Q), dtype=np.int64)
        ids[valid] = np.concatenate([q.prompt[int(a) :] for q, a in zip(leaders, start_B)])
        ids_BQ = torch.from_numpy(ids)
        # padding keeps the first new position: a valid index, masked out of writes
        pos_BQ = torch.from_numpy(np.where(valid, col_Q, 0) + start_B[:, None])
        valid_BQ = torch.from_numpy(valid)
        last_B = torch.from_numpy(n_B - 1).to(self.device)
        with phase("prefill_model"):
            logits_BV = self.decoder.step(
                self.pool,
                ids_BQ.to(self.device),
                pos_BQ.to(self.device),
                valid_BQ.to(self.device),
                slot_table_RK[rows, : int((start_B + n_B).max())],
                last_B,
            )
        if len(leaders) < len(seqs):
            with phase("prefill_share"):
                self._share_prompt_kv(seqs, lead_S, slot_table_RK)
                index_of = {s: b for b, s in enumerate(leader_of.values())}
                logits_BV = logits_BV[torch.tensor([index_of[s] for s in lead_S], device=self.device)]
        self._append(seqs, logits_BV, params)
        for q in seqs:
            q.kv_version = self._version
        return len(leaders), shared + int(n_B.sum()), shared + len(leaders) * Q

    def _admit(self, q: _Seq) -> bool:
        """Reserve ``q``'s KV blocks (its worst case), the cached ones first; False when they
        do not fit now (nothing is held then)."""
        prefix = self.prefix
        hit = prefix.match(q.prompt) if prefix is not None else []
        blocks = self.pool.allocate(len(q.prompt) + q.max_new - 1 - len(hit) * self.pool.block_tokens)
        if blocks is None:
            if prefix is not None:
                prefix.release(hit)
            return False
        q.blocks = hit + blocks
        q.cached = len(hit) * self.pool.block_tokens
        q.epoch = prefix.epoch if prefix is not None else 0
        return True

    def _release(self, q: _Seq, finished: bool) -> None:
        """``q`` lets go of its blocks: a finished sequence gives its full blocks to the
        prefix cache; one cut short (an error, a closed stream) only returns what it took."""
        if self.prefix is None:
            self.pool.free(q.blocks)
        else:
            fed = q.prompt + q.out_ids[:-1] if finished else []
            held = q.cached // self.pool.block_tokens
            self.prefix.finish(fed, q.blocks, held, q.epoch)
        q.blocks = []

    def _run_shared_prefix(self, leaders: list[_Seq], rows: torch.Tensor, slot_table_RK: torch.Tensor) -> int:
        """Run the leaders' common prefix once and copy its KV to every leader;
        returns its length (0: too short to share, nothing run)."""
        if len(leaders) < 2:
            return 0
        limit = min(len(q.prompt) for q in leaders) - 1
        first = leaders[0].prompt
        shared = 0
        while shared < limit and all(q.prompt[shared] == first[shared] for q in leaders):
            shared += 1
        if shared < MIN_SHARED_PREFIX:
            return 0
        with phase("prefill_prefix"):
            self.decoder.step(
                self.pool,
                torch.tensor([first[:shared]], device=self.device),
                torch.arange(shared, device=self.device).unsqueeze(0),
                None,
                slot_table_RK[rows[:1], :shared],
                torch.tensor([shared - 1], device=self.device),
            )
            src = slot_table_RK[rows[:1], :shared].reshape(-1)
            dst = slot_table_RK[rows[1:], :shared].reshape(-1)
            self.pool.k[:, dst] = self.pool.k[:, src.repeat(len(leaders) - 1)]
            self.pool.v[:, dst] = self.pool.v[:, src.repeat(len(leaders) - 1)]
        return shared

    def _copy_running_prompts(self, leaders: list[_Seq], holders: dict[int, _Seq], slot_table_RK: torch.Tensor) -> dict[int, int]:
        """Copy into each leader whose prompt a running sequence holds that prompt's KV but
        its last token, past what the prefix cache served (one gather and one scatter for
        all); returns {leader's position in ``leaders``: tokens now in place}."""
        copied: dict[int, int] = {}
        src, dst = [], []
        for b, q in enumerate(leaders):
            holder = holders.get(q.prompt_index)
            if holder is None or len(q.prompt) - 1 <= q.cached:
                continue
            n = len(q.prompt) - 1
            src.append(slot_table_RK[holder.row, q.cached : n])
            dst.append(slot_table_RK[q.row, q.cached : n])
            copied[b] = n
        if copied:
            src_slots, dst_slots = torch.cat(src), torch.cat(dst)
            self.pool.k[:, dst_slots] = self.pool.k[:, src_slots]
            self.pool.v[:, dst_slots] = self.pool.v[:, src_slots]
        return copied

    def _share_prompt_kv(self, seqs: list[_Seq], lead_S: list[int], slot_table_RK: torch.Tensor) -> None:
        """Copy each leader's prompt KV (every layer, keys and values) into the slots of
        the other samples of its prompt: one gather and one scatter for all of them."""
        followers = [s for s, lead in enumerate(lead_S) if lead != s]
        n = [len(seqs[s].prompt) for s in followers]
        src_rows = torch.tensor([seqs[lead_S[s]].row for s in followers], device=self.device)
        dst_rows = torch.tensor([seqs[s].row for s in followers], device=self.device)
        Q = max(n)
        col_Q = torch.arange(Q, device=self.device)
        # a follower's cached blocks are its leader's already (the same prompt matched them): not written
        start_F1 = torch.tensor([seqs[s].cached for s in followers], device=self.device).unsqueeze(1)
        keep_FQ = (col_Q < torch.tensor(n, device=self.device).unsqueeze(1)) & (col_Q >= start_F1)
        src = slot_table_RK[src_rows, :Q][keep_FQ]
        dst = slot_table_RK[dst_rows, :Q][keep_FQ]
        self.pool.k[:, dst] = self.pool.k[:, src]
        self.pool.v[:, dst] = self.pool.v[:, src]

    def _decode(self, seqs: list[_Seq], slot_table_RK: torch.Tensor, params: SamplingParams) -> None:
        # The last sampled token of each sequence is fed at position len(prompt) + len(out) - 1.
        pos = [len(q.prompt) + len(q.out_ids) - 1 for q in seqs]
        # the step's inputs in one copy to the device: ids, positions, rows
        host_3B = torch.tensor([[q.out_ids[-1] for q in seqs], pos, [q.row for q in seqs]])
        ids_B, pos_B, rows = host_3B.to(self.device)
        ids_B1, pos_B1 = ids_B.unsqueeze(1), pos_B.unsqueeze(1)
        table_BK = pad_keys(slot_table_RK[rows], max(pos) + 1, self.key_sizes)
        with phase("decode_model"):
            if self.compiled is not None:
                logits_BV = self.compiled.step(ids_B1, pos_B1, table_BK)
            else:
                last_B = torch.zeros(len(seqs), dtype=torch.long, device=self.device)
                logits_BV = self.decoder.step(self.pool, ids_B1, pos_B1, None, table_BK, last_B)
        self._append(seqs, logits_BV, params)

    def close(self) -> None:
        self.compiled = None  # it holds the decoder and the pool too
        del self.decoder, self.model, self.pool


class NativeStream(RolloutStream):
    """The scheduler loop of ``NativeRolloutEngine`` (module docstring), one iteration
    per ``step``: prompts join with ``add`` at any time and finished sequences leave
    from ``step``. ``generate`` is one stream run to the end.

    Partial rollout: between two steps the engine's weights may be replaced
    (``load_weights``). A running sequence keeps its tokens and the KV cache computed
    under the weights it had: the next token is sampled from the new weights attending
    to the old keys and values, as AReaL does (docs/algorithms.md says why). Each token
    records the version that sampled it."""

    def __init__(self, engine: NativeRolloutEngine, params: SamplingParams, max_running: int | None = None):
        self.engine = engine
        self.params = params
        self.stop = set(params.stop_token_ids)
        self.max_rows = min(engine.cfg.max_batch_size, max_running or engine.cfg.max_batch_size)
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.admitted: list[_Seq] = []
        self.free_rows = list(range(self.max_rows - 1, -1, -1))
        self.slot_table_RK = torch.zeros((self.max_rows, 0), dtype=torch.long, device=engine.device)
        self.stats = SchedulerStats()
        self.num_prompts = 0
        engine.pool.peak_used_bytes = engine.pool.used_bytes

    @property
    def num_active(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_free(self) -> int:
        return max(len(self.free_rows) - len(self.waiting), 0)

    def add(self, prompts: Sequence[Sequence[int]], n: int | None = None, max_new_tokens: int | None = None) -> list[int]:
        engine, params = self.engine, self.params
        pool = engine.pool
        n = params.n if n is None else n
        max_new = params.max_new_tokens if max_new_tokens is None else max_new_tokens
        if n < 1 or max_new < 1:
            raise ValueError(f"n = {n} and max_new_tokens = {max_new} must be >= 1")
        for p, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompt {p} is empty; a prompt needs at least one token")
            need = len(prompt) + max_new - 1
            if need > engine.decoder.max_positions:
                raise ValueError(
                    f"prompt {p}: {len(prompt)} tokens + max_new_tokens={max_new} exceeds the model's "
                    f"max_position_embeddings={engine.decoder.max_positions}; lower max_new_tokens"
                )
            if pool.blocks_for(need) > pool.num_blocks:
                raise ValueError(
                    f"prompt {p} needs {need} KV tokens ({pool.blocks_for(need) * pool.block_bytes} bytes) but the "
                    f"cache holds {pool.capacity_tokens} tokens ({pool.capacity_bytes} bytes); raise kv_cache_bytes "
                    "or lower max_new_tokens"
                )
        if prompts:  # the slot table is wide enough for the longest sequence (it only grows)
            width = pool.blocks_for(max(len(p) for p in prompts) + max_new) * pool.block_tokens
            if width > self.slot_table_RK.shape[1]:
                grown = torch.zeros((self.max_rows, width), dtype=torch.long, device=engine.device)
                grown[:, : self.slot_table_RK.shape[1]] = self.slot_table_RK
                self.slot_table_RK = grown
        indices = []
        for prompt in prompts:
            for s in range(n):
                self.waiting.append(_Seq(self.num_prompts, s, list(prompt), max_new=max_new))
            indices.append(self.num_prompts)
            self.num_prompts += 1
        return indices

    def _finish_check(self, seqs: list[_Seq], done: list[_Seq]) -> list[_Seq]:
        still = []
        for q in seqs:
            if q.out_ids[-1] in self.stop or len(q.out_ids) >= q.max_new:
                self.engine._release(q, finished=True)
                self.free_rows.append(q.row)
                done.append(q)
            else:
                still.append(q)
        return still

    def step(self) -> list[Completion]:
        engine, params, stats = self.engine, self.params, self.stats
        done: list[_Seq] = []
        admitted: list[_Seq] = []
        self.admitted = admitted
        budget = engine.cfg.max_prefill_tokens
        longest: dict[int, int] = {}  # prompt index -> its length, of this step's distinct prompts
        while self.waiting and self.free_rows:
            q = self.waiting[0]
            if budget and longest and q.prompt_index not in longest:
                padded = (len(longest) + 1) * max(len(q.prompt), *longest.values())
                if padded > budget:  # the prefill forward pads its prompts to the longest
                    break
            if not engine._admit(q):
                break
            longest[q.prompt_index] = len(q.prompt)
            self.waiting.popleft()
            q.row = self.free_rows.pop()
            admitted.append(q)
        if admitted:
            engine._fill_slots(admitted, self.slot_table_RK)
            if self.running:
                stats.admitted_while_running += len(admitted)
            rows, tokens, padded = engine._prefill(admitted, self.slot_table_RK, params, self.running)
            stats.prefill_rows += rows
            stats.prefill_tokens += tokens
            stats.prefill_padded_tokens += padded
            stats.prefix_cached_tokens += sum({q.prompt_index: q.cached for q in admitted}.values())
            stats.num_prefills += 1
            self.running.extend(self._finish_check(admitted, done))
        self.admitted = []
        stats.max_running = max(stats.max_running, len(self.running))
        if self.running:
            engine._decode(self.running, self.slot_table_RK, params)
            stats.num_steps += 1
            stats.decode_rows += len(self.running)
            self.running = self._finish_check(self.running, done)
        stats.peak_kv_used_bytes = engine.pool.peak_used_bytes
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
        # An error mid-generation must not leak reservations into the next call.
        for q in self.running + self.admitted:
            if q.blocks:
                self.engine._release(q, finished=False)
        self.running, self.admitted = [], []
        self.waiting.clear()
