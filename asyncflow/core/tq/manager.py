"""QueueManagerActor: allocation, capacity and freeing for one TransferQueue
(``tq.manager``); coordinates save and load of the whole queue.

Takes: GetQueueInfo (ask: QueueInfo), Allocate (ask: Allocated, possibly later),
RowsAcked (tell, from controllers), Release (ask: Ok), SaveQueue, LoadQueue (ask:
QueueSaved), GetQueueStatus (ask: QueueStatus), FlushNotices (ask: Ok, once its frees
are delivered), Ping, Stop.
Sends: FreeRows (tell) to the shards holding freed rows, ForgetRows (tell) to every
controller; SaveController/LoadController and SaveShard/LoadShard (ask) on save/load.

Invariants (the ledger's, see ``ledger.py``):
- at most ``capacity_rows`` rows are live; an Allocate that does not fit waits
  (DEFER) until rows are freed, in arrival order; nothing is dropped; after
  ``timeout_s`` it fails with an error naming the tasks that hold rows back;
- a row is freed on its shard only once every task acked it (or its producer
  released it);
- save is meant for a quiescent queue (a step boundary): controllers, then shards,
  then the ledger. Load restores controllers first, then shards (which re-announce
  their rows), then drops allocated rows that no shard holds.
"""

from __future__ import annotations

import json
import os

import msgspec

from asyncflow.core import protocol
from asyncflow.core.actor import DEFER, Actor
from asyncflow.core.tq.ledger import Ledger, LedgerSnapshot, shard_of
from asyncflow.core.tq.notify import Notifier


class QueueManagerActor(Actor):
    Inbox = protocol.ManagerIn

    def __init__(
        self,
        ctx,
        tasks: list[str],
        shards: list[str],
        controllers: dict[str, str],
        capacity_rows: int = 65536,
        stripe_rows: int = 64,
        free_linger_s: float = 0.02,
    ):
        super().__init__(ctx)
        if sorted(controllers) != sorted(tasks):
            raise ValueError(f"controllers {sorted(controllers)} must name one controller per task {sorted(tasks)}")
        if not shards:
            raise ValueError("a queue needs at least one shard")
        self.shards = list(shards)
        self.controllers = dict(controllers)
        self.stripe_rows = stripe_rows
        self.ledger = Ledger(tasks, capacity_rows)
        # frees go to shards and controllers in batches (the ledger's capacity is freed at once)
        self.notifier = Notifier(ctx.name, resolve=ctx.ref, linger_s=free_linger_s, transport=ctx.transport)

    def on_stop(self) -> None:
        self.notifier.close()

    def _free(self, indices: list[int]) -> None:
        if not indices:
            return
        by_shard: dict[int, list[int]] = {}
        for i in indices:
            by_shard.setdefault(shard_of(i, self.stripe_rows, len(self.shards)), []).append(i)
        for s, rows in by_shard.items():
            self.notifier.tell(self.shards[s], protocol.FreeRows(indices=rows))
        for name in self.controllers.values():
            self.notifier.tell(name, protocol.ForgetRows(indices=indices))
        for token, metas in self.ledger.serve_waiting():
            token.resolve(protocol.Allocated(metas=metas))

    def _expire(self, pending, msg: protocol.Allocate) -> None:
        if pending.done or not self.ledger.cancel(pending):
            return
        lagging = {t: 0 for t in self.ledger.tasks}
        bits = {t: 1 << k for k, t in enumerate(self.ledger.tasks)}
        for mask in self.ledger.live.values():
            for t, bit in bits.items():
                if not mask & bit:
                    lagging[t] += 1
        detail = ", ".join(f"{t!r} has not acked {n}" for t, n in lagging.items() if n)
        pending.reject(
            TimeoutError(
                f"queue full: {len(self.ledger.live)} of capacity_rows={self.ledger.capacity_rows} rows live; "
                f"{msg.num_groups} x {msg.group_size} rows waited {msg.timeout_s:g} s. Rows are freed when every "
                f"task acks them: {detail or 'no task lags (rows allocated but not written?)'}. "
                f"Speed up or add consumers, or raise capacity_rows"
            )
        )

    def _info(self) -> protocol.QueueInfo:
        return protocol.QueueInfo(
            shards=self.shards,
            controllers=self.controllers,
            stripe_rows=self.stripe_rows,
            capacity_rows=self.ledger.capacity_rows,
        )

    def handle(self, msg, pending):
        match msg:
            case protocol.GetQueueInfo():
                return self._info()
            case protocol.Allocate(num_groups=num_groups, group_size=group_size, step=step):
                headroom = msg.headroom_rows
                metas = self.ledger.try_allocate(num_groups, group_size, step, headroom)
                if metas is not None:
                    extra = self.ledger.allocate_extra(msg.extra_groups, group_size, step, headroom)
                    return protocol.Allocated(metas=metas, extra=extra)
                if pending is None:
                    raise ValueError("Allocate must be asked, not told")
                self.ledger.wait(pending, num_groups, group_size, step, headroom)
                self.call_later(msg.timeout_s, lambda: self._expire(pending, msg))
                return DEFER
            case protocol.RowsAcked(task=task, indices=indices):
                self._free(self.ledger.acked(task, indices))
                return protocol.Ok()
            case protocol.Release(indices=indices):
                self._free(self.ledger.release(indices))
                return protocol.Ok()
            case protocol.SaveQueue(path=path):
                return self._save(path)
            case protocol.LoadQueue(path=path):
                return self._load(path)
            case protocol.FlushNotices():
                self.notifier.flush()
                return protocol.Ok()
            case protocol.GetQueueStatus():
                return protocol.QueueStatus(
                    num_live_rows=len(self.ledger.live),
                    capacity_rows=self.ledger.capacity_rows,
                    num_waiting_allocations=self.ledger.num_waiting,
                    next_index=self.ledger.next_index,
                    num_freed_rows=self.ledger.num_freed,
                )
            case protocol.Stop():
                return protocol.Ok()

    # -- save/load ---------------------------------------------------------------------

    def _save(self, path: str) -> protocol.QueueSaved:
        os.makedirs(path, exist_ok=True)
        self.notifier.flush()
        for task, name in self.controllers.items():
            self.ctx.ref(name).ask(protocol.SaveController(path=os.path.join(path, f"controller-{task}.msgpack")), timeout_s=60)
        num_rows = num_bytes = 0
        for k, name in enumerate(self.shards):
            saved = self.ctx.ref(name).ask(protocol.SaveShard(path=os.path.join(path, f"shard-{k}.msgpack")), timeout_s=600)
            num_rows += saved.num_rows
            num_bytes += saved.num_bytes
        with open(os.path.join(path, "ledger.msgpack"), "wb") as f:
            f.write(msgspec.msgpack.encode(self.ledger.snapshot()))
        manifest = {"tasks": self.ledger.tasks, "num_shards": len(self.shards), "stripe_rows": self.stripe_rows}
        with open(os.path.join(path, "queue.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        return protocol.QueueSaved(num_rows=num_rows, num_bytes=num_bytes)

    def _load(self, path: str) -> protocol.QueueSaved:
        with open(os.path.join(path, "queue.json")) as f:
            manifest = json.load(f)
        if manifest["num_shards"] != len(self.shards) or manifest["stripe_rows"] != self.stripe_rows:
            raise ValueError(
                f"{path} was saved by a queue of {manifest['num_shards']} shards and stripe_rows="
                f"{manifest['stripe_rows']}; this queue has {len(self.shards)} and {self.stripe_rows}: "
                f"start the queue with the same layout to load it"
            )
        if sorted(manifest["tasks"]) != sorted(self.ledger.tasks):
            raise ValueError(f"{path} was saved with tasks {manifest['tasks']}, this queue has {self.ledger.tasks}")
        with open(os.path.join(path, "ledger.msgpack"), "rb") as f:
            snap = msgspec.msgpack.decode(f.read(), type=LedgerSnapshot)
        snap.capacity_rows = self.ledger.capacity_rows
        self.ledger = Ledger.restore(snap)
        for task, name in self.controllers.items():
            self.ctx.ref(name).ask(protocol.LoadController(path=os.path.join(path, f"controller-{task}.msgpack")), timeout_s=60)
        held: set[int] = set()
        num_bytes = 0
        for k, name in enumerate(self.shards):
            loaded = self.ctx.ref(name).ask(protocol.LoadShard(path=os.path.join(path, f"shard-{k}.msgpack")), timeout_s=600)
            held.update(loaded.indices)
            num_bytes += loaded.num_bytes
        unwritten = [i for i in self.ledger.live if i not in held]  # allocated, never written
        stale = [i for i in held if i not in self.ledger.live]  # freed while the save ran
        self._free(self.ledger.release(unwritten) + stale)
        held.difference_update(stale)
        return protocol.QueueSaved(num_rows=len(held), num_bytes=num_bytes)
