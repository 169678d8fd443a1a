"""ControllerActor: the TransferQueue controller of one consuming task
(``tq.controller.<task>``, e.g. ``tq.controller.train``).

Takes: RowsWritten (tell, from shards), GetBatch (ask: BatchMeta, possibly later), Wake (tell),
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
  names the task, the columns still missing and how many rows are ready (a partial
  one with ``min_rows`` gets no rows then instead, as it does when its client's Wake
  comes: no poller asks again and again, however many wait);
- a notice that makes no row ready tries no waiting request, and one that does tries
  one request per signature that cannot be served (``_signature``) and one per request
  served, each from the state's per-step counts (``state.py``): the cost of a notice
  does not grow with the number of waiting consumers;
- after LoadController, rows that were handed out but not acked are handed out again;
- a Requeue of a consumer, under the same lock as the shards' notices, also drops its
  waiting GetBatch requests and retires its incarnations (``TaskState.admit``): no row
  written after it is handed to the dead consumer, and its later requests are refused.
"""

from __future__ import annotations

import heapq
import os
import threading
import time
from collections import deque

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor, Pending
from asyncflow.core.tq.inline import InlineCache
from asyncflow.core.tq.notify import Notifier
from asyncflow.core.tq.state import ACKED, TaskState, check_filters


class _Waiter:
    __slots__ = ("msg", "pending", "deadline", "seq", "live")

    def __init__(self, msg: protocol.GetBatch, pending: Pending, seq: int):
        self.msg = msg
        self.pending = pending
        self.deadline = time.monotonic() + msg.timeout_s
        self.seq = seq  # arrival order
        self.live = True


def _signature(msg: protocol.GetBatch) -> tuple:
    """What decides whether a request can be served (everything but who asks): of two
    waiting requests with one signature, the later can be served only if the earlier can."""
    return (tuple(msg.columns), msg.batch_size, msg.policy, msg.partial, msg.min_rows, msg.dp_size, tuple(msg.filters))


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
        # waiting requests, in arrival order per signature (``_serve_waiters`` tries one per
        # signature, not every one); by client, for its Wake; by deadline, for the timer
        self._queues: dict[tuple, deque[_Waiter]] = {}
        self._by_incarnation: dict[str, list[_Waiter]] = {}
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._num_waiting = 0
        self._next_seq = 0
        self._wakes: dict[str, int] = {}  # incarnation -> its newest Wake
        self.inline = InlineCache()  # small rows' cells, answered with their metadata
        self._timer_at: float | None = None  # when the armed timer fires
        # acks go to the manager in batches: capacity frees a few ms later, for far fewer messages
        self.notifier = Notifier(ctx.name, resolve=ctx.ref, linger_s=ack_linger_s, transport=ctx.transport)

    def on_stop(self) -> None:
        self.notifier.close()
        with self._lock:
            for w in self._live_waiters():
                self._finish(w)
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
            min_rows=msg.min_rows if msg.partial else 0,
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

    def _empty(self) -> protocol.BatchMeta:
        return protocol.BatchMeta(task=self.task, indices=[], metas=[], shards=[])

    def _live_waiters(self) -> list[_Waiter]:
        return sorted((w for q in self._queues.values() for w in q if w.live), key=lambda w: w.seq)

    def _wait(self, msg: protocol.GetBatch, pending: Pending) -> None:
        waiter = _Waiter(msg, pending, self._next_seq)
        self._next_seq += 1
        self._queues.setdefault(_signature(msg), deque()).append(waiter)
        if msg.incarnation:
            self._by_incarnation.setdefault(msg.incarnation, []).append(waiter)
        heapq.heappush(self._deadlines, (waiter.deadline, waiter.seq, waiter))
        self._num_waiting += 1
        self._arm(waiter.deadline)

    def _finish(self, waiter: _Waiter) -> None:
        """No longer waiting (answered, expired, woken, dropped); its queue entries go lazily."""
        if not waiter.live:
            return
        waiter.live = False
        self._num_waiting -= 1
        mine = self._by_incarnation.get(waiter.msg.incarnation)
        if mine is not None:
            mine.remove(waiter)
            if not mine:
                del self._by_incarnation[waiter.msg.incarnation]

    def _front(self, key: tuple) -> _Waiter | None:
        """The first live waiter of a signature (dropping those answered meanwhile)."""
        q = self._queues[key]
        while q and not (q[0].live and not q[0].pending.done):
            self._finish(q.popleft())
        if not q:
            del self._queues[key]
            return None
        return q[0]

    def _serve_waiters(self) -> None:
        """Serve waiting requests in arrival order while they can be served: one try per
        signature that cannot (the rest of its queue cannot either), one per request
        that can."""
        if not self._num_waiting:
            return
        heap = []
        for key in list(self._queues):
            front = self._front(key)
            if front is not None:
                heap.append((front.seq, key))
        heapq.heapify(heap)
        while heap:
            _, key = heapq.heappop(heap)
            w = self._queues[key][0]
            try:
                sel = self._select(w.msg)
            except ValueError as exc:  # e.g. a batch that is not whole groups: that asker's error
                self._finish(w)
                w.pending.reject(exc)
                sel = False
            if sel is None:
                continue  # this signature waits on
            if sel is not False:
                self._finish(w)
                w.pending.resolve(self._reply(sel, w.msg.columns))
            front = self._front(key)
            if front is not None:
                heapq.heappush(heap, (front.seq, key))

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
            deadlines = self._deadlines
            while deadlines and (deadlines[0][0] <= now or not deadlines[0][2].live):
                _, _, waiter = heapq.heappop(deadlines)
                if waiter.live:
                    self._expire_locked(waiter)
            if deadlines:
                self._arm(deadlines[0][0])

    def _expire_locked(self, waiter: _Waiter) -> None:
        self._finish(waiter)
        if waiter.pending.done:
            return
        msg = waiter.msg
        if msg.partial:  # a waiting partial request: no rows yet, which is an answer
            waiter.pending.resolve(self._empty())
            return
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

    def _wake(self, incarnation: str, wakes: int) -> None:
        """A client's Wake: its requests sent before it are answered with no rows."""
        if wakes <= self._wakes.get(incarnation, 0):
            return
        self._wakes[incarnation] = wakes
        for w in list(self._by_incarnation.get(incarnation, ())):
            if w.msg.wakes < wakes:
                self._finish(w)
                if not w.pending.done:
                    w.pending.resolve(self._empty())

    def _drop_waiters_locked(self, consumer: str) -> None:
        """A requeued consumer's waiting requests: answered with an error now (nobody
        reads it if the consumer is dead), never with rows."""
        for w in [w for w in self._live_waiters() if w.msg.consumer == consumer]:
            self._finish(w)
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
                changed = self.state.on_written(shard, indices, columns, metas)
                # rows this task already finished are never handed out again: keep none of theirs
                self.inline.on_written(indices, columns, inline, skip=lambda i: self.state.state_of(i) == ACKED)
                if changed:  # else no waiting request can be served that could not before
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
                if msg.incarnation and msg.wakes < self._wakes.get(msg.incarnation, 0):
                    return self._empty()  # its client woke it before it arrived
                if pending is None:
                    raise ValueError("GetBatch must be asked, not told")
                self._wait(msg, pending)
                return DEFER
            case protocol.Wake(incarnation=incarnation, wakes=wakes):
                self._wake(incarnation, wakes)
                return protocol.Ok()
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
                keys = [self.state.meta(i).key for i in indices]
                self._tell_acked(indices)
                return protocol.Discarded(indices=indices, keys=keys)
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
                    num_waiting=self._num_waiting,
                    acked=self.state.acked_indices(),
                    num_discarded=self.state.num_discarded,
                )
            case protocol.Stop():
                return protocol.Ok()
