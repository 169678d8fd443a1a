"""Small rows carried with their metadata: the controller's copy of rows that fit in a
few kilobytes, so a consumer gets them in the GetBatch reply instead of reading
them from the shard (one round trip less on the latency path of small puts).

A shard adds the cells of a put to its RowsWritten notice when the put is at most
``INLINE_MAX_BYTES``; the controller keeps those of the columns its task has asked
for (``InlineCache.wanted``: a task's first GetBatch still reads from the shard),
for rows its task has not finished, until its task acks, discards or forgets them,
and answers a GetBatch with the requested columns inline when it holds every one
of them for every selected row. Anything
else (a big put, a cache over its budget, a column written again by a big put) is
read from the shard as before: the cache is an optimisation, never the truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from asyncflow.core import protocol

INLINE_MAX_BYTES = 16 << 10
"""Default largest put (all its cells) whose bytes a shard sends along with
RowsWritten (``[queue] inline_max_bytes``; 0 turns it off)."""


class InlineCache:
    """index -> column -> cell, under a byte budget."""

    def __init__(self, max_bytes: int = 64 << 20):
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._rows: dict[int, dict[str, protocol.Tensor]] = {}
        self.wanted: set[str] = set()  # columns the task has asked for: only those are kept

    def on_written(
        self,
        indices: Sequence[int],
        columns: Iterable[str],
        inline: dict[str, list[protocol.Tensor]],
        skip: Callable[[int], bool] | None = None,
    ) -> None:
        """Rows ``indices`` got ``columns``; keep the cells sent inline (of ``wanted``
        columns, rows not ``skip``-ped), forget older cells of columns written without
        them (they were overwritten by a big put)."""
        rows = self._rows
        for name in columns:
            cells = inline.get(name) if name in self.wanted else None
            for k, index in enumerate(indices):
                entry = rows.get(index)
                old = entry.pop(name, None) if entry is not None else None
                if old is not None:
                    self.num_bytes -= len(old.data)
                if cells is None or (skip is not None and skip(index)):
                    continue
                cell = cells[k]
                size = len(cell.data)
                if self.num_bytes + size > self.max_bytes:
                    continue  # over budget: this cell is read from the shard
                # a copy: the received cell is a view into its whole message
                kept = protocol.Tensor(dtype=cell.dtype, shape=cell.shape, data=memoryview(bytes(cell.data)))
                rows.setdefault(index, {})[name] = kept
                self.num_bytes += size

    def take(self, indices: Sequence[int], columns: Sequence[str]) -> dict[str, list[protocol.Tensor]]:
        """``columns`` of ``indices`` if every cell is held, else {} (read them from the shards)."""
        rows = self._rows
        out: dict[str, list[protocol.Tensor]] = {name: [] for name in columns}
        for index in indices:
            entry = rows.get(index)
            if entry is None:
                return {}
            for name in columns:
                cell = entry.get(name)
                if cell is None:
                    return {}
                out[name].append(cell)
        return out

    def drop(self, indices: Iterable[int]) -> None:
        for index in indices:
            entry = self._rows.pop(index, None)
            if entry:
                self.num_bytes -= sum(len(c.data) for c in entry.values())

    def clear(self) -> None:
        self._rows.clear()
        self.num_bytes = 0
