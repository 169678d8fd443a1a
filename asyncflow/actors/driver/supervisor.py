"""Supervisor: the driver's one record of the run's process hosts, and the only code
that changes it.

It holds one ``dict[name, HostRecord]``: each host's plan (kind, RoleSpec, actor
specs), its process handle, and when a dead one is to be started again. It starts
the hosts (local processes, or Ray's: ``spawn``), restarts a dead worker of a
restartable role after requeueing the rows it held (``_on_death``, the restart
policy of ``_restarts.py``), and adds or removes a host when the online planner
moves a replica (``_scaling.py`` asks; it never edits the record). Everything else
reads it: the launcher's stop, the cluster file, the hang report, every process
that needs the rollout replicas of now (the weight sync, the trainer's checkpoint
pause) through the driver's ``roster`` actor (``roster.py``, ``replicas``), and the
gateway front in the driver (``replica_indices``: which replicas sessions may go to).

Invariants:
- a host is in the record from its plan until it is removed; ``proc`` is None only
  before its first start;
- a dead host is handled once: its rows are requeued and it gets a ``restart_at``;
  until it is started again ``check`` does not see it as a new death;
- a death that cannot be healed in place (a host of no restartable role, a queue that
  does not answer the requeue, a spent restart budget) raises ``RunFailed(process_lost=True)``;
- a host frozen past ``cluster.transport.freeze_timeout_s`` (``_freezes.py``, local
  launcher) is killed in ``check`` and handled as a death from there, named as frozen;
- a death is named by how it ended (``_oom.py``): a SIGKILL while the cgroup's
  out-of-memory count grew (local launcher) is named an out-of-memory kill, with the
  run's memory estimate for the host and what to change.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import click

from asyncflow.actors.driver._freezes import FreezeWatch
from asyncflow.actors.driver._oom import OomCount, death_words, host_estimate
from asyncflow.actors.driver._restarts import RestartPolicy
from asyncflow.actors.driver.topology import HostPlan
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.spec import Devices, RoleSpec, index_of, task_of
from asyncflow.config import names
from asyncflow.config.load import ConfigError
from asyncflow.config.run import RunConfig
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.host import CPUS_ENV, HostProcess, spawn_host
from asyncflow.core.tq.client import TQClient
from asyncflow.core.transport import TransportConfig

START_WORK_S = 30.0
"""How long a restarted worker may take to answer StartWork (after its actors' start)."""


class RunFailed(AsyncflowError):
    """The run cannot go on. ``process_lost``: because a process (or its node) that
    cannot be restarted alone is gone, which a resume from the last checkpoint heals
    (``cluster.max_resumes``); otherwise a role raised, which resuming would repeat."""

    def __init__(self, message: str, process_lost: bool = False, advice_after_stop: bool = False):
        super().__init__(message)
        self.process_lost = process_lost
        self.advice_after_stop = advice_after_stop
        """The resume hint is still to come: the launcher adds it once every process has stopped."""

    def add_advice(self, advice: str) -> None:
        """Append the resume hint (a line of its own), once."""
        self.args = (f"{self.args[0]}\n{advice}", *self.args[1:])
        self.advice_after_stop = False


@dataclass
class HostRecord:
    plan: HostPlan
    proc: HostProcess | None = None
    """None until it is first started."""
    restart_at: float | None = None
    """Dead and requeued: when to start it again (time.monotonic)."""
    killed_frozen: str = ""
    """Why the driver killed it, frozen too long (its death is named so); "" otherwise."""

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def role(self) -> RoleSpec | None:
        return self.plan.role

    def alive(self) -> bool:
        """Whether its process is up (True before it is started); a Ray host also
        answers for its heartbeat (``ray_hosts.py``)."""
        return self.proc is None or self.proc.alive()


def num_devices(role: RoleSpec | None, cfg: RunConfig) -> int:
    """How many devices one host of ``role`` uses (what Ray reserves for it)."""
    if role is None or role.device is Devices.NONE:
        return 0
    if role.device is Devices.ONE or cfg.train.num_ranks > 1:
        return 1
    return max(1, len(role.devices(cfg)))


def visible_devices(role: RoleSpec | None, name: str, cfg: RunConfig) -> str | None:
    """The devices host ``name`` of ``role`` may see (its *_VISIBLE_DEVICES), or None:
    every device (no device list, or an instance the planner added beyond the list)."""
    if role is None or role.device is Devices.NONE:
        return None
    ids = role.devices(cfg)
    if role.device is Devices.GROUP and cfg.train.num_ranks == 1:  # alone: the whole list
        return ",".join(map(str, ids)) if ids else None
    index = index_of(name)
    return str(ids[index]) if index < len(ids) else None


def pinned_cores(cfg: RunConfig, train_group: bool, n: int | None = None) -> dict[str, str]:
    """``[cluster] pin_trainer_cores`` (async): the cores a process may run on
    (``core/host.py`` applies them), the first ones to the training group's processes.
    ``n``: the run's decision (``_pinning.pinning``); None: the config's value."""
    n = cfg.cluster.pin_trainer_cores if n is None else n
    if n == 0 or cfg.workflow.mode != "async":
        return {}
    cores = sorted(os.sched_getaffinity(0))
    if n >= len(cores):
        raise ConfigError(
            f"cluster.pin_trainer_cores = {n}: the driver may use {len(cores)} cores ({cores}) and the "
            f"other processes need at least one; use at most {len(cores) - 1}, or 0 to pin nothing"
        )
    mine = cores[:n] if train_group else cores[n:]
    return {CPUS_ENV: ",".join(map(str, mine))}


class Supervisor:
    def __init__(self, cfg: RunConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        self._hosts: dict[str, HostRecord] = {}
        self._lock = threading.Lock()  # the roster actor reads the record from its own thread (``replicas``)
        c = cfg.cluster
        self.restart_policy = RestartPolicy(c.max_restarts_per_role, c.restart_window_s, c.restart_backoff_s)
        self.restarts: list[dict] = []  # each restart, for summary.json
        self.spawn = spawn_host  # with [cluster] launcher = "ray": RayHosts.spawn (actors/driver/ray_hosts.py)
        # every host of the launch at once: name -> its env. None: ``spawn`` each (local: a Popen, no wait)
        self.spawn_many: (
            Callable[[DirectoryClient, TransportConfig, dict[str, dict[str, str]]], Mapping[str, HostProcess]] | None
        ) = None
        self.dc: DirectoryClient | None = None
        self.transport: TransportConfig | None = None
        self.env: dict[str, str] = {}
        self.pin_cores: int | None = None  # the run's pinning decision (actors/driver/_pinning.py); None: the config's
        self.on_restart: Callable[[], None] = lambda: None  # the launcher rewrites cluster.json (the new pid)
        self.freezes: FreezeWatch | None = None  # the local launcher's watch of frozen hosts (Launcher.start)
        self.oom: OomCount | None = None  # the local launcher's cgroup out-of-memory count (_oom.py); None: cannot tell
        # the preflight's memory estimate per role instance (bytes), asked only when a death is named an OOM kill
        self.memory_estimates: Callable[[], Mapping[str, float]] = dict

    # -- reading --------------------------------------------------------------------------
    def names(self, kind: str | None = None) -> list[str]:
        """The hosts (of one kind: a role's name, or topology.QUEUE / SHARD), in start order."""
        return [h for h, r in self._hosts.items() if kind is None or r.plan.kind == kind]

    def replicas(self) -> list[str]:
        """The rollout replicas now (actors: several per host when packed), oldest first: what the ``roster`` actor answers (from
        its own thread: a copy under the lock that guards every change of the record). Those of a host whose death was handled
        are left out until its restart begins (``restart_at`` set): nobody is there to hear an announcement or a Pause (told
        in turn, the 32 dead replicas of a killed pack held every weight version 96 s), and the restarted replicas ask for the
        newest weights as they start (``rollout/actor.py``), after their host is back in this list."""
        with self._lock:
            return [
                w for r in self._hosts.values() if r.plan.kind == names.ROLLOUT and r.restart_at is None for w in r.plan.workers
            ]

    def replica_indices(self) -> list[int]:
        """The indices of the run's rollout replicas now, those dead and restarting in place
        included (they keep their gateway sessions): the gateway front's roster (``launcher.py``),
        read from the front's thread under the lock. A replica the planner adds is in it from its
        start, one it removes out from its removal."""
        with self._lock:
            return [index_of(w) for r in self._hosts.values() if r.plan.kind == names.ROLLOUT for w in r.plan.workers]

    def workers(self) -> list[str]:
        """The role actors, in the order they are started and stopped: the training group
        last, rank 0 first (Stop reaches it before the ranks it drives)."""
        roles = [(w, r.role) for r in self._hosts.values() if r.role is not None for w in r.plan.workers]
        return [name for name, role in roles if not role.train_group] + [name for name, role in roles if role.train_group]

    def procs(self) -> dict[str, HostProcess]:
        """Every started host's process handle (a copy)."""
        return {h: r.proc for h, r in self._hosts.items() if r.proc is not None}

    def _host_of(self, actor: str) -> HostRecord | None:
        return next((r for r in self._hosts.values() if any(s.name == actor for s in r.plan.specs)), None)

    def runs(self, actor: str) -> bool:
        """Whether a host of this run plans ``actor`` and its process is up."""
        record = self._host_of(actor)
        return record is not None and record.alive()

    def actor_alive(self, actor: str) -> bool:
        """Whether the process hosting ``actor`` is up (True when unknown)."""
        record = self._host_of(actor)
        return record is None or record.alive()

    def log_file(self, actor: str) -> Path:
        """RUN_DIR/logs/<process>.log: the whole log of the process hosting ``actor``."""
        record = self._host_of(actor)
        return self.run_dir / "logs" / f"{record.name if record else actor}.log"

    def num_devices(self, host: str) -> int:
        record = self._hosts.get(host)
        return num_devices(record.role if record else None, self.cfg)

    def host_env(self, host: str) -> dict[str, str]:
        """Environment of one process: the common one plus its cores and the devices it may see."""
        record = self._hosts[host]
        env = {**self.env, **pinned_cores(self.cfg, record.role is not None and record.role.train_group, self.pin_cores)}
        devices = visible_devices(record.role, host, self.cfg)
        if devices is None or self.cfg.cluster.device == "cpu":
            return env
        var = "ASCEND_RT_VISIBLE_DEVICES" if self.cfg.cluster.device == "npu" else "CUDA_VISIBLE_DEVICES"
        return {**env, var: devices}

    # -- changing the record: plan, start, add, remove, restart ---------------------------------
    def plan(self, plans: list[HostPlan]) -> None:
        """The hosts to start (before ``start``)."""
        with self._lock:
            for p in plans:
                self._hosts[p.name] = HostRecord(p)

    def attach(self, dc: DirectoryClient, transport: TransportConfig, env: dict[str, str]) -> None:
        """The directory, transport and common environment every host is started with."""
        self.dc, self.transport, self.env = dc, transport, env

    def spawn_all(self) -> None:
        """Start every planned host's process (its actors come with ``start_actors``)."""
        assert self.dc is not None and self.transport is not None, "attach() comes first"
        if self.spawn_many is not None:  # Ray: placed, started and registered together (ray_hosts.py)
            procs = self.spawn_many(self.dc, self.transport, {name: self.host_env(name) for name in self._hosts})
            for name, record in self._hosts.items():
                record.proc = procs[name]
            return
        for record in self._hosts.values():
            record.proc = self.spawn(record.name, self.dc, self.transport, env=self.host_env(record.name))

    def start_actors(self, hosts: list[str]) -> None:
        """Start the actors of ``hosts``, all at once; RunFailed names a host that could not."""
        procs: dict[str, HostProcess] = {}
        for h in hosts:
            proc = self._hosts[h].proc
            assert proc is not None, "spawn_all() or add() comes first"
            procs[h] = proc
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            futures = {h: pool.submit(p.start, self._hosts[h].plan.specs, timeout_s=300) for h, p in procs.items()}
        for host, future in futures.items():
            exc = future.exception()
            if isinstance(exc, (AsyncflowError, LookupError)):  # a clean stop, not a traceback
                raise RunFailed(f"process {host!r} could not start its actors: {exc} (traceback in {self.log_file(host)})")
            future.result()

    def add(self, plan: HostPlan) -> HostRecord:
        """Start one more host and its actors while the run goes on (a replica the planner
        adds); restarted like the others if it dies. Not recorded if it fails to start."""
        assert self.dc is not None and self.transport is not None, "attach() comes first"
        with self._lock:
            record = self._hosts[plan.name] = HostRecord(plan)  # recorded first: its env and Ray bundle read it
        try:
            record.proc = self.spawn(plan.name, self.dc, self.transport, plan.specs, env=self.host_env(plan.name))
        except BaseException:
            with self._lock:
                del self._hosts[plan.name]
            raise
        return record

    def remove(self, host: str) -> HostRecord:
        """Forget a host (never restarted from now on, nor a restart it had planned
        finished); the caller stops its actors and process."""
        if self.freezes is not None:
            self.freezes.forget(host)
        with self._lock:
            return self._hosts.pop(host)

    def check(self) -> None:
        """Name the hosts frozen and kill those frozen too long (``_freezes.py``), handle
        the processes that died since the last look, and start again those whose
        restart is due. Raises RunFailed (never anything else for a death)."""
        self._watch_freezes()
        oom = self.oom
        oom_now = oom.read() if oom is not None else None  # before this look: what its deaths after it are compared with
        dead = [r for r in self._hosts.values() if r.restart_at is None and not r.alive()]
        oom_after = oom.read() if oom is not None and dead else None
        why = {r.name: self._death(r, oom.last if oom is not None else None, oom_after) for r in dead}
        if oom is not None:
            oom.advance(oom_now)
        for record in dead:  # a process that cannot be restarted names the failure, before any requeue
            assert record.proc is not None  # dead, so started: alive() is True before the first start
            if record.role is None or not record.role.restartable:
                raise RunFailed(
                    f"process {record.name!r} ({record.plan.kind}) {why[record.name]}; the run cannot go on. "
                    f"Resume from the last checkpoint: afctl up --resume {self.run_dir}",
                    process_lost=True,
                )
        for record in dead:
            self._on_death(record, why[record.name])
        now = time.monotonic()
        for record in [r for r in self._hosts.values() if r.restart_at is not None and r.restart_at <= now]:
            self._restart(record)

    def _death(self, record: HostRecord, oom_before: int | None, oom_after: int | None) -> str:
        """How a dead host ended: frozen and killed by the driver, an exit code, a signal, or
        the kernel's out-of-memory killer (the cgroup's count grew from ``oom_before``, a look
        while it was alive, to ``oom_after``), with the preflight's estimate for it."""
        assert record.proc is not None  # dead, so started
        if record.killed_frozen:
            return record.killed_frozen
        returncode = record.proc.returncode
        estimate = None
        if returncode == -9 and oom_before is not None and oom_after is not None and oom_after > oom_before:
            try:
                estimate = host_estimate(self.memory_estimates(), record.name, record.plan.workers)
            except (OSError, ValueError, KeyError) as exc:  # the model's config.json unreadable now: named without
                click.echo(f"!! no memory estimate for {record.name}: {exc}", err=True)
        role = record.role.name if record.role is not None else record.plan.kind
        return death_words(returncode, oom_before, oom_after, role, estimate)

    def _watch_freezes(self) -> None:
        """Follow every live host with the freeze watch (from when it is registered), print
        what it finds, and kill the hosts frozen past ``cluster.transport.freeze_timeout_s``:
        the rest of ``check`` then handles each as a death."""
        watch = self.freezes
        if watch is None or self.dc is None:
            return
        alive: dict[str, int] = {}
        for record in self._hosts.values():
            proc = record.proc
            if proc is None or record.restart_at is not None or record.killed_frozen or not proc.alive():
                continue
            if not watch.watching(record.name, proc.pid):
                try:
                    entry = self.dc.lookup(f"host.{record.name}")
                except (AsyncflowError, LookupError):  # not registered yet: watched from a later look
                    continue
                if entry.pid != proc.pid:  # the entry of a process this one replaces
                    continue
                watch.watch(record.name, proc.pid, entry.address)
            alive[record.name] = proc.pid
        review = watch.review(alive)
        for line in review.lines:
            click.echo(line, err=True)
        for host, why in review.overdue.items():
            record = self._hosts[host]
            assert record.proc is not None  # reviewed as alive
            record.killed_frozen = why
            click.echo(f"!! process {host} (pid {record.proc.pid}) {why}", err=True)
            record.proc.kill()

    def _on_death(self, record: HostRecord, why: str) -> None:
        """Requeue the rows a dead worker held (now: others take them) and plan its
        restart, or stop the run when its role's budget is spent."""
        role, host = record.role, record.name
        # check() and _restart() come here only for a started host of a restartable role, after attach()
        assert role is not None and record.proc is not None and self.dc is not None
        try:
            tq = TQClient(self.dc, consumer="driver")
            task = task_of(role, self.cfg)  # none for a replica that only serves the gateway
            requeued = sum(tq.requeue(task, s.name, list(role.outputs)) for s in record.plan.specs) if task else 0
            for spec in record.plan.specs:
                self.dc.unregister(spec.name)
        except (AsyncflowError, LookupError) as exc:  # the queue is gone too: only a resume heals this
            raise RunFailed(
                f"process {host!r} {why}, and the rows it held could not be requeued ({exc}). "
                f"Resume from the last checkpoint: afctl up --resume {self.run_dir}",
                process_lost=True,
            ) from None
        if role.name == names.ROLLOUT:
            self._release_swaps(host, record.plan.workers)
        now = time.monotonic()
        at = self.restart_policy.on_death(role.name, now)
        if at is None:
            c = self.cfg.cluster
            raise RunFailed(
                f"role {role.name}: {self.restart_policy.num_recent(role.name, now)} restarts within "
                f"{c.restart_window_s:g} s, and {host} {why} again; its restart budget is spent "
                f"(cluster.max_restarts_per_role = {c.max_restarts_per_role}). Its stderr above says why "
                f"it dies. Resume from the last checkpoint: afctl up --resume {self.run_dir}",
                process_lost=True,
            )
        later = f" in {at - now:.1f} s" if at > now else ""
        click.echo(f"!! {host} {why}: requeued {requeued} rows it held, restarting it{later}", err=True)
        record.restart_at = at
        self.restarts.append(
            {"host": host, "why": why, "exit_code": record.proc.returncode, "requeued_rows": requeued, "time": time.time()}
        )

    def _release_swaps(self, host: str, replicas: list[str]) -> None:
        """Tell the weight sync that the replicas of ``host`` died: a replica killed holding the
        swap grant (or waiting in line for it) would hold every other replica's swap, and with
        them the trainer's checkpoint, which pauses each between two units. Told, not asked
        (the weights actor may be busy publishing); a weight sync that cannot be told is
        named, and the run goes on (a restarted replica gets a grant held under its name)."""
        assert self.dc is not None
        try:
            ref = self.dc.ref(names.WEIGHTS, wait_s=0.5)
            for replica in replicas:
                ref.tell(messages.ReplicaRemoved(replica=replica, dead=True), timeout_s=5)
        except (AsyncflowError, LookupError) as exc:
            click.echo(f"!! could not tell the weight sync that the replicas of {host} died ({exc}); going on", err=True)

    def _start_work(self, workers: list[str]) -> None:
        """Tell every worker of a restarted host StartWork, all at once: a pack's replicas each
        answer after their own start, and told in turn their waits added up (the driver's loop,
        which watches every other process, waiting meanwhile). Raises the first failure."""
        dc = self.dc
        assert dc is not None, "attach() comes first"

        def start(worker: str) -> None:
            dc.ref(worker, refresh=True).ask(messages.StartWork(), timeout_s=START_WORK_S)

        if len(workers) == 1:
            start(workers[0])
            return
        with ThreadPoolExecutor(max_workers=min(len(workers), 32), thread_name_prefix="start-work") as pool:
            futures = [pool.submit(start, worker) for worker in workers]
        for future in futures:
            future.result()

    def _restart(self, record: HostRecord) -> None:
        record.restart_at = None
        record.killed_frozen = ""
        specs = record.plan.specs
        assert self.dc is not None and self.transport is not None, "attach() comes first"
        try:
            record.proc = self.spawn(record.name, self.dc, self.transport, specs, env=self.host_env(record.name))
            self._start_work(record.plan.workers)  # not its companions
        except (AsyncflowError, LookupError) as exc:  # it died (or hangs) in its own start: one more death
            click.echo(f"!! restart of {record.name} failed: {exc}", err=True)
            assert record.proc is not None  # the one that died, or the new one
            if record.proc.alive():
                record.proc.kill()
            self._on_death(record, "died during its restart")
            return
        self.on_restart()
