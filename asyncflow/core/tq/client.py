"""TQClient: what any actor uses to write to and read from a TransferQueue.

    tq = TQClient(ctx.directory)                       # or TQClient(directory_address)
    metas = tq.allocate(num_groups=4, group_size=8, step=3)   # backpressure: may wait
    for m, resp in zip(metas, responses):
        m.version, m.prompt_len, m.response_len = 7, len(prompt), len(resp)
    tq.put([m.index for m in metas], {"response_ids": responses, "old_logp": logps}, metas)

    batch = tq.get_batch("train", ["response_ids", "old_logp"], 32, policy="group")
    ... batch.columns["old_logp"][k] (numpy, one array per row), batch.torch("old_logp") ...
    tq.ack(batch)

Data goes straight between the client and the shards: row ``i`` lives on shard
``(i // stripe_rows) % num_shards``; a batch spread over several shards is read from
them concurrently. On the same host, puts of at least ``shm_min_bytes`` travel
through a shared-memory segment handed to the shard, and reads of such rows map it
(no bytes on a socket); smaller ones ride in the message.

Arrays returned by ``get_batch`` that came in a message are read-only views into it
(valid as long as they live); those from a shared-memory arena are copies, or with
``zero_copy=True`` read-only views valid until the batch is acked.

A queue process that does not answer (frozen: SIGSTOP, a debugger, swapped out) is
asked again until it does, for up to ``cluster.transport.freeze_timeout_s``
(``core/retry.py``); requests that hand something out or change the queue carry a
request id, so the queue serves each once however many copies it finds when it
wakes (``core/replay.py``): no row is handed out twice, none is lost.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from asyncflow.core import protocol, retry, tensors
from asyncflow.core.errors import RemoteError
from asyncflow.core.phases import phase
from asyncflow.core.tq import shm
from asyncflow.core.tq.errors import BatchTimeout, QueueFull
from asyncflow.core.tq.ledger import shard_of
from asyncflow.core.tq.notify import Notifier
from asyncflow.core.transport import is_tcp

MANAGER_NAME = "tq.manager"
SAVE_WAIT_S = 570.0
"""How long a save or load of the whole queue may take (600 s with the default ask timeout)."""

R = TypeVar("R")


def controller_name(task: str) -> str:
    return f"tq.controller.{task}"


def shard_name(k: int) -> str:
    return f"tq.shard.{k}"


class Batch:
    """Rows of one task: ``columns[name][k]`` is column ``name`` of row ``indices[k]``;
    ``parts[r]`` lists positions of dp rank ``r`` (when asked with ``dp_size > 1``)."""

    def __init__(self, task: str, meta: protocol.BatchMeta, columns: dict[str, list[np.ndarray]]):
        self.task = task
        self.indices = meta.indices
        self.metas = meta.metas
        self.parts = meta.parts
        self.columns = columns

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        return f"Batch(task={self.task!r}, rows={len(self)}, columns={sorted(self.columns)})"

    def torch(self, name: str) -> list:
        """Column ``name`` as torch tensors (copies read-only arrays)."""
        import torch

        return [torch.from_numpy(a if a.flags.writeable else a.copy()) for a in self.columns[name]]


class TQClient:
    def __init__(
        self,
        directory: Any,
        *,
        manager: str = MANAGER_NAME,
        consumer: str | None = None,
        use_shm: bool | None = None,
        shm_min_bytes: int = 1 << 20,
        timeout_s: float | None = None,
        reserve_rows: int | None = None,
        freeze_timeout_s: float | None = None,
    ):
        """``timeout_s``: how long one attempt of a request waits for its answer (on top
        of a get's or an allocation's own wait); ``freeze_timeout_s``: how long a request
        is sent again to a queue process that does not answer (0: never). None: the
        transport's ``ask_timeout_s`` and ``freeze_timeout_s``."""
        if isinstance(directory, str):
            from asyncflow.core.directory import DirectoryClient

            directory = DirectoryClient(directory)
        self.directory = directory
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        # this client's id: a restarted worker reuses ``consumer`` but never this; a
        # requeue of ``consumer`` retires it (the controller refuses its requests after)
        self.incarnation = uuid.uuid4().hex
        transport = directory.transport
        self.timeout_s = transport.ask_timeout_s if timeout_s is None else timeout_s
        self.freeze_timeout_s = transport.freeze_timeout_s if freeze_timeout_s is None else freeze_timeout_s
        self.shm_min_bytes = shm_min_bytes
        self._manager = directory.ref(manager, wait_s=self.timeout_s)
        self.info: protocol.QueueInfo = self._ask(self._manager, protocol.GetQueueInfo(), idempotent=True)
        self._shards = [directory.ref(name, wait_s=self.timeout_s) for name in self.info.shards]
        self._controllers: dict[str, Any] = {}
        if use_shm is None:
            here = socket.gethostname()
            use_shm = shm.available() and all(
                not is_tcp(ref.address) and directory.lookup(ref.name).host == here for ref in self._shards
            )
        self.use_shm = use_shm
        self._pool: ThreadPoolExecutor | None = None
        # rows reserved ahead, so most allocations need no round trip (they count as live)
        self.reserve_rows = min(256, self.info.capacity_rows // 8) if reserve_rows is None else reserve_rows
        self._spare: dict[int, deque[list[protocol.RowMeta]]] = {}  # group size -> reserved groups
        self._wakes: dict[str, int] = {}  # task -> Wake messages sent (``wake``)
        self._wake_lock = threading.Lock()
        self._notifier: Notifier | None = None  # sends the wakes, made at the first

    def close(self) -> None:
        """Give back reserved rows and stop the client's threads."""
        spare = [m.index for groups in self._spare.values() for g in groups for m in g]
        self._spare.clear()
        if spare:
            self.release(spare)
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None
        if self._notifier is not None:
            self._notifier.close()
            self._notifier = None

    # -- helpers -------------------------------------------------------------------

    def _ask(self, ref, msg: protocol.Request[R], wait_s: float = 0.0, idempotent: bool = False) -> R:
        """Ask ``msg`` until the queue answers (``core/retry.py``); with a request id unless
        ``idempotent`` (a read: a copy served twice changes nothing, and its answer, which
        may be large, is not kept for a resend)."""
        if idempotent:
            return retry.ask_idempotent(ref, msg, wait_s, ask_timeout_s=self.timeout_s, freeze_timeout_s=self.freeze_timeout_s)
        return retry.ask(ref, msg, wait_s, ask_timeout_s=self.timeout_s, freeze_timeout_s=self.freeze_timeout_s)

    def _controller(self, task: str):
        ref = self._controllers.get(task)
        if ref is None:
            name = self.info.controllers.get(task)
            if name is None:
                raise ValueError(f"this queue has no task {task!r}; its tasks are {sorted(self.info.controllers)}")
            ref = self._controllers[task] = self.directory.ref(name, wait_s=self.timeout_s)
        return ref

    def _by_shard(self, indices: Sequence[int]) -> dict[int, list[int]]:
        """shard -> positions into ``indices``."""
        out: dict[int, list[int]] = {}
        stripe, num = self.info.stripe_rows, len(self.info.shards)
        for pos, index in enumerate(indices):
            out.setdefault(shard_of(index, stripe, num), []).append(pos)
        return out

    def _each(self, fn, items: list) -> list:
        """``fn`` over ``items``, concurrently when there are several."""
        if len(items) == 1:
            return [fn(items[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(2, len(self._shards)), thread_name_prefix="tq-client")
        return list(self._pool.map(fn, items))

    # -- producers ---------------------------------------------------------------------

    def allocate(
        self, num_groups: int, group_size: int = 1, *, step: int = -1, timeout_s: float = 60.0, headroom_rows: int = 0
    ) -> list[protocol.RowMeta]:
        """Reserve rows for ``num_groups`` groups of ``group_size``; waits while the queue
        is full (raises QueueFull after ``timeout_s``); with ``headroom_rows``, also while
        fewer than that many rows would stay free after them. Returns one RowMeta per row
        (index, group id and size, step): fill in version/lengths and pass to put."""
        spare = self._spare.setdefault(group_size, deque())
        taken = [m for _ in range(min(num_groups, len(spare))) for m in spare.popleft()]
        for m in taken:
            m.step = step
        if len(taken) == num_groups * group_size:
            return taken
        extra_groups = self.reserve_rows // group_size
        msg = protocol.Allocate(
            num_groups=num_groups - len(taken) // group_size,
            group_size=group_size,
            step=step,
            timeout_s=timeout_s,
            extra_groups=extra_groups,
            headroom_rows=headroom_rows,
        )
        try:
            reply = self._ask(self._manager, msg, wait_s=timeout_s)
        except BaseException as exc:
            for k in range(len(taken) - group_size, -1, -group_size):  # keep the reserved groups
                spare.appendleft(taken[k : k + group_size])
            if isinstance(exc, RemoteError) and exc.detail.startswith("TimeoutError"):
                raise QueueFull(exc.detail.removeprefix("TimeoutError: ")) from None
            raise
        for k in range(0, len(reply.extra), group_size):
            spare.append(reply.extra[k : k + group_size])
        return taken + reply.metas

    def put(
        self, indices: Sequence[int], columns: Mapping[str, Sequence[Any]], metas: Sequence[protocol.RowMeta] | None = None
    ) -> None:
        """Write ``columns[name][k]`` (numpy array or torch tensor) as column ``name`` of
        row ``indices[k]``, straight to the rows' shards; ``metas`` merge into the rows'
        metadata. Returns once every shard stored its rows."""
        indices = list(indices)
        for name, cells in columns.items():
            if len(cells) != len(indices):
                raise ValueError(f"column {name!r} has {len(cells)} entries for {len(indices)} rows: give one per row")
        if metas is not None and len(metas) != len(indices):
            raise ValueError(f"{len(metas)} metas for {len(indices)} rows: give one per row or none")
        by_shard = self._by_shard(indices)

        def put_one(item):
            k, positions = item
            if len(by_shard) == 1:
                rows, cols, row_metas = indices, columns, list(metas or ())
            else:
                rows = [indices[p] for p in positions]
                cols = {name: [cells[p] for p in positions] for name, cells in columns.items()}
                row_metas = [metas[p] for p in positions] if metas is not None else []
            with phase("encode"):
                arrays = {name: [_as_array(c) for c in cells] for name, cells in cols.items()}
                num_bytes = sum(a.nbytes for cells in arrays.values() for _, a in cells)
                if self.use_shm and num_bytes >= self.shm_min_bytes:
                    msg = self._shm_put(self._shards[k], rows, arrays, row_metas)
                else:
                    wire = {
                        name: [
                            protocol.Tensor(dtype=d, shape=a.shape, data=memoryview(a).cast("B") if a.size else b"")
                            for d, a in cells
                        ]
                        for name, cells in arrays.items()
                    }
                    msg = protocol.PutRows(indices=rows, columns=wire, metas=row_metas)
            with phase("put_round_trip"):
                self._ask(self._shards[k], msg)

        self._each(put_one, list(by_shard.items()))

    def _shm_put(
        self, shard, rows: list[int], arrays: dict[str, list[tuple[str, np.ndarray]]], metas: list
    ) -> protocol.PutRowsShm:
        """Reserve an extent in the shard's arena and write the rows into it (one copy);
        the message tells the shard where they are."""
        layout: dict[str, tuple[int, list[int], bool]] = {}  # name -> (start, offsets, as one block)
        pos = 0
        for name, cells in arrays.items():
            kinds = {d for d, _ in cells}
            if len(kinds) != 1:
                raise ValueError(f"column {name!r} mixes dtypes {sorted(kinds)} across rows; use one dtype per column")
            shape, size = cells[0][1].shape, cells[0][1].nbytes
            if size % shm.ALIGN_BYTES == 0 and all(a.shape == shape for _, a in cells):
                layout[name] = (pos, [pos + k * size for k in range(len(cells))], True)
                pos += size * len(cells)
            else:
                offs = []
                for _, a in cells:
                    offs.append(pos)
                    pos += shm.align(a.nbytes)
                layout[name] = (pos, offs, False)
        got = self._ask(shard, protocol.ReserveShm(num_bytes=pos))
        arena = shm.MAPPINGS.get(got.segment)
        base = got.offset
        columns = {}
        for name, cells in arrays.items():
            start, offsets, block = layout[name]
            first = cells[0][1]
            if block and first.size:
                n = first.nbytes * len(cells)
                dst = arena[base + start : base + start + n].view(first.dtype).reshape((len(cells),) + first.shape)
                np.stack([a for _, a in cells], out=dst)
            else:
                for off, (_, a) in zip(offsets, cells):
                    if a.size:
                        arena[base + off : base + off + a.nbytes] = a.reshape(-1).view(np.uint8)
            columns[name] = protocol.ShmColumn(
                dtype=cells[0][0],
                shapes=[a.shape for _, a in cells],
                segments=[0] * len(cells),
                offsets=[base + off for off in offsets],
            )
        return protocol.PutRowsShm(
            indices=rows, segment=got.segment, extent_offset=base, extent_bytes=pos, columns=columns, metas=metas
        )

    def release(self, indices: Sequence[int]) -> None:
        """Give back allocated rows that will not be written."""
        self._ask(self._manager, protocol.Release(indices=list(indices)))

    # -- consumers ---------------------------------------------------------------------

    def get_meta(
        self,
        task: str,
        columns: Sequence[str],
        batch_size: int,
        *,
        policy: str = "fifo",
        timeout_s: float | None = None,
        partial: bool = False,
        filters: Sequence[protocol.RowFilter] = (),
        dp_size: int = 1,
        min_step: int | None = None,
        max_step: int | None = None,
        ack: Batch | Sequence[int] | None = None,
        min_rows: int = 0,
        wakes: int | None = None,
    ) -> protocol.BatchMeta:
        """Ask ``task``'s controller for rows (metadata only); they are now this
        consumer's until acked. Raises BatchTimeout with the reason after ``timeout_s``.
        ``ack``: rows (or the previous batch) this consumer is done with, acked first
        in the same message. ``min_rows`` (with ``partial``): wait in the controller
        until at least that many rows can be handed out, up to ``timeout_s`` or until
        this client's next ``wake(task)``; then the answer has no rows. ``wakes``: the
        count of ``wake`` the request counts as sent after (default: ``wakes(task)`` now;
        pass the count read before looking at what decides the request's filters)."""
        if min_rows and not partial:
            raise ValueError("min_rows applies to a partial request: pass partial=True")
        filters = list(filters)
        if min_step is not None or max_step is not None:
            filters.append(
                protocol.RowFilter(
                    field="step",
                    lo=-(2**62) if min_step is None else min_step,
                    hi=2**62 if max_step is None else max_step,
                )
            )
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        msg = protocol.GetBatch(
            consumer=self.consumer,
            columns=list(columns),
            batch_size=batch_size,
            policy=policy,
            timeout_s=timeout_s,
            partial=partial,
            filters=filters,
            dp_size=dp_size,
            ack=list(ack.indices if isinstance(ack, Batch) else ack or ()),
            incarnation=self.incarnation,
            min_rows=min_rows,
            wakes=self.wakes(task) if wakes is None else wakes,
        )
        try:
            return self._ask(self._controller(task), msg, wait_s=timeout_s)
        except RemoteError as exc:
            if exc.detail.startswith("TimeoutError"):
                raise BatchTimeout(exc.detail.removeprefix("TimeoutError: ")) from None
            raise

    def get_batch(self, task: str, columns: Sequence[str], batch_size: int, *, zero_copy: bool = False, **kwargs) -> Batch:
        """``get_meta`` then read ``columns`` of the rows from their shards (concurrently).
        With ``partial=True`` the batch may be smaller, even empty. ``zero_copy``: see
        ``read``."""
        with phase("get_meta"):
            meta = self.get_meta(task, columns, batch_size, **kwargs)
        with phase("read"):
            return Batch(task, meta, self.read_batch(meta, columns, zero_copy=zero_copy))

    def read_batch(
        self, meta: protocol.BatchMeta, columns: Sequence[str], positions: Sequence[int] | None = None, *, zero_copy: bool = False
    ) -> dict[str, list[np.ndarray]]:
        """Columns of a GetBatch reply's rows (those at ``positions``, default all): from
        the reply itself when it carries them (small rows), else from the shards."""
        if meta.columns and all(name in meta.columns for name in columns):
            picked = range(len(meta.indices)) if positions is None else positions
            return {name: [tensors.to_numpy(meta.columns[name][p]) for p in picked] for name in columns}
        indices = meta.indices if positions is None else [meta.indices[p] for p in positions]
        return self.read(indices, columns, zero_copy=zero_copy)

    def read(self, indices: Sequence[int], columns: Sequence[str], *, zero_copy: bool = False) -> dict[str, list[np.ndarray]]:
        """Columns of rows, straight from the shards: ``out[name][k]`` is row ``indices[k]``.
        Rows held in a same-host arena are copied out unless ``zero_copy``; then the
        arrays are read-only views, valid only until the rows are acked."""
        indices = list(indices)
        out: dict[str, list[Any]] = {name: [None] * len(indices) for name in columns}
        if not indices:
            return out

        def get_one(item):
            k, positions = item
            rows = self._ask(
                self._shards[k],
                protocol.GetRows(indices=[indices[p] for p in positions], columns=list(columns), shm=self.use_shm),
                idempotent=True,
            )
            for name, cells in rows.columns.items():
                col = out[name]
                for p, t in zip(positions, cells):
                    col[p] = tensors.to_numpy(t)
            if rows.shm_columns:
                arenas = [shm.MAPPINGS.get(seg) for seg in rows.shm_segments]
                for name, sc in rows.shm_columns.items():
                    dtype, col = _np_dtype(sc.dtype), out[name]
                    block = _as_block(arenas, sc, dtype)
                    if block is not None:  # rows of one shape, back to back: one view, one copy
                        if zero_copy:
                            block.flags.writeable = False
                        else:
                            block = block.copy()
                        for p, row in zip(positions, block):
                            col[p] = row
                        continue
                    for p, shape, seg, off in zip(positions, sc.shapes, sc.segments, sc.offsets):
                        count = 1
                        for dim in shape:
                            count *= dim
                        view = arenas[seg][off : off + count * dtype.itemsize].view(dtype).reshape(shape)
                        if zero_copy:
                            view.flags.writeable = False
                            col[p] = view
                        else:
                            col[p] = view.copy()

        self._each(get_one, list(self._by_shard(indices).items()))
        return out

    def ack(self, batch_or_task: Batch | str, indices: Sequence[int] | None = None) -> None:
        """Done with rows: ``ack(batch)`` or ``ack(task, indices)``. They are never
        handed to this task again, and are freed once every task acked them."""
        if isinstance(batch_or_task, Batch):
            task, indices = batch_or_task.task, batch_or_task.indices
        else:
            task = batch_or_task
        if indices:
            ack = protocol.Ack(consumer=self.consumer, indices=list(indices), incarnation=self.incarnation)
            self._ask(self._controller(task), ack)

    def wakes(self, task: str) -> int:
        """How many ``wake(task)`` this client has called."""
        return self._wakes.get(task, 0)

    def wake(self, task: str) -> None:
        """Answer this client's waiting request of ``task`` (and one still on its way)
        with no rows now, so it asks again: its staleness bound moved, or it must stop
        waiting. Never blocks: sent from a background thread, safe from any thread."""
        with self._wake_lock:
            n = self._wakes[task] = self._wakes.get(task, 0) + 1
            if self._notifier is None:
                transport = self.directory.transport
                self._notifier = Notifier(
                    f"tq-client-{self.consumer}",
                    resolve=lambda name: self.directory.ref(name, wait_s=self.timeout_s),
                    transport=transport,
                )
            self._notifier.tell(
                self._controller(task).name, protocol.Wake(consumer=self.consumer, incarnation=self.incarnation, wakes=n)
            )

    def flush_wakes(self) -> None:
        """Wait until every wake so far reached its controller."""
        if self._notifier is not None:
            self._notifier.flush()

    def requeue(self, task: str, consumer: str, done_columns: Sequence[str] = ()) -> int:
        """Hand a dead consumer's un-acked rows of ``task`` to others; returns how many.
        Rows that already have all of ``done_columns`` (its outputs) are acked instead."""
        msg = protocol.Requeue(consumer=consumer, done_columns=list(done_columns))
        return self._ask(self._controller(task), msg).num_rows

    def discard(self, task: str, filters: Sequence[protocol.RowFilter]) -> protocol.Discarded:
        """Ack for ``task``, without reading, every waiting row matching ``filters``: their
        indices and names (``RowMeta.key``)."""
        return self._ask(self._controller(task), protocol.Discard(filters=list(filters)))

    # -- whole queue --------------------------------------------------------------------

    def save(self, path: str) -> protocol.QueueSaved:
        """Save the whole queue (controllers, shards, ledger) under ``path``; call it at
        a quiescent point (between steps)."""
        return self._ask(self._manager, protocol.SaveQueue(path=os.path.abspath(path)), wait_s=SAVE_WAIT_S)

    def load(self, path: str) -> protocol.QueueSaved:
        return self._ask(self._manager, protocol.LoadQueue(path=os.path.abspath(path)), wait_s=SAVE_WAIT_S)

    def status(self) -> protocol.QueueStatus:
        return self._ask(self._manager, protocol.GetQueueStatus(), idempotent=True)

    def task_status(self, task: str) -> protocol.TaskStatus:
        return self._ask(self._controller(task), protocol.GetTaskStatus(), idempotent=True)

    def shard_stats(self) -> list[protocol.ShardStats]:
        return self._each(lambda ref: self._ask(ref, protocol.GetShardStats(), idempotent=True), list(self._shards))


_TORCH_ONLY = {"bfloat16": np.int16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}
_DTYPE_NAMES: dict[np.dtype, str] = {}


def _as_array(obj) -> tuple[str, np.ndarray]:
    """(dtype name, C-contiguous numpy array) of a numpy array or torch tensor; torch
    dtypes without a numpy twin (bfloat16...) come as same-width integers."""
    if type(obj) is np.ndarray:
        arr = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        name = _DTYPE_NAMES.get(arr.dtype)
        if name is None:
            name = _DTYPE_NAMES[arr.dtype] = arr.dtype.name
        return name, arr
    t = tensors.to_wire(obj)
    return t.dtype, np.frombuffer(t.data, dtype=_np_dtype(t.dtype)).reshape(t.shape)


def _np_dtype(name: str) -> np.dtype:
    return np.dtype(_TORCH_ONLY.get(name, name))


def _as_block(arenas: list[np.ndarray], sc: protocol.ShmColumn, dtype: np.dtype) -> np.ndarray | None:
    """The column as one [rows, *shape] view when its rows lie back to back in one
    arena with one shape; else None."""
    shape = sc.shapes[0]
    if any(s != shape for s in sc.shapes) or any(seg != sc.segments[0] for seg in sc.segments):
        return None
    count = 1
    for dim in shape:
        count *= dim
    size = count * dtype.itemsize
    start = sc.offsets[0]
    if size == 0 or sc.offsets != list(range(start, start + size * len(sc.offsets), size)):
        return None
    arena = arenas[sc.segments[0]]
    return arena[start : start + size * len(sc.offsets)].view(dtype).reshape((len(sc.offsets),) + tuple(shape))
