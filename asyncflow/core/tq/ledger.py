"""The queue manager's ledger: index allocation, the capacity bound, and when a row
may be freed. Pure logic, no sockets, no threads.

- Indices are global, increasing, never reused; a group's rows are contiguous.
- A row is *live* from allocation until every registered task acked it (or the
  producer released it); then it is freed. At most ``capacity_rows`` rows are live.
- Allocation requests that do not fit wait in arrival order (no request overtakes
  an older one, so a large one is never starved); nothing is ever dropped.
- A request may ask for ``headroom`` rows to stay free after it (it fits only while
  live + its rows + headroom <= capacity): a producer keeps room for allocations
  that must never wait behind its own (dynamic sampling's refill rounds).
- Row ``i`` lives on shard ``(i // stripe_rows) % num_shards``: a small put goes to
  one shard, a large one is spread over all of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from asyncflow.core.protocol import RowMeta


def shard_of(index: int, stripe_rows: int, num_shards: int) -> int:
    return (index // stripe_rows) % num_shards


class LedgerSnapshot(msgspec.Struct, kw_only=True):
    tasks: list[str]
    capacity_rows: int
    next_index: int
    next_group_id: int
    live: dict[int, int]  # index -> bit mask of tasks that acked it
    num_freed: int


class Ledger:
    def __init__(self, tasks: Sequence[str], capacity_rows: int):
        if not tasks:
            raise ValueError("a queue needs at least one consuming task (e.g. tasks=['train'])")
        if capacity_rows < 1:
            raise ValueError(f"capacity_rows must be >= 1, got {capacity_rows}")
        self.tasks = list(tasks)
        self._task_bit = {t: 1 << k for k, t in enumerate(self.tasks)}
        self._all = (1 << len(self.tasks)) - 1
        self.capacity_rows = capacity_rows
        self.next_index = 0
        self.next_group_id = 0
        self.live: dict[int, int] = {}
        self.num_freed = 0
        self._waiting: deque[tuple[Any, int, int, int, int]] = deque()  # (token, groups, size, step, headroom)

    # -- allocation -------------------------------------------------------------------

    def try_allocate(self, num_groups: int, group_size: int, step: int = -1, headroom: int = 0) -> list[RowMeta] | None:
        """Metadata of the new rows, or None if they do not fit now (then wait)."""
        num_rows = self._check(num_groups, group_size, headroom)
        if self._waiting or len(self.live) + num_rows + headroom > self.capacity_rows:
            return None
        return self._allocate(num_groups, group_size, step)

    def allocate_extra(self, max_groups: int, group_size: int, step: int = -1, headroom: int = 0) -> list[RowMeta]:
        """Up to ``max_groups`` more groups, only as many as fit now (leaving ``headroom``
        rows free) and only while nobody waits (a client's reserve for its next allocations)."""
        if self._waiting or max_groups < 1:
            return []
        num_groups = min(max_groups, (self.capacity_rows - headroom - len(self.live)) // group_size)
        return self._allocate(num_groups, group_size, step) if num_groups > 0 else []

    def wait(self, token: Any, num_groups: int, group_size: int, step: int = -1, headroom: int = 0) -> None:
        self._check(num_groups, group_size, headroom)
        self._waiting.append((token, num_groups, group_size, step, headroom))

    def cancel(self, token: Any) -> bool:
        for k, item in enumerate(self._waiting):
            if item[0] is token:
                del self._waiting[k]
                return True
        return False

    def serve_waiting(self) -> list[tuple[Any, list[RowMeta]]]:
        """Allocations that fit now, oldest first (call after rows are freed)."""
        served = []
        while self._waiting:
            token, num_groups, group_size, step, headroom = self._waiting[0]
            if len(self.live) + num_groups * group_size + headroom > self.capacity_rows:
                break
            self._waiting.popleft()
            served.append((token, self._allocate(num_groups, group_size, step)))
        return served

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def _check(self, num_groups: int, group_size: int, headroom: int = 0) -> int:
        if num_groups < 1 or group_size < 1:
            raise ValueError(f"allocate at least one group of at least one row, got {num_groups} x {group_size}")
        if headroom < 0:
            raise ValueError(f"headroom must be >= 0 rows, got {headroom}")
        num_rows = num_groups * group_size
        if num_rows + headroom > self.capacity_rows:
            raise ValueError(
                f"cannot allocate {num_rows} rows ({num_groups} groups x {group_size})"
                + (f" with {headroom} rows of headroom" if headroom else "")
                + f" in a queue of capacity_rows={self.capacity_rows}; allocate fewer groups at a time or raise capacity_rows"
            )
        return num_rows

    def _allocate(self, num_groups: int, group_size: int, step: int) -> list[RowMeta]:
        metas = []
        index = self.next_index
        for g in range(num_groups):
            group_id = self.next_group_id + g
            for _ in range(group_size):
                metas.append(RowMeta(index=index, group_id=group_id, group_size=group_size, step=step))
                self.live[index] = 0
                index += 1
        self.next_index = index
        self.next_group_id += num_groups
        return metas

    # -- freeing -----------------------------------------------------------------------

    def acked(self, task: str, indices: Iterable[int]) -> list[int]:
        """Record that ``task`` is done with ``indices``; returns the rows now free."""
        bit = self._task_bit.get(task)
        if bit is None:
            raise ValueError(f"unknown task {task!r}; this queue's tasks are {self.tasks}")
        freed = []
        live = self.live
        for index in indices:
            mask = live.get(index)
            if mask is None:
                continue
            mask |= bit
            if mask == self._all:
                del live[index]
                freed.append(index)
            else:
                live[index] = mask
        self.num_freed += len(freed)
        return freed

    def release(self, indices: Iterable[int]) -> list[int]:
        """Free rows outright (a producer gives them back, or they vanished)."""
        freed = [i for i in indices if self.live.pop(i, None) is not None]
        self.num_freed += len(freed)
        return freed

    # -- save/load -----------------------------------------------------------------------

    def snapshot(self) -> LedgerSnapshot:
        return LedgerSnapshot(
            tasks=self.tasks,
            capacity_rows=self.capacity_rows,
            next_index=self.next_index,
            next_group_id=self.next_group_id,
            live=dict(self.live),
            num_freed=self.num_freed,
        )

    @classmethod
    def restore(cls, snap: LedgerSnapshot) -> Ledger:
        ledger = cls(snap.tasks, snap.capacity_rows)
        ledger.next_index = snap.next_index
        ledger.next_group_id = snap.next_group_id
        ledger.live = dict(snap.live)
        ledger.num_freed = snap.num_freed
        return ledger
