"""The driver's side of online reallocation: starts the planner actor and carries
out the moves it asks for, in the driver's main thread (the only thread that starts
and stops processes, so a move never races the restart of a failed worker).

A move sets the split to the decision's ``split_after``. Adding a replica: the
trainer first gives up the torch threads it loses (SetThreads), then the Supervisor
starts a new ``rollout.<i>`` process host (a new name, never a reused one); from then
on the driver's roster lists it, so the weight sync's next announcement reaches it (the
replica fetches the newest weights itself when it starts), and it starts working. A
move to training: the Supervisor forgets the newest replica (out of the roster, never
restarted), the weight sync releases what it held for it (ReplicaRemoved: its swap
grant, its channel), its loop is stopped (Stop is answered between units, so every row
it took is put and acked), its process stopped, any row it still held requeued; then
the trainer gets the threads.

The Scaler is given what it uses (the config, the Supervisor, the directory client and
transport, the roles, the collector's subscription and whether the run is stopping),
not the launcher.

Each move is answered to the planner with MoveApplied (the new split, or the error).
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from pathlib import Path

import click
import pykka

from asyncflow.actors.driver import topology
from asyncflow.actors.driver.planner_actor import PlannerActor
from asyncflow.actors.driver.supervisor import Supervisor
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.spec import RoleSpec
from asyncflow.config import names
from asyncflow.config.run import RunConfig
from asyncflow.core import protocol
from asyncflow.core.actor import ServedActor, serve_actor
from asyncflow.core.directory_client import DirectoryClient
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.tq.client import TQClient
from asyncflow.planner.online import MoveDecision


class Scaler:
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        supervisor: Supervisor,
        dc: DirectoryClient,
        roles: list[RoleSpec],
        subscribe: Callable[[list], None],
        stopping: Callable[[], bool],
    ):
        self.cfg, self.run_dir, self.supervisor, self.dc, self.roles = cfg, run_dir, supervisor, dc, roles
        self.subscribe = subscribe  # the collector's StepMetrics go to these in-process refs
        self.stopping = stopping
        self.train_threads = cfg.planner.train_threads or cfg.cluster.threads_per_process
        self.next_index = len(self.replicas)  # a new replica gets a new name, never a reused one
        self.moves: queue.Queue[MoveDecision] = queue.Queue()
        self.planner: ServedActor | None = None

    @property
    def replicas(self) -> list[str]:
        """The rollout replicas now (the supervisor's record, oldest first)."""
        return self.supervisor.names(names.ROLLOUT)

    def start(self) -> None:
        """Start the planner (after the trainer's process) and subscribe it to StepMetrics."""
        cfg = self.cfg
        self.planner = serve_actor(
            PlannerActor,
            names.PLANNER,
            self.dc.transport,
            directory_address=self.dc.address,
            run_dir=str(self.run_dir),
            config=cfg.planner,
            rollout_replicas=self.replicas,
            train_threads=self.train_threads,
            apply=self.moves.put,
            num_steps=cfg.train.num_steps,
            cores=(cfg.planner.cores or os.cpu_count() or 1) if cfg.cluster.device == "cpu" else 0,
        )
        self.dc.register(self.planner.entry())
        self.subscribe([self.planner.pykka_ref])

    def stop(self) -> None:
        if self.planner is not None:
            self.subscribe([])
            self.planner.stop(timeout_s=120)
            self.planner = None

    def apply_pending(self) -> None:
        """Carry out the moves the planner asked for (called from the driver's loop)."""
        while not self.stopping():
            try:
                decision = self.moves.get_nowait()
            except queue.Empty:
                return
            applied = self.apply(decision)
            try:
                if self.planner is None:  # stopped meanwhile
                    raise pykka.ActorDeadError("the planner was stopped")
                self.planner.pykka_ref.tell(applied)
            except pykka.ActorDeadError:  # the planner failed (its error is in the log): the run goes on without it
                click.echo(
                    f"!! planner: gone; the split stays {applied.rollout_replicas}, {applied.train_threads} trainer threads",
                    err=True,
                )

    def apply(self, decision: MoveDecision) -> messages.MoveApplied:
        """Reach ``decision.split_after``: replicas = rollout_workers, trainer threads =
        train_workers (threads given up first, so the new replica finds the core free)."""
        n, target = decision.num_workers, decision.split_after
        try:
            if target.train_workers < self.train_threads:
                self._set_train_threads(target.train_workers)
            while len(self.replicas) < target.rollout_workers:
                self._add_replica()
            while len(self.replicas) > target.rollout_workers:
                self._remove_replica()
            if target.train_workers > self.train_threads:
                self._set_train_threads(target.train_workers)
        except (AsyncflowError, LookupError, ValueError) as exc:
            click.echo(f"!! planner: the move {n} {decision.from_role} -> {decision.to_role} failed: {exc}", err=True)
            return messages.MoveApplied(
                ok=False, rollout_replicas=list(self.replicas), train_threads=self.train_threads, error=str(exc)
            )
        return messages.MoveApplied(ok=True, rollout_replicas=list(self.replicas), train_threads=self.train_threads)

    # -- the pieces of a move ----------------------------------------------------------------
    def _set_train_threads(self, num_threads: int) -> None:
        if num_threads < 1:
            raise ValueError(f"the trainer would be left with {num_threads} threads; it needs at least 1")
        self.dc.ref(names.TRAINER).ask(messages.SetThreads(num_threads=num_threads), timeout_s=600)
        self.train_threads = num_threads

    def _add_replica(self) -> None:
        name = names.replica(names.ROLLOUT, self.next_index)
        self.next_index += 1
        role = topology.built_in(names.ROLLOUT)
        self.supervisor.add(topology.role_host(role, name, topology.layout(self.roles, self.cfg), str(self.run_dir)))
        self.dc.ref(name).ask(messages.StartWork(), timeout_s=30)  # in the roster from here: the next version reaches it

    def _remove_replica(self) -> None:
        if len(self.replicas) <= 1:
            raise ValueError("rollout would be left without a replica")
        name = self.replicas[-1]
        # first, so the driver neither restarts it nor finishes a planned restart, and out of the roster
        host = self.supervisor.remove(name)
        self.dc.ref(names.WEIGHTS).ask(messages.ReplicaRemoved(replica=name), timeout_s=30)
        self.dc.ref(name).ask(protocol.Stop(), timeout_s=600)  # answered after its current unit
        if host.proc is not None:
            host.proc.stop(timeout_s=20)
        tq = TQClient(self.dc, consumer="driver")
        requeued = tq.requeue(names.TASK_ROLLOUT, name)
        tq.close()
        if requeued:
            click.echo(f"planner: requeued {requeued} rows {name} still held", err=True)
