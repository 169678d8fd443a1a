"""Split a batch into data-parallel parts of balanced total sequence length.

Greedy longest-first with a count bound: units (rows, or whole groups) are taken
longest first and each goes to the part with the least total length that still has
room. Every part gets the same number of units (the count must divide evenly), so
every dp rank runs the same number of micro-batches and none waits on a long tail.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def balanced_parts(lengths: Sequence[int], num_parts: int) -> list[list[int]]:
    """Positions of ``lengths`` split into ``num_parts`` lists of equal size whose
    sums of lengths are balanced; each list is sorted ascending."""
    num_units = len(lengths)
    if num_parts < 1:
        raise ValueError(f"dp_size must be >= 1, got {num_parts}")
    if num_units % num_parts:
        raise ValueError(
            f"cannot split {num_units} units into {num_parts} equal dp parts; "
            f"make batch_size (in rows, or in groups with policy 'group') a multiple of dp_size"
        )
    per_part = num_units // num_parts
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    heap = [(0, p) for p in range(num_parts)]  # (total length, part) of parts with room
    for pos in sorted(range(num_units), key=lambda k: -lengths[k]):
        total, p = heapq.heappop(heap)
        parts[p].append(pos)
        if len(parts[p]) < per_part:
            heapq.heappush(heap, (total + lengths[pos], p))
    for part in parts:
        part.sort()
    return parts
