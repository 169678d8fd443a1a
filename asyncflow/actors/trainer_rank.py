"""TrainerRankActor: trainer rank r > 0 of a data-parallel trainer (``train.num_ranks``).

Rank 0 (TrainerActor, ``trainer``) owns the step: it asks the queue for the batch
split into whole prompt groups per rank and tells this actor its part (TrainPart,
row indices only). This rank reads those rows straight from the storage shards,
trains them with its FSDP2 shard of the policy, and joins the step's collectives
(gradient reduce-scatter, the figures, the weight gather rank 0 publishes). It has
no loop of its own: it works when rank 0 tells it to, in the order told. At a
checkpoint it joins the collective save (SaveRankCheckpoint); rank 0 writes.

Its rows are acked by rank 0 after the step: every rank has finished with them by
then, because the step ends in collectives every rank joins.

If this process dies the run stops (the launcher reports it and says how to
resume); if rank 0 dies, this rank's next collective fails (at once when the
peer's socket closes, after ``train.dist_timeout_s`` when a link is cut) and the
failure is reported to the collector. Nothing waits forever.

Takes: TrainPart, SaveRankCheckpoint, StartWork, Pause, Resume, GetRoleStats,
SetThreads, Ping, Stop. Sends: RoleFailed (collector), TQ reads.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

from asyncflow.actors import names, roles
from asyncflow.actors._loop import LoopActor
from asyncflow.actors._policy import PolicyUpdate, join_trainer_group
from asyncflow.actors._run import Run, set_threads
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient

log = logging.getLogger(__name__)


def rank_name(rank: int) -> str:
    return f"trainer.{rank}"


class TrainerRankActor(LoopActor):
    Inbox = protocol.TrainerRankIn

    def __init__(self, ctx, run_dir: str, rank: int):
        super().__init__(ctx)
        self.run = Run(run_dir)
        set_threads(self.run.config)
        self.rank = rank
        self._store = join_trainer_group(ctx, self.run, rank)
        self.policy = PolicyUpdate(self.run)
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.step = self.run.launch.start_step
        self._failed = False
        self._idle_since = time.monotonic()  # between rank 0's commands this rank waits for it
        self._state = "wait_leader"

    @property
    def version(self) -> int:
        return self.step

    def _schedule(self) -> None:
        """No loop of its own (no units to tick): rank 0 drives this rank with TrainPart."""

    def handle(self, msg, pending):
        match msg:
            case protocol.TrainPart():
                self._guarded(self._train_part, msg)
                return protocol.Ok()
            case protocol.SaveRankCheckpoint(path=path):
                self._guarded(self._save, path)
                return protocol.Ok()
            case _:
                return super().handle(msg, pending)

    def _guarded(self, fn, arg) -> None:
        """Run one command of rank 0; a failure is reported once and later commands are
        refused (this rank's state no longer matches the others')."""
        if self._failed:
            log.error("%s: ignoring a command after an earlier failure", self.ctx.name)
            return
        now = time.monotonic()
        with self._stats_lock:  # the time since the last command: waiting for rank 0
            self._wait_s["leader"] = self._wait_s.get("leader", 0.0) + now - self._idle_since
        try:
            fn(arg)
        except Exception as exc:
            self._failed = True
            self._report_failure(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self._state = "wait_leader"
            self._idle_since = time.monotonic()

    def _train_part(self, msg: protocol.TrainPart) -> None:
        with self.activity("read"):
            columns = self.tq.read(msg.indices, msg.columns)
        with self.activity("train"):
            self.policy.train(columns, msg.group_ids)
            self.policy.batch_figures(columns)
        with self.activity("sync_weights"):
            self.policy.export_weights(keep=False)
        self.num_items += len(msg.indices)
        self.step = msg.step + 1

    def _save(self, path: str) -> None:
        with self.activity("checkpoint"):
            self.policy.save(Path(path))


# -- the role, as the driver sees it (actors/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.TRAINER_RANK, actor=TrainerRankActor, section="train",
    instances=roles.numbered(names.TRAINER, lambda cfg: cfg.train.num_ranks - 1, first=1),  # trainer.1, ...
    device=roles.Devices.GROUP, device_list="train_devices", train_group=True,
    kwargs=lambda layout, name: {"rank": roles.index_of(name)},
)
