"""The native engine's decode step compiled by ``torch.compile`` (``rollout.engine.compile``):
static shapes, one graph per key, on cuda captured as a CUDA graph (``reduce-overhead``).

Shape legend: B real rows this step, P rows of its bucket (B <= P), K key positions of
its bucket (every fed position < K), V vocabulary.

A step's rows are padded to a rows bucket and its key positions to a keys bucket
(``buckets``: powers of two from a floor, then the limit). The integers a graph bakes in
are P and K, and nothing else varies between its calls: the pool, the parameters and
the rotary tables are the same tensors at every call (their addresses are static, so
CUDA graphs read them in place), and the ids, positions and slot table are fresh
tensors of the key's shapes. ``GraphKey(P, K)`` is therefore the whole graph key.

The graph reads the KV pool and writes nothing: it returns each layer's new keys and
values, which one scatter per pool puts in their slots after it (``NativeDecoder.forward``
with ``new_kv``). A graph that wrote into the pool copied the whole pool at every call on
the CPU (a mutated graph input is functionalised: 1 s a step on a 4-layer model, against
8 ms reading only; docs/log/performance.md).

Invariants:
- A key compiles once, on its first call: ``recompiles`` counts the graphs dynamo built
  during a later call of a key (a guard other than the key failed), and stays 0, which
  the tests check. (A key's first call may build none: dynamo keeps graphs per function,
  so a second engine of the same shapes in one process reuses the first one's.)
- Padded rows feed token 0 at position 0 and read slot 0; their keys and values are
  not written. A real row attends only its own keys 0..pos (its padded key positions are
  masked).
- Compiled and eager compute the same numbers (the tests hold them to 1e-5 in float32
  log-probs with the same greedy tokens, SmolLM2-135M's 30 layers included; measured on
  its real weights: equal to the bit). Two things made them differ, 3e-5 over 30 layers,
  each alone most of it: the CPU attention kernel sums a longer masked row in another
  order, so the eager step too attends over the keys bucket (``key_buckets``, ``pad_keys``:
  the engine's eager decode pads its slot table as the graph does); and inductor fuses
  RMSNorm's sum of squares into a loop of its own order, so the graph calls eager's
  kernel (``native_model._eager_rms_norm``, a custom op). Padding rows changes nothing.
- New weights are copied into the same parameters (engines/inplace_weights.py), so a
  graph computes with the weights of the last sync: no recompile, no re-capture.
- Prefill stays eager (its shapes vary with the prompts); so does sampling.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import torch

from asyncflow.engines.kv_cache import KVBlockPool
from asyncflow.engines.native_model import NativeDecoder

MIN_ROWS = 8
"""The smallest rows bucket: a decode step's matmuls read every weight once whatever
the rows, so 1 to 8 rows cost about the same, and fewer buckets compile fewer graphs."""

MIN_KEYS = 64
"""The smallest keys bucket (attention over K keys is a small part of a step)."""

Compile = Literal["auto", "on", "off"]


def buckets(limit: int, smallest: int) -> tuple[int, ...]:
    """Powers of two from ``smallest`` below ``limit``, then ``limit``: every size from 1
    to ``limit`` falls in exactly one (the first at least as large)."""
    sizes = []
    size = max(1, min(smallest, limit))
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


def bucket_of(n: int, sizes: tuple[int, ...]) -> int:
    for size in sizes:
        if n <= size:
            return size
    raise ValueError(f"{n} is past the largest bucket {sizes[-1]}")


def key_buckets(decoder: NativeDecoder, pool: KVBlockPool) -> tuple[int, ...]:
    """The keys buckets of a decode step: eager and compiled alike attend over a bucket's
    key positions (module docstring)."""
    return buckets(min(decoder.max_positions, pool.capacity_tokens), MIN_KEYS)


def pad_keys(slot_table_BK: torch.Tensor, num_keys: int, sizes: tuple[int, ...]) -> torch.Tensor:
    """The first ``num_keys`` columns of ``slot_table_BK`` padded or cut to their bucket
    (padding: slot 0, beyond every row's position, so masked)."""
    K = bucket_of(num_keys, sizes)
    if slot_table_BK.shape[1] >= K:
        return slot_table_BK[:, :K]
    return torch.nn.functional.pad(slot_table_BK, (0, K - slot_table_BK.shape[1]))


def why_not_compiled(decoder: NativeDecoder) -> str:
    """Why this model's decode step cannot be one graph ("" when it can)."""
    if any(layer.moe for layer in decoder.layers):
        return "its mixture-of-experts layers route tokens by data (one matmul per chosen expert), which one graph cannot hold"
    return ""


AUTO_DEVICES: frozenset[str] = frozenset()
"""Device types where ``compile = "auto"`` compiles: where the compiled step measured
faster than eager by enough to repay its compiles (docs/performance.md). None yet: on the
CPU it measured 1.06x to 1.10x for a minute or so of compiling per graph; cuda is not
measured yet (``scripts/cuda_check.sh unit`` measures it: add "cuda" here if it pays)."""


def resolve_compile(setting: Compile, device: torch.device, decoder: NativeDecoder) -> bool:
    """Whether the decode step is compiled. auto: on the ``AUTO_DEVICES`` only, and off
    wherever the model cannot be one graph. on: compiled, or an error saying why not."""
    reason = why_not_compiled(decoder)
    if setting == "on" and reason:
        raise ValueError(f"rollout.engine.compile = 'on': this model's decode step cannot be compiled: {reason}; set it to 'off'")
    if setting == "auto":
        return device.type in AUTO_DEVICES and not reason
    return setting == "on"


@dataclass(frozen=True)
class GraphKey:
    """Every integer a decode graph bakes in."""

    rows: int
    keys: int


class CompiledDecode:
    """``decoder``'s decode step (one new token per row) compiled per ``GraphKey``."""

    def __init__(self, decoder: NativeDecoder, pool: KVBlockPool, max_rows: int):
        self.decoder, self.pool = decoder, pool
        self.device = decoder.device
        self.row_sizes = buckets(max_rows, MIN_ROWS)
        self.key_sizes = key_buckets(decoder, pool)
        self.compile_s: dict[GraphKey, float] = {}
        """Seconds of each key's first call (its compile, and on cuda its capture)."""
        self.num_graphs = 0
        """Graphs dynamo built during this object's calls."""
        self.recompiles = 0
        """Graphs built during a call of a key already compiled (module docstring)."""
        cuda = self.device.type == "cuda"
        for t in (pool.k, pool.v, *decoder.cos_PR.values(), *decoder.sin_PR.values()):
            torch._dynamo.mark_static_address(t)
        # one graph per key, all of one function: dynamo's limit on a function's graphs must hold them all
        limit = len(self.row_sizes) * len(self.key_sizes)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
        self._fn: Any = torch.compile(self._forward, dynamic=False, fullgraph=True, mode="reduce-overhead" if cuda else None)

    def key(self, num_rows: int, num_keys: int) -> GraphKey:
        return GraphKey(bucket_of(num_rows, self.row_sizes), bucket_of(num_keys, self.key_sizes))

    def _forward(
        self, ids_P1: torch.Tensor, pos_P1: torch.Tensor, slot_table_PK: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits [P, V] and every layer's new keys and values [L, P, Hkv, D]."""
        last_P = torch.zeros(ids_P1.shape[0], dtype=torch.long, device=ids_P1.device)
        new_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        logits_PV = self.decoder.forward(self.pool, ids_P1, pos_P1, None, slot_table_PK, last_P, new_kv)
        return logits_PV, torch.stack([k[:, 0] for k, _ in new_kv]), torch.stack([v[:, 0] for _, v in new_kv])

    @torch.inference_mode()
    def step(self, ids_B1: torch.Tensor, pos_B1: torch.Tensor, slot_table_BK: torch.Tensor) -> torch.Tensor:
        """Float32 logits [B, V] of each row's next token, as ``decoder.step`` gives them
        for the same arguments padded to the same keys bucket (``slot_table_BK`` at least
        max position + 1 wide; its width picks the keys bucket, so no value is read back
        from the device)."""
        from torch._dynamo.utils import counters

        B = ids_B1.shape[0]
        key = self.key(B, slot_table_BK.shape[1])
        P, K = key.rows, key.keys
        width = min(K, slot_table_BK.shape[1])
        ids_P1 = torch.zeros((P, 1), dtype=torch.long, device=self.device)
        pos_P1 = torch.zeros((P, 1), dtype=torch.long, device=self.device)
        slot_table_PK = torch.zeros((P, K), dtype=torch.long, device=self.device)
        ids_P1[:B], pos_P1[:B] = ids_B1, pos_B1
        slot_table_PK[:B, :width] = slot_table_BK[:, :width]
        first = key not in self.compile_s
        graphs = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        logits_PV, k_LPHD, v_LPHD = self._fn(ids_P1, pos_P1, slot_table_PK)
        slot_B = torch.gather(slot_table_BK, 1, pos_B1).squeeze(1)
        self.pool.k[:, slot_B] = k_LPHD[:, :B]
        self.pool.v[:, slot_B] = v_LPHD[:, :B]
        built = counters["stats"]["unique_graphs"] - graphs
        self.num_graphs += built
        self.recompiles += 0 if first else built
        if first:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.compile_s[key] = time.perf_counter() - start
        # a CUDA graph's output is overwritten by its next replay: the caller keeps a copy
        return logits_PV[:B].clone() if self.device.type == "cuda" else logits_PV[:B]
