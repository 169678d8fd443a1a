"""The native engine's prefix cache: KV blocks kept after their sequence finished, for a
later prompt that starts with the same tokens under the same weights.

A multi-turn conversation sends its whole history again each turn (an environment's
turn, a gateway session's next request): without the cache every turn runs its prefill
from the first token. With it, the full blocks a finished sequence wrote (its prompt and
all but its last sampled token) stay in the pool, keyed by their tokens and everything
before them, and a prompt that starts the same way takes them and runs the rest.

A block is keyed by ``(key of the block before it, its tokens)``: block i matches only
after the same i blocks, as its keys and values depend on every token before it. Keys
are exact (no hash collisions can serve another prompt's KV).

Invariants:
- A block is in exactly one of three states: free (the pool's free list), held (by one
  or more running sequences: ``refs > 0``), idle (in the cache, held by none). Only idle
  blocks are evicted, least recently used first, and only when the pool must allocate
  (``KVBlockPool.allocate`` calls ``evict``): the cache never makes an admission wait.
- A sequence writes only past its cached blocks (a match is block-aligned and leaves at
  least one prompt token to run), so a shared block is never written.
- New weights (``clear``, from ``load_weights``) drop every entry: KV computed under
  other weights is never served. A block held across the swap is freed when released.
  ``epoch`` counts the swaps; a sequence admitted in an earlier epoch (partial rollout
  across a swap) gives nothing to the cache.
- Cached KV equals recomputed KV up to the float rounding of a different batch shape,
  so a fixed seed repeats its samples only as far as vLLM's prefix caching does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from asyncflow.engines.kv_cache import KVBlockPool

_ROOT = -1
"""The key of the (absent) block before a sequence's first."""


@dataclass
class _Entry:
    key: tuple[int, tuple[int, ...]]
    id: int
    refs: int = 0


class PrefixCache:
    def __init__(self, pool: KVBlockPool):
        self.pool = pool
        self.block_tokens = pool.block_tokens
        self._by_key: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent id, tokens) -> block
        self._entry: dict[int, _Entry] = {}  # block -> its entry (held or idle; dropped ones are gone)
        self._detached: dict[int, int] = {}  # block -> refs: held across a clear, freed when released
        self._idle: OrderedDict[int, None] = OrderedDict()  # idle blocks, least recently used first
        self._next_id = 0
        self.epoch = 0
        self.hits = 0
        """Matches that served at least one block."""
        self.hit_tokens = 0
        """Prompt tokens served from the cache (not run)."""
        pool.cache = self

    @property
    def idle_blocks(self) -> int:
        return len(self._idle)

    @property
    def idle_bytes(self) -> int:
        return len(self._idle) * self.pool.block_bytes

    def match(self, prompt: Sequence[int]) -> list[int]:
        """Hold and return the cached blocks that start ``prompt``: as many full blocks as
        match, leaving at least its last token to run (it gives the first token's logits)."""
        bt = self.block_tokens
        blocks: list[int] = []
        parent = _ROOT
        for i in range((len(prompt) - 1) // bt):
            block = self._by_key.get((parent, tuple(prompt[i * bt : (i + 1) * bt])))
            if block is None:
                break
            entry = self._entry[block]
            entry.refs += 1
            self._idle.pop(block, None)
            blocks.append(block)
            parent = entry.id
        if blocks:
            self.hits += 1
            self.hit_tokens += len(blocks) * bt
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """A sequence lets go of blocks it took with ``match``."""
        for block in blocks:
            entry = self._entry.get(block)
            if entry is not None:
                entry.refs -= 1
                if entry.refs == 0:
                    self._idle[block] = None  # most recently used
                continue
            self._detached[block] -= 1
            if self._detached[block] == 0:
                del self._detached[block]
                self.pool.free([block])

    def finish(self, fed: Sequence[int], blocks: Sequence[int], held: int, epoch: int) -> None:
        """A sequence ends: ``fed`` are the tokens whose KV it wrote (its prompt and all but
        its last sampled token), ``blocks`` its blocks, the first ``held`` from ``match``.
        Its full blocks join the cache (a block whose key is cached already is freed: the
        other samples of a prompt), the rest are freed. Admitted in an earlier ``epoch``
        (under other weights), nothing of it is kept."""
        self.release(blocks[:held])
        own = list(blocks[held:])
        if epoch != self.epoch:
            self.pool.free(own)
            return
        bt = self.block_tokens
        full = len(fed) // bt
        parent = _ROOT
        for i in range(held):
            parent = self._entry[blocks[i]].id
        keep = full - held
        for j, block in enumerate(own[: max(keep, 0)]):
            i = held + j
            key = (parent, tuple(fed[i * bt : (i + 1) * bt]))
            cached = self._by_key.get(key)
            if cached is not None:
                self.pool.free([block])
                parent = self._entry[cached].id
                continue
            entry = _Entry(key, self._next_id)
            self._next_id += 1
            self._by_key[key] = block
            self._entry[block] = entry
            self._idle[block] = None
            parent = entry.id
        self.pool.free(own[max(keep, 0) :])

    def evict(self, num_blocks: int) -> int:
        """Free up to ``num_blocks`` idle blocks, least recently used first; returns how many.
        A block whose parent is evicted is no longer reachable; it goes in its turn."""
        freed: list[int] = []
        while self._idle and len(freed) < num_blocks:
            block, _ = self._idle.popitem(last=False)
            del self._by_key[self._entry.pop(block).key]
            freed.append(block)
        self.pool.free(freed)
        return len(freed)

    def clear(self) -> None:
        """New weights: drop every entry. Idle blocks are freed now, held ones when released."""
        for block, entry in self._entry.items():
            if entry.refs:
                self._detached[block] = entry.refs
        idle = list(self._idle)
        self._idle.clear()
        self._entry.clear()
        self._by_key.clear()
        self.pool.free(idle)
        self.epoch += 1
