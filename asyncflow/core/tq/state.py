"""The state of one consuming task's controller: pure logic, no sockets, no threads.

For every known row (written at least once, not yet freed) the task keeps:
- the produced bits: one bit per column name, set when a shard reports a write;
- the row's metadata (:class:`RowMeta`), merged from every write;
- its consumption state: FREE -> HANDED (to exactly one consumer) -> ACKED.

A *view* is the set of rows ready for one set of required columns: produced for all
of them and FREE. Views are kept incrementally (O(1) per write and per row handed
out), in the order rows became ready, so FIFO costs O(batch) and not O(table).
Each view also indexes its ready rows by step (``_View.steps``) and counts, per step,
the rows a ``group`` selection could take (rows of complete groups, and rows without
a group): a request with a step filter looks only at the steps it admits, and one that
cannot be served (the trainer's whole step still arriving, a replica held back by the
staleness bound) is refused from those counts without examining a row. So a request
tried again after every write costs O(steps), and the whole step O(rows per step).
Measured against a numpy scan of produced/consumed bit arrays (write 8 rows, take
8, ack, free; metadata included for ours only): 70 vs 13 us per batch with 1K rows
live, 96 vs 194 us with 64K; both are well under one message round trip, and only
this one stays flat as the table grows.

Policies of :meth:`TaskState.select`:
- ``fifo``: the first ``batch_size`` ready rows that pass the filters;
- ``group``: whole prompt groups only (all ``group_size`` rows ready), the group of
  the oldest ready row first; a row without a group (``group_id < 0`` or
  ``group_size <= 1``) is a group of one;
- ``dp_size > 1`` with either: the batch also comes split into ``dp_size`` parts of
  balanced total length (``prompt_len + response_len``), groups kept whole.

Invariants (tests/core/tq/test_state.py):
- a row is handed to at most one consumer of the task, and never again once acked;
- a selection is all-or-nothing: without ``partial`` either ``batch_size`` rows are
  handed out or none;
- ``group`` never splits a group;
- ``requeue(consumer, done_columns)`` acks that consumer's HANDED rows that already
  have every ``done_columns`` (its outputs), and returns the rest to FREE, ahead of
  the other ready rows (they are the oldest);
- a snapshot saves HANDED rows as FREE: after a restart, work that was handed out but
  not acked is handed out again (acked work never is);
- ``requeue(consumer)`` also retires every incarnation of ``consumer`` seen so far
  (one per TQClient): ``admit`` refuses their later requests, so a restarted
  consumer that reuses the name is the only one served. Retired incarnations are not
  saved in a snapshot (after a load every process is new).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import msgspec

from asyncflow.core.protocol import RowFilter, RowMeta
from asyncflow.core.tq.balance import balanced_parts

FREE, HANDED, ACKED = 0, 1, 2
POLICIES = ("fifo", "group")
_META_FIELDS = tuple(f for f in RowMeta.__struct_fields__ if f != "index")
_FILTER_FIELDS = tuple(f for f in RowMeta.__struct_fields__ if f != "key")  # the integer fields


class Selection(msgspec.Struct, kw_only=True):
    indices: list[int]
    parts: list[list[int]] = []  # positions into ``indices`` per dp rank (dp_size > 1)


class Readiness(msgspec.Struct, kw_only=True):
    """Why a request is not served yet: for the timeout error."""

    num_ready: int  # FREE rows with every requested column, passing the filters
    num_missing: dict[str, int]  # column -> FREE rows that lack it
    num_complete_groups: int = 0


class _Row:
    __slots__ = ("meta", "mask", "shard", "state", "consumer", "step")

    def __init__(self, meta: RowMeta, shard: int):
        self.meta = meta
        self.mask = 0
        self.shard = shard
        self.state = FREE
        self.consumer = ""
        self.step = meta.step  # the step the views index it under (meta.step when it became ready)


class _View:
    """Rows ready for one mask of required columns, in the order they became ready
    (``ready``: index -> its place in that order), also indexed by step."""

    __slots__ = ("mask", "ready", "steps", "takable", "groups", "complete", "next_seq", "front_seq")

    def __init__(self, mask: int):
        self.mask = mask
        self.ready: dict[int, int] = {}
        self.steps: dict[int, dict[int, None]] = {}  # step -> its ready rows, in ready order
        self.takable: dict[int, int] = {}  # step -> ready rows a group selection could take (complete groups, no group)
        self.groups: dict[int, set[int]] = {}  # group id -> its ready rows (rows in a group only)
        self.complete: set[int] = set()  # groups with every (not yet acked) row ready
        self.next_seq = 0  # the place in line of the next row to become ready
        self.front_seq = 0  # requeued rows go ahead of every other: places below this


def _group_key(meta: RowMeta) -> int | None:
    """The row's group, or None for a row without one (a group of one)."""
    return meta.group_id if meta.group_id >= 0 and meta.group_size > 1 else None


def _step_range(filters: Sequence[RowFilter]) -> tuple[int, int]:
    """The steps every ``step`` filter admits (their intersection)."""
    lo, hi = -(2**63), 2**63
    for f in filters:
        if f.field == "step":
            lo, hi = max(lo, f.lo), min(hi, f.hi)
    return lo, hi


def _passes(meta: RowMeta, filters: Sequence[RowFilter]) -> bool:
    for f in filters:
        value = getattr(meta, f.field)
        if value < f.lo or value > f.hi:
            return False
    return True


def check_filters(filters: Sequence[RowFilter]) -> None:
    for f in filters:
        if f.field not in _FILTER_FIELDS:
            raise ValueError(f"unknown filter field {f.field!r}; use one of {list(_FILTER_FIELDS)}")


class TaskSnapshot(msgspec.Struct, kw_only=True):
    """On-disk form of a TaskState (msgpack)."""

    task: str
    columns: list[str]
    metas: list[RowMeta]
    masks: list[int]
    shards: list[int]
    acked: list[bool]
    group_acked: dict[int, int]


class TaskState:
    def __init__(self, task: str):
        self.task = task
        self._bits: dict[str, int] = {}  # column -> bit
        self._rows: dict[int, _Row] = {}
        self._views: dict[int, _View] = {}
        self._pending: dict[str, set[int]] = {}  # consumer -> HANDED rows
        self._group_acked: dict[int, int] = {}  # group key -> rows acked (partially acked groups)
        self._incarnations: dict[str, set[str]] = {}  # consumer -> incarnations seen since its last requeue
        self._retired: set[str] = set()  # incarnations of requeued consumers
        self.num_acked = 0
        self.num_discarded = 0  # rows ever acked by ``discard`` (untrained), since this state was made

    # -- writes ------------------------------------------------------------------

    def on_written(self, shard: int, indices: Sequence[int], columns: Iterable[str], metas: Sequence[RowMeta] = ()) -> bool:
        """A shard stored ``columns`` of ``indices``; ``metas`` merge (known fields win).
        Whether a row became ready for some view (else no waiting request can be served
        now that could not before)."""
        mask = self._mask(columns)
        meta_by_index = {m.index: m for m in metas} if metas else {}
        rows = self._rows
        changed = False
        for index in indices:
            row = rows.get(index)
            update = meta_by_index.get(index)
            if row is None:
                row = rows[index] = _Row(update if update is not None else RowMeta(index=index), shard)
            elif update is not None:
                changed |= self._merge(row, update)
            if row.mask & mask != mask:
                row.mask |= mask
                if row.state == FREE:
                    changed = True
                    self._add_ready(row)
        return changed

    def _merge(self, row: _Row, update: RowMeta) -> bool:
        """Whether a FREE row moved in the views (a new group or step)."""
        meta = row.meta
        old_key = _group_key(meta)
        for field in _META_FIELDS:
            value = getattr(update, field)
            if value != -1 and value != "":  # -1, "": not known to this writer
                setattr(meta, field, value)
        if _group_key(meta) != old_key or meta.step != row.step:
            # a row's group and step are normally set with its first write; be exact anyway
            if row.state == FREE:
                self._remove_ready(row, old_key)
                row.step = meta.step
                self._add_ready(row)
                return True
            row.step = meta.step
        return False

    def _mask(self, columns: Iterable[str]) -> int:
        mask = 0
        bits = self._bits
        for name in columns:
            bit = bits.get(name)
            if bit is None:
                bit = bits[name] = 1 << len(bits)
            mask |= bit
        return mask

    # -- views ---------------------------------------------------------------------

    def _view(self, mask: int) -> _View:
        view = self._views.get(mask)
        if view is None:
            view = self._views[mask] = _View(mask)
            for index in sorted(self._rows):
                row = self._rows[index]
                if row.state == FREE and row.mask & mask == mask:
                    self._add_to_view(view, row)
        return view

    def _add_ready(self, row: _Row, seq: int | None = None) -> None:
        for view in self._views.values():
            if row.mask & view.mask == view.mask and row.meta.index not in view.ready:
                self._add_to_view(view, row, seq)

    def _add_to_view(self, view: _View, row: _Row, seq: int | None = None) -> None:
        meta = row.meta
        index, step = meta.index, row.step
        if seq is None:
            seq = view.next_seq
            view.next_seq += 1
        view.ready[index] = seq
        bucket = view.steps.get(step)
        if bucket is None:
            bucket = view.steps[step] = {}
        bucket[index] = None
        key = _group_key(meta)
        if key is None:
            view.takable[step] = view.takable.get(step, 0) + 1
            return
        members = view.groups.get(key)
        if members is None:
            members = view.groups[key] = set()
        members.add(index)
        if key in view.complete:
            view.takable[step] = view.takable.get(step, 0) + 1
        elif len(members) + self._group_acked.get(key, 0) >= meta.group_size:
            view.complete.add(key)
            rows = self._rows
            for i in members:
                s = rows[i].step
                view.takable[s] = view.takable.get(s, 0) + 1

    def _remove_ready(self, row: _Row, key: int | None | bool = False) -> None:
        index = row.meta.index
        if key is False:
            key = _group_key(row.meta)
        step = row.step
        for view in self._views.values():
            if view.ready.pop(index, None) is None:
                continue
            bucket = view.steps[step]
            del bucket[index]
            if not bucket:
                del view.steps[step]
            if key is None:
                self._untake(view, step)
                continue
            members = view.groups.get(key)
            if members is None:
                continue
            if key in view.complete:  # no longer complete: none of its rows can be taken
                view.complete.discard(key)
                rows = self._rows
                for i in members:
                    self._untake(view, rows[i].step)
            members.discard(index)
            if not members:
                del view.groups[key]

    @staticmethod
    def _untake(view: _View, step: int) -> None:
        left = view.takable[step] - 1
        if left:
            view.takable[step] = left
        else:
            del view.takable[step]

    def _candidates(self, view: _View, filters: Sequence[RowFilter]) -> tuple[Iterable[int], int, int]:
        """(ready rows the step filters admit, in ready order; how many; how many of them a
        group selection could take). Only the steps in range are looked at."""
        lo, hi = _step_range(filters)
        steps = [s for s in view.steps if lo <= s <= hi]
        if len(steps) == len(view.steps):
            return view.ready, len(view.ready), sum(view.takable.values())
        num = sum(len(view.steps[s]) for s in steps)
        takable = sum(view.takable.get(s, 0) for s in steps)
        if len(steps) == 1:
            return view.steps[steps[0]], num, takable
        ready = view.ready
        merged = heapq.merge(*(view.steps[s] for s in steps), key=ready.__getitem__)
        return merged, num, takable

    # -- reads -----------------------------------------------------------------------

    def select(
        self,
        consumer: str,
        columns: Sequence[str],
        batch_size: int,
        *,
        policy: str = "fifo",
        partial: bool = False,
        filters: Sequence[RowFilter] = (),
        dp_size: int = 1,
        min_rows: int = 0,
    ) -> Selection | None:
        """Pick rows and mark them HANDED to ``consumer``; None when not enough are
        ready (and not ``partial``). A partial selection may be empty, or with
        ``min_rows`` is None while fewer than that many rows could be handed out."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if policy not in POLICIES:
            raise ValueError(f"unknown sampling policy {policy!r}; use one of {list(POLICIES)}")
        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {dp_size}")
        if not columns:
            raise ValueError("ask for at least one column")
        view = self._view(self._mask(columns))
        candidates, num_ready, num_takable = self._candidates(view, filters)
        need = min(batch_size, max(min_rows, 1)) if partial else batch_size
        if (num_takable if policy == "group" else num_ready) < need:  # counts only: no row examined
            if policy == "group" and num_takable:
                self._check_whole_groups(candidates, batch_size)
            return None if not partial or min_rows > 0 else Selection(indices=[])
        if policy == "fifo":
            units = self._pick_rows(candidates, batch_size, filters)
        else:
            units = self._pick_groups(view, candidates, batch_size, filters)
        if dp_size > 1 and units and partial:
            units = units[: len(units) - len(units) % dp_size]
        num_rows = sum(len(u) for u in units)
        if num_rows < (max(min_rows, 0) if partial else batch_size):
            return None
        indices = [i for unit in units for i in unit]
        parts: list[list[int]] = []
        if dp_size > 1 and units:
            rows = self._rows
            lengths = [sum(max(rows[i].meta.prompt_len, 0) + max(rows[i].meta.response_len, 0) for i in u) for u in units]
            starts = []
            pos = 0
            for unit in units:
                starts.append(pos)
                pos += len(unit)
            parts = [
                [starts[u] + k for u in unit_part for k in range(len(units[u]))] for unit_part in balanced_parts(lengths, dp_size)
            ]
        self._hand(consumer, indices)
        return Selection(indices=indices, parts=parts)

    def _check_whole_groups(self, candidates: Iterable[int], batch_size: int) -> None:
        """A request that can never be served is an error now, not a wait: the first
        ready row's group tells (a task's groups all have one size)."""
        for index in candidates:
            meta = self._rows[index].meta
            if _group_key(meta) is not None and batch_size % meta.group_size:
                raise ValueError(
                    f"task {self.task!r}: batch_size {batch_size} is not a multiple of group size "
                    f"{meta.group_size}; with policy 'group' ask for whole groups"
                )
            return

    def _pick_rows(self, candidates: Iterable[int], batch_size: int, filters: Sequence[RowFilter]) -> list[list[int]]:
        picked: list[list[int]] = []
        rows = self._rows
        for index in candidates:
            if filters and not _passes(rows[index].meta, filters):
                continue
            picked.append([index])
            if len(picked) == batch_size:
                break
        return picked

    def _pick_groups(
        self, view: _View, candidates: Iterable[int], batch_size: int, filters: Sequence[RowFilter]
    ) -> list[list[int]]:
        """Whole groups, the group of the oldest ready row first; a row without a
        group is a group of one."""
        picked: list[list[int]] = []
        taken: set[int] = set()
        num_rows = 0
        rows = self._rows
        for index in candidates:
            meta = rows[index].meta
            key = _group_key(meta)
            if key is None:
                members = [index]
            elif key in view.complete and key not in taken:
                taken.add(key)
                members = sorted(view.groups[key])
                if batch_size % meta.group_size:
                    raise ValueError(
                        f"task {self.task!r}: batch_size {batch_size} is not a multiple of group size "
                        f"{meta.group_size}; with policy 'group' ask for whole groups"
                    )
            else:
                continue
            if filters and not all(_passes(rows[i].meta, filters) for i in members):
                continue
            if num_rows + len(members) > batch_size:
                continue
            picked.append(members)
            num_rows += len(members)
            if num_rows == batch_size:
                break
        return picked

    def _hand(self, consumer: str, indices: list[int]) -> None:
        pending = self._pending.setdefault(consumer, set())
        rows = self._rows
        for index in indices:
            row = rows[index]
            self._remove_ready(row)
            row.state = HANDED
            row.consumer = consumer
            pending.add(index)

    def readiness(self, columns: Sequence[str], filters: Sequence[RowFilter] = ()) -> Readiness:
        view = self._view(self._mask(columns))
        rows = self._rows
        num_ready = sum(1 for i in list(view.ready) if _passes(rows[i].meta, filters))
        missing = {c: 0 for c in columns}
        for row in rows.values():
            if row.state == FREE:
                for c in columns:
                    if not row.mask & self._bits[c]:
                        missing[c] += 1
        return Readiness(num_ready=num_ready, num_missing=missing, num_complete_groups=len(view.complete))

    # -- consumption -----------------------------------------------------------------

    def admit(self, consumer: str, incarnation: str) -> None:
        """Check a request of ``consumer`` made by its TQClient ``incarnation`` ("" is
        not checked): refused when that incarnation was requeued (declared dead)."""
        if not incarnation:
            return
        if incarnation in self._retired:
            raise ValueError(
                f"task {self.task!r}: consumer {consumer!r} (incarnation {incarnation}) was requeued as dead, "
                f"and its rows went back to the pool; a restarted consumer makes a new TQClient"
            )
        self._incarnations.setdefault(consumer, set()).add(incarnation)

    def ack(self, consumer: str, indices: Sequence[int]) -> list[int]:
        """Mark rows handed to ``consumer`` done; returns those newly acked. Acking a
        row twice is harmless; acking a row handed to another consumer is an error."""
        rows = self._rows
        for index in indices:
            row = rows.get(index)
            if row is None or row.state == ACKED:
                continue
            if row.state != HANDED or row.consumer != consumer:
                owner = f"handed to {row.consumer!r}" if row.state == HANDED else "not handed out"
                raise ValueError(
                    f"task {self.task!r}: consumer {consumer!r} acked row {index}, which is {owner}; "
                    f"ack only rows your own get_batch returned (after a requeue they belong to someone else)"
                )
        done: list[int] = []
        pending = self._pending.get(consumer, set())
        for index in indices:
            row = rows.get(index)
            if row is None or row.state == ACKED:
                continue
            pending.discard(index)
            self._set_acked(row)
            done.append(index)
        return done

    def _set_acked(self, row: _Row) -> None:
        row.state = ACKED
        row.consumer = ""
        self.num_acked += 1
        key = _group_key(row.meta)
        if key is not None:
            num = self._group_acked.get(key, 0) + 1
            if num < row.meta.group_size:
                self._group_acked[key] = num
            else:
                self._group_acked.pop(key, None)  # the whole group is done

    def requeue(self, consumer: str, done_columns: Sequence[str] = ()) -> tuple[list[int], list[int]]:
        """Return ``consumer``'s HANDED rows to FREE, ahead of other ready rows; those
        that already have every column of ``done_columns`` are acked instead. Returns
        (requeued, acked). Every incarnation of ``consumer`` seen so far is retired."""
        self._retired.update(self._incarnations.pop(consumer, ()))
        indices = sorted(self._pending.pop(consumer, ()))
        rows = self._rows
        done: list[int] = []
        if done_columns:
            mask = self._mask(done_columns)
            done = [i for i in indices if rows[i].mask & mask == mask]
            for index in done:
                self._set_acked(rows[index])
            indices = [i for i in indices if rows[i].state != ACKED]
        for view in self._views.values() if indices else ():
            view.front_seq -= len(indices)
        for k, index in enumerate(indices):  # ahead of every ready row, in index order
            row = rows[index]
            row.state = FREE
            row.consumer = ""
            for view in self._views.values():
                if row.mask & view.mask == view.mask and index not in view.ready:
                    self._add_to_view(view, row, view.front_seq + k)
        if indices:
            for view in self._views.values():  # the ready order, and each step's, by place in line
                view.ready = dict(sorted(view.ready.items(), key=lambda item: item[1]))
                for step, bucket in view.steps.items():
                    view.steps[step] = dict.fromkeys(sorted(bucket, key=view.ready.__getitem__))
        return indices, done

    def discard(self, filters: Sequence[RowFilter]) -> list[int]:
        """Ack, without handing out, every FREE row matching all ``filters``."""
        check_filters(filters)
        done = []
        for row in self._rows.values():
            if row.state == FREE and _passes(row.meta, filters):
                self._remove_ready(row)
                self._set_acked(row)
                done.append(row.meta.index)
        self.num_discarded += len(done)
        return done

    def forget(self, indices: Iterable[int]) -> None:
        """Rows freed on the shards: drop them."""
        rows = self._rows
        for index in indices:
            row = rows.pop(index, None)
            if row is None:
                continue
            if row.state == FREE:
                self._remove_ready(row)
            elif row.state == HANDED:
                self._pending.get(row.consumer, set()).discard(index)
                self._remove_ready(row)
            else:
                self.num_acked -= 1

    # -- introspection -----------------------------------------------------------------

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def pending(self) -> dict[str, int]:
        return {c: len(s) for c, s in self._pending.items() if s}

    def acked_indices(self) -> list[int]:
        return sorted(i for i, r in self._rows.items() if r.state == ACKED)

    def meta(self, index: int) -> RowMeta:
        return self._rows[index].meta

    def shard(self, index: int) -> int:
        return self._rows[index].shard

    def state_of(self, index: int) -> int:
        row = self._rows.get(index)
        return -1 if row is None else row.state

    # -- save/load -------------------------------------------------------------------

    def snapshot(self) -> TaskSnapshot:
        names = sorted(self._bits, key=self._bits.__getitem__)
        rows = [self._rows[i] for i in sorted(self._rows)]
        return TaskSnapshot(
            task=self.task,
            columns=names,
            metas=[r.meta for r in rows],
            masks=[r.mask for r in rows],
            shards=[r.shard for r in rows],
            acked=[r.state == ACKED for r in rows],
            group_acked=dict(self._group_acked),
        )

    @classmethod
    def restore(cls, snap: TaskSnapshot) -> TaskState:
        state = cls(snap.task)
        for name in snap.columns:
            state._mask([name])
        for meta, mask, shard, acked in zip(snap.metas, snap.masks, snap.shards, snap.acked):
            row = state._rows[meta.index] = _Row(meta, shard)
            row.mask = mask
            if acked:
                row.state = ACKED
                state.num_acked += 1
        state._group_acked = dict(snap.group_acked)
        return state

    def to_bytes(self) -> bytes:
        return msgspec.msgpack.encode(self.snapshot())

    @classmethod
    def from_bytes(cls, data: bytes) -> TaskState:
        return cls.restore(msgspec.msgpack.decode(data, type=TaskSnapshot))
