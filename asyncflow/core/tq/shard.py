"""ShardActor: a TransferQueue storage shard (``tq.shard.<i>``).

Takes: PutRows, PutRowsShm (ask: Ok), ReserveShm (ask: ShmReserved), GetRows (ask:
Rows), FreeRows (tell),
SaveShard, LoadShard (ask: ShardSaved), GetShardStats (ask: ShardStats), Ping, Stop.
Sends: RowsWritten (tell) to every controller, one per put per controller; a put of
at most ``inline_max_bytes`` carries its cells along (``inline.py``).

Invariants:
- the put is acknowledged once the rows are stored; the controllers are told from a
  background thread (queued before the acknowledgement goes out), so a producer never
  waits on a controller (a consumer that asks before the notice lands waits for it);
- a row's bytes are never copied on the shard: inline cells are views into the put's
  frame, shared-memory cells are offsets into the shard's arenas (unlinked when the
  shard stops); an arena extent is reused only after every row in it is freed;
- after LoadShard every controller is told of every loaded row (produced bits are
  rebuilt from the shards, the ground truth).
"""

from __future__ import annotations

import logging
import threading

from asyncflow.core import protocol
from asyncflow.core.actor import Actor
from asyncflow.core.tq import shm
from asyncflow.core.tq.inline import INLINE_MAX_BYTES
from asyncflow.core.tq.notify import Notifier
from asyncflow.core.tq.store import ShardStore

log = logging.getLogger(__name__)


def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class ShardActor(Actor):
    Inbox = protocol.ShardIn
    # puts and reads are served on the listener thread (no hop to the actor thread);
    # every message touching the store holds ``_lock``
    Urgent = (protocol.PutRows, protocol.PutRowsShm, protocol.ReserveShm, protocol.GetRows)

    def __init__(
        self, ctx, shard: int, controllers: list[str], arena_bytes: int = 1 << 30, inline_max_bytes: int = INLINE_MAX_BYTES
    ):
        super().__init__(ctx)
        self.inline_max_bytes = inline_max_bytes
        self._lock = threading.Lock()
        self.shard = shard
        self.controllers = list(controllers)
        self.store = ShardStore(ctx.name, arena_bytes)
        for name in shm.reap_orphans():
            log.warning("%s: removed /dev/shm/%s, left by a shard that died", ctx.name, name)
        self.notifier = Notifier(ctx.name, resolve=ctx.ref, transport=ctx.transport)

    def on_stop(self) -> None:
        self.notifier.close()
        with self._lock:
            self.store.close()

    def _notify(
        self,
        indices: list[int],
        columns: list[str],
        metas: list[protocol.RowMeta],
        inline: dict[str, list[protocol.Tensor]] | None = None,
    ) -> None:
        msg = protocol.RowsWritten(shard=self.shard, indices=indices, columns=columns, metas=metas, inline=inline or {})
        for name in self.controllers:
            self.notifier.tell(name, msg)

    def handle_urgent(self, msg):
        with self._lock:
            return self._handle(msg)

    def handle(self, msg, pending):
        with self._lock:
            return self._handle(msg)

    def _handle(self, msg):
        match msg:
            case protocol.PutRows(indices=indices, columns=columns, metas=metas):
                self.store.put(indices, columns, metas)
                small = sum(len(t.data) for cells in columns.values() for t in cells) <= self.inline_max_bytes
                self._notify(indices, list(columns), metas, columns if small else None)  # first: the consumers wait on it
                return protocol.Ok()
            case protocol.ReserveShm(num_bytes=num_bytes):
                segment, offset = self.store.reserve(num_bytes)
                return protocol.ShmReserved(segment=segment, offset=offset, num_bytes=num_bytes)
            case protocol.PutRowsShm():
                self.store.put_shm(msg.indices, msg.segment, msg.extent_offset, msg.extent_bytes, msg.columns, msg.metas)
                self._notify(msg.indices, list(msg.columns), msg.metas)
                return protocol.Ok()
            case protocol.GetRows(indices=indices, columns=columns, shm=allow_shm):
                inline, shm_columns, segments = self.store.get(indices, columns, allow_shm)
                return protocol.Rows(indices=indices, columns=inline, shm_columns=shm_columns, shm_segments=segments)
            case protocol.FreeRows(indices=indices):
                self.store.free(indices)
                return protocol.Ok()
            case protocol.SaveShard(path=path):
                self.store.save(path)
                return protocol.ShardSaved(num_rows=self.store.num_rows, num_bytes=self.store.num_bytes)
            case protocol.LoadShard(path=path):
                rows = self.store.load(path)
                by_columns: dict[tuple[str, ...], list] = {}
                for row in rows:
                    by_columns.setdefault(tuple(sorted(row.columns)), []).append(row)
                for columns, group in by_columns.items():
                    self._notify([r.index for r in group], list(columns), [r.meta for r in group])
                self.notifier.flush()
                return protocol.ShardSaved(
                    num_rows=self.store.num_rows, num_bytes=self.store.num_bytes, indices=self.store.indices()
                )
            case protocol.GetShardStats():
                return protocol.ShardStats(
                    name=self.ctx.name,
                    num_rows=self.store.num_rows,
                    num_bytes=self.store.num_bytes,
                    peak_bytes=self.store.peak_bytes,
                    rss_bytes=_proc_status_bytes("VmRSS"),
                    peak_rss_bytes=_proc_status_bytes("VmHWM"),
                    shm_bytes=self.store.shm_bytes,
                    peak_shm_bytes=self.store.shm_bytes,
                )
            case protocol.Stop():
                return protocol.Ok()
