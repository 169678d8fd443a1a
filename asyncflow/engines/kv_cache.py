"""A paged KV cache with a hard memory budget.

The pool is allocated once: ``num_blocks`` blocks of ``block_tokens`` token slots,
for every layer, keys and values, sized so that the pool fits the budget:
``capacity_bytes = num_blocks * block_bytes <= budget_bytes``. A sequence holds a
list of blocks; a token's slot is ``block * block_tokens + offset``.

Invariants:
- The pool tensors never grow: memory used by the cache is ``capacity_bytes`` from
  construction on, never more, whatever is admitted.
- ``allocate`` hands out whole free blocks or nothing (returns None): the caller
  admits a sequence only when its reservation fits, so no sequence ever needs a
  block that is not there (no preemption, no out-of-memory mid-generation).
- ``used_bytes`` counts blocks held by sequences; ``peak_used_bytes`` is its running
  maximum, always ``<= capacity_bytes``. Blocks a ``PrefixCache`` keeps for later
  prompts (``cache``, engines/prefix_cache.py) are not counted: ``allocate`` takes them
  back when the free ones do not suffice.
"""

from __future__ import annotations

from typing import Protocol

import torch


class BlockKeeper(Protocol):
    """What the pool asks of the cache that keeps some of its blocks for later prompts
    (``PrefixCache``, engines/prefix_cache.py, which imports this module)."""

    @property
    def idle_blocks(self) -> int: ...

    def evict(self, num_blocks: int) -> int: ...


class KVBlockPool:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        budget_bytes: int,
        block_tokens: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        self.block_tokens = block_tokens
        self.bytes_per_token = 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
        self.block_bytes = self.bytes_per_token * block_tokens
        self.num_blocks = budget_bytes // self.block_bytes
        if self.num_blocks < 1:
            raise ValueError(
                f"kv_cache_bytes={budget_bytes} holds no block of {self.block_bytes} bytes "
                f"({block_tokens} tokens x {self.bytes_per_token} bytes/token); raise kv_cache_bytes"
            )
        self.budget_bytes = budget_bytes
        num_slots = self.num_blocks * block_tokens
        # k[layer]: [S, Hkv, D] with S = num_blocks * block_tokens token slots.
        self.k = torch.zeros((num_layers, num_slots, num_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self.peak_used_bytes = 0
        self.cache: BlockKeeper | None = None

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_tokens

    @property
    def used_bytes(self) -> int:
        idle = self.cache.idle_blocks if self.cache is not None else 0
        return (self.num_blocks - len(self._free) - idle) * self.block_bytes

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_tokens)

    def allocate(self, num_tokens: int) -> list[int] | None:
        """Blocks for ``num_tokens`` slots, or None when they do not fit now."""
        need = self.blocks_for(num_tokens)
        if need > len(self._free) and self.cache is not None and need <= len(self._free) + self.cache.idle_blocks:
            self.cache.evict(need - len(self._free))
        if need > len(self._free):
            return None
        blocks = [self._free.pop() for _ in range(need)]
        self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
        return blocks

    def free(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))

    def slots(self, blocks: list[int]) -> torch.Tensor:
        """Token slot ids [len(blocks) * block_tokens] of a block list, in order."""
        base = torch.tensor(blocks, dtype=torch.long).unsqueeze(1) * self.block_tokens
        return (base + torch.arange(self.block_tokens)).reshape(-1)
