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

Rank 0 drives the others through a ``RankGroup`` (below): one object for "every
other rank", with the commands of a step and of a checkpoint.

Takes: TrainPart, SaveRankCheckpoint (rank 0), StartWork (starts its trace; it has no
loop), GetRoleStats (urgent), Ping, Stop. Sends: RoleFailed (collector), TQ reads.
"""

from __future__ import annotations

import logging
import time
import traceback
from pathlib import Path

from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.activity import ActivityClock
from asyncflow.actors.runtime.loop import report_failure
from asyncflow.actors.runtime.run_dir import Run, set_threads
from asyncflow.actors.trainer.policy import PolicyUpdate, join_trainer_group
from asyncflow.config import names
from asyncflow.config.names import COLLECTOR
from asyncflow.core import protocol
from asyncflow.core.actor import Actor
from asyncflow.core.tq.client import TQClient
from asyncflow.planner import memory

log = logging.getLogger(__name__)


class RankGroup:
    """Rank 0's handle on the other trainer ranks (``trainer.1`` ...): each command goes
    to every rank, in rank order, as a tell (the work is joined in collectives)."""

    def __init__(self, ctx, names: list[str], wait_s: float):
        self.names = list(names)
        self._refs = [ctx.ref(name, wait_s=wait_s) for name in self.names]

    @property
    def num_ranks(self) -> int:
        """Ranks in the data-parallel group, rank 0 included."""
        return 1 + len(self._refs)

    def train_parts(self, step: int, meta: protocol.BatchMeta, parts: list[list[int]], columns: list[str]) -> None:
        """Tell rank r to read and train the rows at positions ``parts[r]`` of ``meta``
        (``parts[0]`` is rank 0's own)."""
        for ref, positions in zip(self._refs, parts[1:]):
            ref.tell(
                messages.TrainPart(
                    step=step,
                    indices=[meta.indices[p] for p in positions],
                    group_ids=[meta.metas[p].group_id for p in positions],
                    columns=columns,
                    versions=[meta.metas[p].version for p in positions],
                )
            )

    def save_checkpoint(self, path: str) -> None:
        """Every rank joins the collective save into ``path`` (rank 0 writes)."""
        self.broadcast(messages.SaveRankCheckpoint(path=path))

    def broadcast(self, msg: protocol.Request) -> None:
        for ref in self._refs:
            ref.tell(msg)


class TrainerRankActor(Actor):
    Inbox = messages.TrainerRankIn
    Urgent = (messages.GetRoleStats,)  # answered at once, mid-command

    def __init__(self, ctx, run_dir: str, rank: int):
        super().__init__(ctx)
        self.run = Run(run_dir)
        set_threads(self.run.config)
        self.rank = rank
        self._store = join_trainer_group(ctx, self.run, rank)
        self.policy = PolicyUpdate(self.run)
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.step = self.run.launch.start_step
        self.clock = ActivityClock(ctx.name, lambda: self.step)
        self.clock.state = "wait_leader"
        self.num_items = 0
        self._failed = False
        self._idle_since = time.monotonic()  # between rank 0's commands this rank waits for it

    def handle_urgent(self, msg):
        if isinstance(msg, messages.GetRoleStats):
            return self.clock.stats(self.num_items)
        return super().handle_urgent(msg)

    def handle(self, msg, pending):
        match msg:
            case messages.TrainPart():
                self._guarded(self._train_part, msg)
                return protocol.Ok()
            case messages.SaveRankCheckpoint(path=path):
                self._guarded(self._save, path)
                return protocol.Ok()
            case messages.StartWork():  # no loop of its own: rank 0 drives it; spans from now on
                self.clock.start_tracing(self.ctx.ref(COLLECTOR))
                return protocol.Ok()
            case protocol.Stop():
                return protocol.Ok()
            case _:
                raise TypeError(f"{self.ctx.name} does not handle {type(msg).__name__}")

    def on_stop(self) -> None:
        self.clock.close()

    def _guarded(self, fn, arg) -> None:
        """Run one command of rank 0; a failure is reported once and later commands are
        refused (this rank's state no longer matches the others')."""
        if self._failed:
            log.error("%s: ignoring a command after an earlier failure", self.ctx.name)
            return
        self.clock.add_wait("leader", time.monotonic() - self._idle_since)  # the time since the last command
        try:
            fn(arg)
        except Exception as exc:
            self._failed = True
            report_failure(self.ctx, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            self.clock.state = "wait_leader"
            self._idle_since = time.monotonic()

    def _train_part(self, msg: messages.TrainPart) -> None:
        with self.clock.activity("read"):
            columns = self.tq.read(msg.indices, msg.columns)
        with self.clock.activity("train"):
            self.policy.train(columns, msg.group_ids, msg.versions, msg.step)
            self.policy.batch_figures(columns)
        with self.clock.activity("sync_weights"):
            self.policy.export_weights(keep=False)
        self.num_items += len(msg.indices)
        self.step = msg.step + 1

    def _save(self, path: str) -> None:
        with self.clock.activity("checkpoint"):
            self.policy.save(Path(path))


# -- the role, as the driver sees it (actors/driver/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.TRAINER_RANK,
    actor=TrainerRankActor,
    instances=roles.numbered(names.TRAINER, lambda cfg: cfg.train.num_ranks - 1, first=1),  # trainer.1, ...
    device=roles.Devices.GROUP,
    memory=lambda cfg, facts: memory.training_state_bytes(cfg, facts.shape),
    working_memory=lambda cfg, facts: memory.training_step_bytes(cfg, facts),
    section="train",
    train_group=True,
    kwargs=lambda layout, name: {"rank": roles.index_of(name)},
)
