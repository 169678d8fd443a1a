"""A storage shard's rows: columns of tensors by global row index. No sockets.

Cells are kept without copying: an inline cell is the ``Tensor`` decoded from the
put's frame (its bytes are a view into that frame), a shared-memory cell names a
segment the shard owns and an offset in it. A segment is unlinked when the last
cell in it is freed or overwritten. ``num_bytes`` counts tensor bytes held.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import msgspec

from asyncflow.core.protocol import RowMeta, ShmRef, Tensor
from asyncflow.core.tq import shm
from asyncflow.core.tensors import nbytes

_META_FIELDS = tuple(f for f in RowMeta.__struct_fields__ if f != "index")


class _ShmCell:
    __slots__ = ("segment", "offset", "num_bytes", "dtype", "shape")

    def __init__(self, segment: str, offset: int, num_bytes: int, dtype: str, shape: tuple[int, ...]):
        self.segment = segment
        self.offset = offset
        self.num_bytes = num_bytes
        self.dtype = dtype
        self.shape = shape


class _Segment:
    __slots__ = ("num_cells", "num_bytes", "view")

    def __init__(self, num_bytes: int):
        self.num_cells = 0
        self.num_bytes = num_bytes
        self.view: memoryview | None = None  # mapped only when a remote reader needs bytes


class SavedRow(msgspec.Struct, array_like=True):
    index: int
    meta: RowMeta
    columns: dict[str, Tensor]


class ShardStore:
    def __init__(self, name: str = "shard"):
        self.name = name
        self._rows: dict[int, dict[str, Tensor | _ShmCell]] = {}
        self._metas: dict[int, RowMeta] = {}
        self._segments: dict[str, _Segment] = {}
        self.num_bytes = 0
        self.peak_bytes = 0
        self.shm_bytes = 0  # bytes of the segments owned
        self.peak_shm_bytes = 0

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

    def put_shm(
        self,
        indices: Sequence[int],
        segment: str,
        segment_bytes: int,
        dtypes: dict[str, str],
        shapes: dict[str, list[tuple[int, ...]]],
        offsets: dict[str, list[int]],
        metas: Sequence[RowMeta] = (),
    ) -> None:
        if segment in self._segments:
            raise ValueError(f"{self.name}: segment {segment} was handed over twice")
        seg = self._segments[segment] = _Segment(segment_bytes)
        self.shm_bytes += segment_bytes
        self.peak_shm_bytes = max(self.peak_shm_bytes, self.shm_bytes)
        for name in dtypes:
            if len(shapes[name]) != len(indices) or len(offsets[name]) != len(indices):
                raise ValueError(f"{self.name}: column {name!r} does not have one shape and offset per row")
        itemsizes = {name: _itemsize(dtype) for name, dtype in dtypes.items()}
        for k, index in enumerate(indices):
            row = self._rows.get(index)
            if row is None:
                row = self._rows[index] = {}
            for name, dtype in dtypes.items():
                shape = tuple(shapes[name][k])
                count = 1
                for dim in shape:
                    count *= dim
                cell = _ShmCell(segment, offsets[name][k], count * itemsizes[name], dtype, shape)
                self._set(row, name, cell)
        if seg.num_cells == 0:
            self._drop_segment(segment)
        self._merge_metas(metas)
        self.peak_bytes = max(self.peak_bytes, self.num_bytes)

    def _set(self, row: dict, name: str, cell: Tensor | _ShmCell) -> None:
        old = row.get(name)
        if old is not None:
            self._release(old)
        row[name] = cell
        if isinstance(cell, _ShmCell):
            self._segments[cell.segment].num_cells += 1
            self.num_bytes += cell.num_bytes
        else:
            self.num_bytes += nbytes(cell)

    def _release(self, cell: Tensor | _ShmCell) -> None:
        if isinstance(cell, _ShmCell):
            self.num_bytes -= cell.num_bytes
            seg = self._segments[cell.segment]
            seg.num_cells -= 1
            if seg.num_cells == 0:
                self._drop_segment(cell.segment)
        else:
            self.num_bytes -= nbytes(cell)

    def _drop_segment(self, name: str) -> None:
        self.shm_bytes -= self._segments.pop(name).num_bytes
        shm.unlink(name)

    def _merge_metas(self, metas: Iterable[RowMeta]) -> None:
        for update in metas:
            meta = self._metas.get(update.index)
            if meta is None:
                self._metas[update.index] = msgspec.structs.replace(update)
                continue
            for field in _META_FIELDS:
                value = getattr(update, field)
                if value != -1:
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
        """Unlink every segment still owned (the shard is stopping)."""
        for name in list(self._segments):
            self._drop_segment(name)
        self._rows.clear()
        self._metas.clear()
        self.num_bytes = 0

    # -- reads -----------------------------------------------------------------------

    def _row(self, index: int) -> dict:
        row = self._rows.get(index)
        if row is None:
            raise KeyError(f"{self.name}: row {index} is not here (never written to this shard, or already freed)")
        return row

    def get(self, indices: Sequence[int], columns: Sequence[str], allow_shm: bool = False):
        """(inline columns, shm columns, shm dtypes, shm shapes) of ``indices``. A column
        comes as shm refs only if ``allow_shm`` and every requested cell is in shm."""
        rows = [self._row(i) for i in indices]
        inline: dict[str, list[Tensor]] = {}
        refs: dict[str, list[ShmRef]] = {}
        dtypes: dict[str, str] = {}
        shapes: dict[str, list[tuple[int, ...]]] = {}
        for name in columns:
            try:
                cells = [row[name] for row in rows]
            except KeyError:
                missing = [i for i, row in zip(indices, rows) if name not in row]
                have = sorted(rows[indices.index(missing[0])])
                raise KeyError(
                    f"{self.name}: rows {missing[:8]} have no column {name!r} (row {missing[0]} has {have}); "
                    f"get only columns the controller reported produced"
                ) from None
            if allow_shm and cells and all(isinstance(c, _ShmCell) for c in cells) and len({c.dtype for c in cells}) == 1:
                refs[name] = [ShmRef(segment=c.segment, offset=c.offset, num_bytes=c.num_bytes) for c in cells]
                dtypes[name] = cells[0].dtype
                shapes[name] = [c.shape for c in cells]
            else:
                inline[name] = [self._inline(c) for c in cells]
        return inline, refs, dtypes, shapes

    def _inline(self, cell: Tensor | _ShmCell) -> Tensor:
        if not isinstance(cell, _ShmCell):
            return cell
        seg = self._segments[cell.segment]
        if seg.view is None:
            seg.view = shm.map_readonly(cell.segment)
        return Tensor(dtype=cell.dtype, shape=cell.shape, data=seg.view[cell.offset : cell.offset + cell.num_bytes])

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
