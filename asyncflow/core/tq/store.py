"""A storage shard's rows: columns of tensors by global row index. No sockets.

Cells are kept without copying: an inline cell is the ``Tensor`` decoded from the
put's frame (its bytes are a view into that frame); a shared-memory cell is an
offset into one of the shard's arenas (see ``shm.py``), inside an extent that a
producer reserved and filled. An extent goes back to its arena when the last cell
in it is freed or overwritten. ``num_bytes`` counts tensor bytes held.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from asyncflow.core.protocol import RowMeta, ShmColumn, Tensor
from asyncflow.core.tensors import nbytes
from asyncflow.core.tq import shm

_META_FIELDS = tuple(f for f in RowMeta.__struct_fields__ if f != "index")


class _ShmCell(tuple):
    """(arena, offset, num_bytes, dtype, shape, extent); ``extent`` is the shared
    ``[arena, offset, bytes, number of live cells]`` of the put that wrote it."""

    __slots__ = ()


class SavedRow(msgspec.Struct, array_like=True):
    index: int
    meta: RowMeta
    columns: dict[str, Tensor]


class ShardStore:
    def __init__(self, name: str = "shard", arena_bytes: int = 1 << 30):
        self.name = name
        self.arena_bytes = arena_bytes
        self._rows: dict[int, dict[str, Tensor | _ShmCell]] = {}
        self._metas: dict[int, RowMeta] = {}
        self._arenas: dict[str, shm.Arena] = {}
        self._reserved: dict[tuple[str, int], int] = {}  # (arena, offset) -> bytes, not yet put
        self.num_bytes = 0
        self.peak_bytes = 0

    @property
    def shm_bytes(self) -> int:
        """Arena memory touched (the high-water mark of what was handed out)."""
        return sum(a.top_bytes for a in self._arenas.values())

    # -- writes --------------------------------------------------------------------

    def put(self, indices: Sequence[int], columns: dict[str, list[Tensor]], metas: Sequence[RowMeta] = ()) -> None:
        for name, cells in columns.items():
            if len(cells) != len(indices):
                raise ValueError(f"{self.name}: column {name!r} has {len(cells)} tensors for {len(indices)} rows")
        for k, index in enumerate(indices):
            row = self._rows.get(index)
            if row is None:
                row = self._rows[index] = {}
            for name, cells in columns.items():
                self._set(row, name, cells[k])
        self._merge_metas(metas)
        self.peak_bytes = max(self.peak_bytes, self.num_bytes)

    def reserve(self, num_bytes: int) -> tuple[str, int]:
        """An extent of ``num_bytes`` in an arena: (arena name, offset)."""
        for arena in self._arenas.values():
            offset = arena.alloc(num_bytes)
            if offset is not None:
                break
        else:
            safe = "".join(c if c.isalnum() else "-" for c in self.name)
            name = f"{shm.PREFIX}{safe}-{os.getpid()}-{len(self._arenas)}"
            arena = self._arenas[name] = shm.Arena(name, max(self.arena_bytes, shm.align(num_bytes, shm.EXTENT_ALIGN_BYTES)))
            offset = arena.alloc(num_bytes)
        assert offset is not None  # a fresh arena holds num_bytes
        self._reserved[(arena.name, offset)] = num_bytes
        return arena.name, offset

    def put_shm(
        self,
        indices: Sequence[int],
        segment: str,
        extent_offset: int,
        extent_bytes: int,
        columns: dict[str, ShmColumn],
        metas: Sequence[RowMeta] = (),
    ) -> None:
        reserved = self._reserved.pop((segment, extent_offset), None)
        if reserved is None or reserved != extent_bytes:
            raise ValueError(f"{self.name}: no reserved extent of {extent_bytes} bytes at {segment}:{extent_offset}")
        extent: list[Any] = [segment, extent_offset, extent_bytes, 0]  # arena, offset, bytes, cells in it
        end = extent_offset + extent_bytes
        for name, col in columns.items():
            if len(col.shapes) != len(indices) or len(col.offsets) != len(indices):
                raise ValueError(f"{self.name}: column {name!r} does not have one shape and offset per row")
        cells_by_column = {}
        for name, col in columns.items():
            itemsize = _itemsize(col.dtype)
            cells = []
            for shape, offset in zip(col.shapes, col.offsets):
                count = 1
                for dim in shape:
                    count *= dim
                num_bytes = count * itemsize
                if offset < extent_offset or offset + num_bytes > end:
                    raise ValueError(f"{self.name}: column {name!r} has bytes outside its extent")
                cells.append(_ShmCell((segment, offset, num_bytes, col.dtype, shape, extent)))
            cells_by_column[name] = cells
        rows = self._rows
        names = list(cells_by_column)
        columns_of_rows = list(zip(*cells_by_column.values()))
        for index, row_cells in zip(indices, columns_of_rows):
            row = rows.get(index)
            if row is None:  # a new row: no old cells to release
                rows[index] = dict(zip(names, row_cells))
                extent[3] += len(row_cells)
                self.num_bytes += sum(c[2] for c in row_cells)
            else:
                for name, cell in zip(names, row_cells):
                    self._set(row, name, cell)
        if extent[3] == 0:
            self._arenas[segment].free(extent_offset, extent_bytes)
        self._merge_metas(metas)
        self.peak_bytes = max(self.peak_bytes, self.num_bytes)

    def _set(self, row: dict, name: str, cell: Tensor | _ShmCell) -> None:
        old = row.get(name)
        if old is not None:
            self._release(old)
        row[name] = cell
        if isinstance(cell, _ShmCell):
            cell[5][3] += 1
            self.num_bytes += cell[2]
        else:
            self.num_bytes += nbytes(cell)

    def _release(self, cell: Tensor | _ShmCell) -> None:
        if isinstance(cell, _ShmCell):
            self.num_bytes -= cell[2]
            extent = cell[5]
            extent[3] -= 1
            if extent[3] == 0:
                self._arenas[extent[0]].free(extent[1], extent[2])
        else:
            self.num_bytes -= nbytes(cell)

    def _merge_metas(self, metas: Iterable[RowMeta]) -> None:
        for update in metas:
            meta = self._metas.get(update.index)
            if meta is None:
                self._metas[update.index] = update  # decoded for us alone: adopt it
                continue
            for field in _META_FIELDS:
                value = getattr(update, field)
                if value != -1 and value != "":  # -1, "": not known to this writer
                    setattr(meta, field, value)

    def free(self, indices: Iterable[int]) -> int:
        num = 0
        for index in indices:
            row = self._rows.pop(index, None)
            self._metas.pop(index, None)
            if row is None:
                continue
            num += 1
            for cell in row.values():
                self._release(cell)
        return num

    def close(self) -> None:
        """Drop every row and unlink the arenas (the shard is stopping)."""
        self._rows.clear()
        self._metas.clear()
        self._reserved.clear()
        for arena in self._arenas.values():
            shm.MAPPINGS.forget(arena.name)
            arena.unlink()
        self._arenas.clear()
        self.num_bytes = 0

    # -- reads -----------------------------------------------------------------------

    def _row(self, index: int) -> dict:
        row = self._rows.get(index)
        if row is None:
            raise KeyError(f"{self.name}: row {index} is not here (never written to this shard, or already freed)")
        return row

    def get(self, indices: Sequence[int], columns: Sequence[str], allow_shm: bool = False):
        """(inline columns, shm columns, arena names) of ``indices``. A column comes as
        arena offsets only if ``allow_shm`` and every requested cell is in an arena."""
        rows = [self._row(i) for i in indices]
        inline: dict[str, list[Tensor]] = {}
        shm_columns: dict[str, ShmColumn] = {}
        segments: dict[str, int] = {}
        for name in columns:
            try:
                cells = [row[name] for row in rows]
            except KeyError:
                missing = [i for i, row in zip(indices, rows) if name not in row]
                have = sorted(rows[list(indices).index(missing[0])])
                raise KeyError(
                    f"{self.name}: rows {missing[:8]} have no column {name!r} (row {missing[0]} has {have}); "
                    f"get only columns the controller reported produced"
                ) from None
            if allow_shm and cells and all(isinstance(c, _ShmCell) for c in cells) and len({c[3] for c in cells}) == 1:
                shm_columns[name] = ShmColumn(
                    dtype=cells[0][3],
                    shapes=[c[4] for c in cells],
                    segments=[segments.setdefault(c[0], len(segments)) for c in cells],
                    offsets=[c[1] for c in cells],
                )
            else:
                inline[name] = [self._inline(c) for c in cells]
        return inline, shm_columns, list(segments)

    def _inline(self, cell: Tensor | _ShmCell) -> Tensor:
        if not isinstance(cell, _ShmCell):
            return cell
        arena, offset, num_bytes, dtype, shape, _ = cell
        data = shm.MAPPINGS.get(arena)[offset : offset + num_bytes]
        return Tensor(dtype=dtype, shape=shape, data=memoryview(data))  # type: ignore[arg-type]  # ndarray is a buffer; numpy's stubs lack __buffer__

    def indices(self) -> list[int]:
        return sorted(self._rows)

    def columns_of(self, index: int) -> list[str]:
        return sorted(self._row(index))

    def meta(self, index: int) -> RowMeta:
        return self._metas.get(index) or RowMeta(index=index)

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    # -- save/load ---------------------------------------------------------------------

    def save(self, path: str) -> None:
        rows = [
            SavedRow(index=i, meta=self.meta(i), columns={n: self._inline(c) for n, c in self._rows[i].items()})
            for i in sorted(self._rows)
        ]
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(msgspec.msgpack.encode(rows))
        os.replace(tmp, path)

    def load(self, path: str) -> list[SavedRow]:
        """Replace the contents with a saved file's rows; returns them."""
        with open(path, "rb") as f:
            data = f.read()
        rows = msgspec.msgpack.decode(data, type=list[SavedRow])
        self.close()
        self.peak_bytes = 0
        for row in rows:
            self.put([row.index], {n: [t] for n, t in row.columns.items()}, [row.meta])
        return rows


_TORCH_ONLY_ITEMSIZE = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def _itemsize(dtype: str) -> int:
    import numpy as np

    return _TORCH_ONLY_ITEMSIZE.get(dtype) or np.dtype(dtype).itemsize
