"""ControllerActor: the TransferQueue controller of one consuming task
(``tq.controller.<task>``, e.g. ``tq.controller.train``).

Takes: RowsWritten (tell, from shards), GetBatch (ask: BatchMeta, possibly later),
Ack (ask: Ok), Requeue (ask: Requeued), Discard (ask: Discarded), ForgetRows (tell,
from the manager), SaveController, LoadController (ask: Ok), GetTaskStatus (ask:
TaskStatus), FlushNotices (ask: Ok, once its acks reached the manager), Ping, Stop.
Sends: RowsAcked (tell) to the manager for every ack or discard.

Invariants (the state's, see ``state.py``):
- a row is never handed to two consumers of this task, and never again once acked;
- a GetBatch is answered with metadata (indices, shards, RowMeta); the data is read
  straight from the shards by the consumer, except for small rows whose cells the
  shards sent along with their notices (``inline.py``): those come in the reply;
- a blocking GetBatch waits (DEFER) without holding the actor: requests are served in
  arrival order as rows become ready, or fail after ``timeout_s`` with an error that
  names the task, the columns still missing and how many rows are ready;
- after LoadController, rows that were handed out but not acked are handed out again;
- a Requeue of a consumer, under the same lock as the shards' notices, also drops its
  waiting GetBatch requests and retires its incarnations (``TaskState.admit``): no row
  written after it is handed to the dead consumer, and its later requests are refused.
"""

from __future__ import annotations

import os
import threading
import time

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor, Pending
from asyncflow.core.tq.inline import InlineCache
from asyncflow.core.tq.notify import Notifier
from asyncflow.core.tq.state import ACKED, TaskState, check_filters


class _Waiter:
    __slots__ = ("msg", "pending", "deadline")

    def __init__(self, msg: protocol.GetBatch, pending: Pending):
        self.msg = msg
        self.pending = pending
        self.deadline = time.monotonic() + msg.timeout_s


class ControllerActor(Actor):
    Inbox = protocol.ControllerIn
    # shards' notices are served on the listener thread (no hop to the actor thread:
    # a waiting GetBatch is answered straight from there); the state is touched only
    # under ``_lock``
    Urgent = (protocol.RowsWritten,)

    def __init__(self, ctx, task: str, manager: str = "tq.manager", ack_linger_s: float = 0.005):
        super().__init__(ctx)
        self._lock = threading.Lock()
        self.task = task
        self.manager = manager
        self.state = TaskState(task)
        self.waiters: list[_Waiter] = []
        self.inline = InlineCache()  # small rows' cells, answered with their metadata
        self._timer_at: float | None = None  # when the armed timer fires
        # acks go to the manager in batches: capacity frees a few ms later, for far fewer messages
        self.notifier = Notifier(ctx.name, resolve=ctx.ref, linger_s=ack_linger_s, transport=ctx.transport)

    def on_stop(self) -> None:
        self.notifier.close()
        with self._lock:
            for w in self.waiters:
                if not w.pending.done:
                    w.pending.reject(RuntimeError(f"controller of task {self.task!r} stopped"))

    # -- helpers ---------------------------------------------------------------------

    def _select(self, msg: protocol.GetBatch):
        return self.state.select(
            msg.consumer,
            msg.columns,
            msg.batch_size,
            policy=msg.policy,
            partial=msg.partial,
            filters=msg.filters,
            dp_size=msg.dp_size,
        )

    def _reply(self, sel, columns: list[str]) -> protocol.BatchMeta:
        state = self.state
        return protocol.BatchMeta(
            task=self.task,
            indices=sel.indices,
            metas=[state.meta(i) for i in sel.indices],
            shards=[state.shard(i) for i in sel.indices],
            parts=sel.parts,
            columns=self.inline.take(sel.indices, columns),
        )

    def _serve_waiters(self) -> None:
        if not self.waiters:
            return
        still = []
        for w in self.waiters:
            if w.pending.done:
                continue
            try:
                sel = self._select(w.msg)
            except ValueError as exc:  # e.g. a batch that is not whole groups: that asker's error
                w.pending.reject(exc)
                continue
            if sel is None:
                still.append(w)
            else:
                w.pending.resolve(self._reply(sel, w.msg.columns))
        self.waiters = still

    def _arm(self, deadline: float) -> None:
        """One timer for the earliest deadline (not one per waiting request: a
        consumer that always waits costs no timer per batch)."""
        if self._timer_at is None or deadline < self._timer_at:
            self._timer_at = deadline
            self.call_later(max(0.0, deadline - time.monotonic()), self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._timer_at = None
            for w in [w for w in self.waiters if w.deadline <= now]:
                self._expire_locked(w)
            live = [w.deadline for w in self.waiters if not w.pending.done]
            if live:
                self._arm(min(live))

    def _expire_locked(self, waiter: _Waiter) -> None:
        if waiter.pending.done:
            return
        self.waiters = [w for w in self.waiters if w is not waiter]
        msg = waiter.msg
        r = self.state.readiness(msg.columns, msg.filters)
        missing = ", ".join(f"{c!r} on {n} rows" for c, n in r.num_missing.items() if n) or "none"
        group = f", {r.num_complete_groups} complete groups" if msg.policy == "group" else ""
        waiter.pending.reject(
            TimeoutError(
                f"task {self.task!r}: no batch of {msg.batch_size} rows with columns {msg.columns} "
                f"(policy {msg.policy!r}) within {msg.timeout_s:g} s; {r.num_ready} rows ready{group}; "
                f"columns still missing: {missing}; {self.state.num_rows} rows known. Are the producers of the "
                f"missing columns running? Otherwise ask for fewer rows, pass partial=True, or wait longer"
            )
        )

    def _drop_waiters_locked(self, consumer: str) -> None:
        """A requeued consumer's waiting requests: answered with an error now (nobody
        reads it if the consumer is dead), never with rows."""
        dropped = [w for w in self.waiters if w.msg.consumer == consumer]
        if not dropped:
            return
        self.waiters = [w for w in self.waiters if w.msg.consumer != consumer]
        for w in dropped:
            if not w.pending.done:
                w.pending.reject(
                    RuntimeError(f"task {self.task!r}: consumer {consumer!r} was requeued as dead while this request waited")
                )

    def _tell_acked(self, indices: list[int]) -> None:
        if indices:
            self.inline.drop(indices)  # never handed out again
            self.notifier.tell(self.manager, protocol.RowsAcked(task=self.task, indices=indices))

    # -- messages ----------------------------------------------------------------------

    def handle_urgent(self, msg):
        with self._lock:
            return self._handle(msg, None)

    def handle(self, msg, pending):
        with self._lock:
            return self._handle(msg, pending)

    def _handle(self, msg, pending):
        match msg:
            case protocol.RowsWritten(shard=shard, indices=indices, columns=columns, metas=metas, inline=inline):
                self.state.on_written(shard, indices, columns, metas)
                # rows this task already finished are never handed out again: keep none of theirs
                self.inline.on_written(indices, columns, inline, skip=lambda i: self.state.state_of(i) == ACKED)
                self._serve_waiters()
                return protocol.Ok()
            case protocol.GetBatch():
                self.state.admit(msg.consumer, msg.incarnation)
                check_filters(msg.filters)
                self.inline.wanted.update(msg.columns)  # keep these columns' small cells from now on
                if msg.ack:
                    self._tell_acked(self.state.ack(msg.consumer, msg.ack))
                sel = self._select(msg)
                if sel is not None:
                    return self._reply(sel, msg.columns)
                if pending is None:
                    raise ValueError("GetBatch must be asked, not told")
                waiter = _Waiter(msg, pending)
                self.waiters.append(waiter)
                self._arm(waiter.deadline)
                return DEFER
            case protocol.Ack(consumer=consumer, indices=indices):
                self.state.admit(consumer, msg.incarnation)
                self._tell_acked(self.state.ack(consumer, indices))
                return protocol.Ok()
            case protocol.Requeue(consumer=consumer, done_columns=done_columns):
                indices, done = self.state.requeue(consumer, done_columns)
                self._tell_acked(done)
                self._drop_waiters_locked(consumer)
                self._serve_waiters()
                return protocol.Requeued(num_rows=len(indices), num_done=len(done))
            case protocol.Discard(filters=filters):
                indices = self.state.discard(filters)
                self._tell_acked(indices)
                return protocol.Discarded(indices=indices)
            case protocol.ForgetRows(indices=indices):
                self.state.forget(indices)
                self.inline.drop(indices)
                return protocol.Ok()
            case protocol.FlushNotices():
                self.notifier.flush()
                return protocol.Ok()
            case protocol.SaveController(path=path):
                self.notifier.flush()
                tmp = path + ".tmp"
                with open(tmp, "wb") as f:
                    f.write(self.state.to_bytes())
                os.replace(tmp, path)
                return protocol.Ok()
            case protocol.LoadController(path=path):
                with open(path, "rb") as f:
                    state = TaskState.from_bytes(f.read())
                if state.task != self.task:
                    raise ValueError(f"{path} holds the state of task {state.task!r}, not {self.task!r}")
                self.state = state
                self.inline.clear()  # rows come back through the shards' notices
                self._serve_waiters()
                return protocol.Ok()
            case protocol.GetTaskStatus():
                return protocol.TaskStatus(
                    task=self.task,
                    num_rows=self.state.num_rows,
                    num_pending=self.state.pending(),
                    num_acked=self.state.num_acked,
                    num_waiting=len(self.waiters),
                    acked=self.state.acked_indices(),
                )
            case protocol.Stop():
                return protocol.Ok()
