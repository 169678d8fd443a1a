"""The driver of ``afctl up`` (not an actor itself): prepares the run directory,
starts every process host and actor, shows progress, restarts failed workers, and
stops everything cleanly.

Processes on the embedded local default (one host per line)::

    driver      directory, collector, planner        (this process; planner with [planner] online)
    queue       tq.manager, tq.controller.<task>...
    shard.<i>   tq.shard.<i>
    loader      loader
    rollout.<i> rollout.<i>
    reward.<i>  reward.<i>
    reference.<i> reference.<i>                      (when algorithm.kl_coef > 0)
    trainer     trainer, weights                     (trainer rank 0)
    trainer.<r> trainer.<r>                          (ranks 1.. with train.num_ranks > 1)
    <role>      custom roles from [[roles]]

Fault tolerance: when a rollout, reward, reference or custom-role process dies, the
rows it had taken are requeued to its task (``Requeue``) at once, and the process is
started again when the restart policy says (``_restarts.py``: the first restart of a
role in ``cluster.restart_window_s`` is immediate, later ones back off); the restart
is reported and counted in summary.json. A process that dies during its own restart
(before it registers, or while its actors start) is one more death of its role. When
the role's budget (``cluster.max_restarts_per_role``) is spent, or a death cannot be
handled (its rows cannot be requeued), the run stops with ``RunFailed(process_lost)``,
which ``cluster.max_resumes`` resumes from the last checkpoint: the driver never dies
with a traceback for a worker's death. The loss of the queue, a shard, the loader or
a trainer rank stops the run the same way (or resume with ``afctl up --resume RUN_DIR``).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import click
import msgspec

from asyncflow.actors import _cluster_file
from asyncflow.actors._restarts import RestartPolicy
from asyncflow.actors._run import LaunchInfo
from asyncflow.actors.collector import COLLECTOR, CollectorActor
from asyncflow.actors.trainer import latest_good_checkpoint
from asyncflow.actors.trainer_rank import rank_name
from asyncflow.core import protocol
from asyncflow.core._private import write_private
from asyncflow.core.actor import serve_actor
from asyncflow.core.config import ConfigError, RunConfig, dump_config
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.host import CPUS_ENV, HostProcess, spawn_host
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.launch import queue_specs
from asyncflow.core.transport import is_loopback

log = logging.getLogger(__name__)

RESTARTABLE = {"rollout": "rollout", "reward": "reward", "reference": "reference"}  # kind -> its queue task
OUTPUTS = {"rollout": ["response_ids", "rollout_logp", "finish"], "reward": ["reward"], "reference": ["ref_logp"]}
"""The columns a role puts: rows a dead worker already put them for are acked, not redone."""


LOST_STOP_GRACE_S = 5.0
"""After a lost process, how long each host gets between SIGTERM and SIGKILL."""
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Environment of the driver and every process: no "Loading weights" / "Writing model
shards" progress bars of transformers between the progress lines (a user who sets
the variable keeps their value)."""


def quiet_progress_bars() -> dict[str, str]:
    """Turn the Hugging Face progress bars off in this process (before or after
    transformers is imported); returns the variables to pass on to child processes."""
    env = {k: os.environ.get(k, v) for k, v in QUIET_ENV.items()}
    for k, v in env.items():
        os.environ.setdefault(k, v)
    if "transformers" in sys.modules and env["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return env


def _spec(name: str, cls: str, **kwargs) -> protocol.ActorSpec:
    return protocol.ActorSpec(name=name, cls=cls, kwargs=msgspec.msgpack.encode(kwargs))


class RunFailed(AsyncflowError):
    """The run cannot go on. ``process_lost``: because a process (or its node) that
    cannot be restarted alone is gone, which a resume from the last checkpoint heals
    (``cluster.max_resumes``); otherwise a role raised, which resuming would repeat."""

    def __init__(self, message: str, process_lost: bool = False):
        super().__init__(message)
        self.process_lost = process_lost


class Launcher:
    def __init__(self, cfg: RunConfig, run_dir: Path, launch: LaunchInfo):
        self.cfg = cfg
        self.run_dir = run_dir
        self.launch = launch
        self.hosts: dict[str, HostProcess] = {}
        self.host_specs: dict[str, list[protocol.ActorSpec]] = {}
        self.host_kind: dict[str, str] = {}
        self.restarts: list[dict] = []
        c = cfg.cluster
        self.restart_policy = RestartPolicy(c.max_restarts_per_role, c.restart_window_s, c.restart_backoff_s)
        self.restart_at: dict[str, float] = {}  # dead host -> when to start it again (time.monotonic)
        self.stopping = False
        self.lost_process = False  # a process the run cannot go on without died: stop fast, then resume
        self.scaler = None  # the online planner's driver side ([planner] online = true)
        self.spawn = spawn_host  # with [cluster] launcher = "ray": RayHosts.spawn (actors/ray_hosts.py)
        self.ray_hosts = None

    # -- layout ------------------------------------------------------------------------
    def tasks(self) -> list[str]:
        tasks = ["rollout", "reward", "train"]
        if self.cfg.algorithm.kl_coef > 0:
            tasks.append("reference")
        return tasks + [r.task for r in self.cfg.roles if r.task]

    def role_names(self) -> dict[str, list[str]]:
        cfg = self.cfg
        names = {
            "loader": ["loader"],
            "rollout": [f"rollout.{i}" for i in range(cfg.rollout.num_replicas)],
            "reward": [f"reward.{i}" for i in range(cfg.reward.num_workers)],
            "reference": [f"reference.{i}" for i in range(cfg.reference.num_workers)] if cfg.algorithm.kl_coef > 0 else [],
            "custom": [r.name for r in cfg.roles],
        }
        return names

    def plan(self) -> None:
        cfg, rd = self.cfg, str(self.run_dir)
        capacity = cfg.queue.capacity_rows or cfg.samples_per_step * (cfg.staleness + 3)
        q = queue_specs(self.tasks(), num_shards=cfg.queue.num_shards, capacity_rows=capacity,
                        inline_max_bytes=cfg.queue.inline_max_bytes)
        self._add("queue", "queue", [q.manager, *q.controllers])
        for i, shard in enumerate(q.shards):
            self._add(f"shard.{i}", "shard", [shard])
        names = self.role_names()
        self._add("loader", "loader", [_spec("loader", "asyncflow.actors.prompt_loader:PromptLoaderActor", run_dir=rd)])
        for name in names["rollout"]:
            self._add(name, "rollout", [_spec(name, "asyncflow.actors.rollout:RolloutActor", run_dir=rd)])
        for name in names["reward"]:
            self._add(name, "reward", [_spec(name, "asyncflow.actors.reward:RewardActor", run_dir=rd)])
        for name in names["reference"]:
            self._add(name, "reference", [_spec(name, "asyncflow.actors.reference:ReferenceActor", run_dir=rd)])
        for role in cfg.roles:
            given = {"task": role.task, "output": role.reward_column}
            self._add(role.name, "custom", [_spec(role.name, role.cls, run_dir=rd, **{k: v for k, v in given.items() if v},
                                                  **role.kwargs)])
        others = [n for kind in ("loader", "rollout", "reward", "reference", "custom") for n in names[kind]]
        ranks = [rank_name(r) for r in range(1, cfg.train.num_ranks)]
        self._add("trainer", "trainer", [_spec(
            "trainer", "asyncflow.actors.trainer:TrainerActor", run_dir=rd, other_roles=others,
            rollout_replicas=names["rollout"], ranks=ranks,
        )])
        for r, name in enumerate(ranks, start=1):  # started together with rank 0: they rendezvous at start
            self._add(name, "trainer_rank", [_spec(name, "asyncflow.actors.trainer_rank:TrainerRankActor", run_dir=rd, rank=r)])
        self.workers = others + ["trainer"] + ranks  # rank 0 first: Stop reaches it before the ranks it drives

    def _add(self, host: str, kind: str, specs: list[protocol.ActorSpec]) -> None:
        self.host_specs[host] = specs
        self.host_kind[host] = kind

    def host_env(self, host: str) -> dict[str, str]:
        """Environment of one process: the common one plus the devices it may see."""
        c = self.cfg.cluster
        kind, index = self.host_kind[host], host.rsplit(".", 1)[-1]
        def pick(ids: list[int]):  # a replica added during the run (planner) beyond the list sees all
            return ids[int(index)] if index.isdigit() and int(index) < len(ids) else None

        if self.cfg.train.num_ranks > 1 and kind in ("trainer", "trainer_rank"):  # one device per rank
            train = pick(c.train_devices) if kind == "trainer_rank" else (c.train_devices[0] if c.train_devices else None)
        else:
            train = ",".join(map(str, c.train_devices)) if c.train_devices else None
        devices = {"rollout": pick(c.rollout_devices), "reference": pick(c.reference_devices),
                   "trainer": train, "trainer_rank": train}.get(kind)
        env = {**self.env, **self.cpu_env(kind)}
        if devices is None or c.device == "cpu":
            return env
        var = "ASCEND_RT_VISIBLE_DEVICES" if c.device == "npu" else "CUDA_VISIBLE_DEVICES"
        return {**env, var: str(devices)}

    def cpu_env(self, kind: str) -> dict[str, str]:
        """``[cluster] pin_trainer_cores`` (async): the cores a process may run on
        (``core/host.py`` applies them), the first ones to the trainer's processes."""
        n = self.cfg.cluster.pin_trainer_cores
        if n == 0 or self.cfg.workflow.mode != "async":
            return {}
        cores = sorted(os.sched_getaffinity(0))
        if n >= len(cores):
            raise ConfigError(f"cluster.pin_trainer_cores = {n}: the driver may use {len(cores)} cores ({cores}) and the "
                              f"other processes need at least one; use at most {len(cores) - 1}, or 0 to pin nothing")
        mine = cores[:n] if kind in ("trainer", "trainer_rank") else cores[n:]
        return {CPUS_ENV: ",".join(map(str, mine))}

    # -- start / stop --------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.cfg
        self.ipc_dir = tempfile.mkdtemp(prefix="af-")  # short: ipc paths are limited to ~100 bytes
        transport = msgspec.structs.replace(cfg.cluster.transport, ipc_dir=self.ipc_dir)
        if cfg.cluster.launcher == "ray":  # Ray places the hosts; the driver listens on its node's address
            from asyncflow.actors.ray_hosts import RayHosts

            self.ray_hosts = RayHosts(cfg.cluster, self.host_kind, num_ranks=cfg.train.num_ranks)
            self.spawn = self.ray_hosts.spawn
            transport = self.ray_hosts.connect(transport)
        self.transport = transport.validate()
        self.directory = start_directory(self.transport)
        self.dc = DirectoryClient(self.directory.address, self.transport)
        from asyncflow.actors.loggers import build_loggers

        self.loggers = build_loggers(cfg.logging, self.run_dir, cfg)
        self.collector = serve_actor(
            CollectorActor, COLLECTOR, self.transport, directory_address=self.directory.address,
            run_dir=str(self.run_dir), num_steps=cfg.train.num_steps, progress=cfg.logging.progress,
            loggers=self.loggers, trace_every_s=cfg.logging.trace_every_s if cfg.logging.spans else 0.0,
        )
        self.dc.register(self.collector.entry())
        self.collector_proxy = self.collector.pykka_ref.proxy()
        env = {**quiet_progress_bars(), "OMP_NUM_THREADS": str(cfg.cluster.threads_per_process), "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(filter(None, [*cfg.cluster.python_path, os.getcwd(), os.environ.get("PYTHONPATH", "")])),
               "ASYNCFLOW_SPANS": "1" if cfg.logging.spans else "0",
               "ASYNCFLOW_LOG_DIR": str((self.run_dir / "logs").absolute())}
        self.env = env
        click.echo(f"starting {len(self.host_specs)} processes: {', '.join(self.host_specs)}")
        for host in self.host_specs:
            self.hosts[host] = self.spawn(host, self.dc, self.transport, env=self.host_env(host))
        self.write_cluster_file()
        order = [h for h in self.host_specs if self.host_kind[h] in ("queue", "shard")]
        self._start_hosts(order)
        if self.launch.resume_from:
            saved = TQClient(self.dc, consumer="driver").load(str(Path(self.launch.resume_from) / "queue"))
            click.echo(f"resumed the queue: {saved.num_rows} rows from {self.launch.resume_from}")
        self._start_hosts([h for h in self.host_specs if h not in order])
        if cfg.planner.online:
            from asyncflow.actors._scaling import Scaler

            self.scaler = Scaler(self)
            self.scaler.start()
        for name in self.workers:
            self.dc.ref(name).ask(protocol.StartWork(), timeout_s=30)
        click.echo("every process is up; waiting for the first step (the first rollouts and the first batch)")

    def write_cluster_file(self) -> None:
        """RUN_DIR/cluster.json and the pointer to it, for `afctl status` (no secret)."""
        if not hasattr(self, "started_wall_s"):
            self.started_wall_s = time.time()  # kept when a restart rewrites the file
        _cluster_file.write(_cluster_file.ClusterFile(
            run_dir=str(self.run_dir.absolute()), directory=self.directory.address, transport=self.transport,
            driver_pid=os.getpid(), started_at=self.started_wall_s, hosts={h: p.pid for h, p in self.hosts.items()},
            workers=self.workers, tasks=self.tasks(),
        ))

    def _start_hosts(self, names: list[str]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
            futures = {h: pool.submit(self.hosts[h].start, self.host_specs[h], timeout_s=300) for h in names}
        for host, future in futures.items():
            exc = future.exception()
            if isinstance(exc, (AsyncflowError, LookupError)):  # a clean stop, not a traceback
                raise RunFailed(f"process {host!r} could not start its actors: {exc}")
            future.result()

    def stop(self) -> list[tuple[str, BaseException]]:
        """Stop the workers' loops first (each finishes its unit), then the processes,
        the collector (after it writes trace.json), the loggers and the directory.

        Every stage runs whatever failed before it: an error (a full disk while writing
        the trace, a host that cannot be stopped) is logged and returned as
        ``(stage, error)``, and the next stage goes on, so the driver never waits at
        exit on an actor left running."""
        errors: list[tuple[str, BaseException]] = []

        def stage(name: str, fn, *args) -> None:
            try:
                fn(*args)
            except Exception as exc:  # the stop path's containment boundary: the next stages must run
                log.error("stopping the run: %s failed: %s: %s (going on with the rest of the stop)",
                          name, type(exc).__name__, exc)
                errors.append((name, exc))

        self.stopping = True
        if self.scaler is not None:
            stage("stop the online planner", self.scaler.stop)
        workers = getattr(self, "workers", []) if hasattr(self, "dc") else []
        if self.lost_process:
            # the run resumes from its last checkpoint: nothing a worker would finish or ack
            # now is kept, and workers that wait on the lost process would hold the stop for
            # their whole timeouts (serially: minutes), so the hosts are ended at once
            with ThreadPoolExecutor(max_workers=max(1, len(self.hosts))) as pool:
                futures = {h: pool.submit(p.terminate, LOST_STOP_GRACE_S) for h, p in self.hosts.items()}
        else:
            with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:  # at once: each finishes its unit
                stops = {name: pool.submit(self._stop_worker, name) for name in workers}
            for name, future in stops.items():
                stage(f"stop role {name}", future.result)
            with ThreadPoolExecutor(max_workers=max(1, len(self.hosts))) as pool:
                futures = {h: pool.submit(p.stop, timeout_s=20) for h, p in self.hosts.items()}
        for host, future in futures.items():
            stage(f"stop host {host}", future.result)
        if hasattr(self, "collector"):
            stage("write trace.json", lambda: self.collector_proxy.write_trace(str(self.run_dir / "trace.json")).get())
            stage("stop the collector", self.collector.stop)
        for logger in getattr(self, "loggers", []):
            stage(f"close logger {type(logger).__name__}", logger.close)
        stage("mark cluster.json stopped", _cluster_file.mark_stopped, self.run_dir.absolute())
        if hasattr(self, "directory"):
            stage("stop the directory", self.directory.stop)
        if self.ray_hosts is not None:
            stage("close the Ray hosts", self.ray_hosts.close)
        if getattr(self, "ipc_dir", None):  # the ipc sockets' directory (empty by now)
            stage(f"remove {self.ipc_dir}", shutil.rmtree, self.ipc_dir, True)
        for name, exc in errors:
            click.echo(f"!! while stopping: {name} failed: {type(exc).__name__}: {exc}", err=True)
        return errors

    def _stop_worker(self, name: str) -> None:
        if not self._host_alive(name):
            return  # its process is gone: asking would only wait out the timeout
        try:
            self.dc.ref(name, wait_s=0.1).ask(protocol.Stop(), timeout_s=60)
        except (AsyncflowError, LookupError):
            pass  # never started, or already gone

    def _host_alive(self, actor: str) -> bool:
        """Whether the process hosting ``actor`` is up (True when unknown)."""
        for host, specs in self.host_specs.items():
            if any(spec.name == actor for spec in specs):
                proc = self.hosts.get(host)
                return proc is None or proc.alive()
        return True

    def log_file(self, actor: str) -> Path:
        """RUN_DIR/logs/<process>.log: the whole log of the process hosting ``actor``."""
        host = next((h for h, specs in self.host_specs.items() if any(s.name == actor for s in specs)), actor)
        return self.run_dir / "logs" / f"{host}.log"

    # -- watching ------------------------------------------------------------------------
    def role_stats(self) -> dict[str, protocol.RoleStats]:
        out = {}
        for name in self.workers:
            if not self._host_alive(name):
                continue
            try:
                out[name] = self.dc.ref(name, wait_s=0.5).ask(protocol.GetRoleStats(), timeout_s=5)
            except (AsyncflowError, LookupError):
                pass  # restarting or gone: no figure this time
        return out

    def busy_fractions(self, stats: dict[str, protocol.RoleStats]) -> dict[str, float]:
        return {n: s.busy_s / max(1e-9, s.busy_s + sum(s.wait_s.values())) for n, s in stats.items()}

    def check_hosts(self) -> None:
        """Handle the processes that died since the last look, and start again those
        whose restart is due. Raises RunFailed (never anything else for a death)."""
        if self.stopping:
            return
        try:
            self._check_hosts()
        except RunFailed as exc:
            self.lost_process = exc.process_lost  # the stop that follows ends the hosts at once
            raise

    def _check_hosts(self) -> None:
        dead = [h for h, p in list(self.hosts.items()) if not p.alive() and h not in self.restart_at]
        for host in dead:  # a process that cannot be restarted names the failure, before any requeue
            if self._role(host) is None:
                raise RunFailed(f"process {host!r} ({self.host_kind[host]}) exited with code "
                                f"{self.hosts[host].returncode}; the run cannot go on. "
                                f"Resume from the last checkpoint: afctl up --resume {self.run_dir}", process_lost=True)
        for host in dead:
            self._on_death(host, f"exited with code {self.hosts[host].returncode}")
        now = time.monotonic()
        for host, at in list(self.restart_at.items()):
            if at <= now:
                self._restart(host)

    def _role(self, host: str) -> str | None:
        """The restart budget ``host`` counts against: its kind, or a custom role's
        name; None when it cannot be restarted alone."""
        kind = self.host_kind[host]
        if kind == "custom":
            return host
        return kind if kind in RESTARTABLE else None

    def _on_death(self, host: str, why: str) -> None:
        """Requeue the rows a dead worker held (now: others take them) and plan its
        restart, or stop the run when its role's budget is spent."""
        custom = {r.name: r for r in self.cfg.roles}.get(host)
        task = custom.task if custom is not None else RESTARTABLE[self.host_kind[host]]  # a custom role may read no task
        outputs = ([custom.reward_column] if custom.reward_column else []) if custom is not None else OUTPUTS[self.host_kind[host]]
        try:
            tq = TQClient(self.dc, consumer="driver")
            requeued = sum(tq.requeue(task, spec.name, outputs) for spec in self.host_specs[host]) if task else 0
            for spec in self.host_specs[host]:
                self.dc.unregister(spec.name)
        except (AsyncflowError, LookupError) as exc:  # the queue is gone too: only a resume heals this
            raise RunFailed(f"process {host!r} {why}, and the rows it held could not be requeued ({exc}). "
                            f"Resume from the last checkpoint: afctl up --resume {self.run_dir}",
                            process_lost=True) from None
        role, now = self._role(host), time.monotonic()
        at = self.restart_policy.on_death(role, now)
        if at is None:
            c = self.cfg.cluster
            raise RunFailed(f"role {role}: {self.restart_policy.num_recent(role, now)} restarts within "
                            f"{c.restart_window_s:g} s, and {host} {why} again; its restart budget is spent "
                            f"(cluster.max_restarts_per_role = {c.max_restarts_per_role}). Its stderr above says why "
                            f"it dies. Resume from the last checkpoint: afctl up --resume {self.run_dir}",
                            process_lost=True)
        later = f" in {at - now:.1f} s" if at > now else ""
        click.echo(f"!! {host} {why}: requeued {requeued} rows it held, restarting it{later}", err=True)
        self.restart_at[host] = at
        self.restarts.append({"host": host, "why": why, "exit_code": self.hosts[host].returncode,
                              "requeued_rows": requeued, "time": time.time()})

    def _restart(self, host: str) -> None:
        del self.restart_at[host]
        specs = self.host_specs[host]
        try:
            self.hosts[host] = self.spawn(host, self.dc, self.transport, specs, env=self.host_env(host))
            for spec in specs:
                self.dc.ref(spec.name, refresh=True).ask(protocol.StartWork(), timeout_s=30)
        except (AsyncflowError, LookupError) as exc:  # it died (or hangs) in its own start: one more death
            click.echo(f"!! restart of {host} failed: {exc}", err=True)
            proc = self.hosts[host]
            if proc.alive():
                proc.kill()
            self._on_death(host, "died during its restart")
            return
        self.write_cluster_file()  # the new pid

    def hang_report(self, waited_s: float) -> str:
        lines = [f"no trainer step completed in {waited_s:.0f} s; what every role is doing:"]
        stats = self.role_stats()
        last_spans, now = self.collector_proxy.last_span.get(), time.time()
        suspects = []  # (seconds without a finished span, role, what it is doing): roles busy, not waiting
        for name in self.workers:
            span = last_spans.get(name)
            age = now - span[1] if span else waited_s
            last = f"last span {span[0]!r} ended {age:.1f} s ago" if span else "no span received"
            s = stats.get(name)
            if s is None:
                lines.append(f"  {name:<14} NO ANSWER to GetRoleStats ({last})")
                suspects.append((age, name, "not answering"))
            else:
                lines.append(f"  {name:<14} pid {s.pid:<7} state {s.state:<14} version {s.version:<4} "
                             f"items {s.num_items:<6} {last}")
                if not s.state.startswith("wait_") and s.state not in ("idle", "done", "paused"):
                    suspects.append((age, name, f"in {s.state!r}"))
        if suspects:
            age, name, doing = max(suspects)
            lines.append(f"  most likely stalled: {name} ({doing}, no span finished for {age:.1f} s); "
                         f"its stack is below")
        else:
            lines.append("  every role is waiting: the task states below show which rows are missing")
        try:
            tq = TQClient(self.dc, consumer="driver")
            status = tq.status()
            lines.append(f"  queue: {status.num_live_rows}/{status.capacity_rows} rows live, "
                         f"{status.num_waiting_allocations} allocations waiting")
            for task in self.tasks():
                t = tq.task_status(task)
                lines.append(f"  task {task:<10} {t.num_rows} rows, {t.num_acked} acked, handed out {t.num_pending}, "
                             f"{t.num_waiting} GetBatch waiting")
        except AsyncflowError as exc:
            lines.append(f"  queue: no answer ({exc})")
        lines.append("  (Python stacks of every process follow on stderr)")
        return "\n".join(lines)

    def dump_stacks(self) -> None:
        """Each host prints its Python stacks to stderr (SIGUSR1), one after the other under a header."""
        for host, proc in self.hosts.items():
            if proc.alive():
                print(f"--- Python stacks of process {host} (pid {proc.pid}) ---", file=sys.stderr, flush=True)
                proc.dump_stacks()
                time.sleep(0.2)  # let its dump finish before the next one starts

    def wait(self) -> protocol.RunFinished:
        collector = self.collector_proxy
        last_poll = 0.0
        last_hang = time.monotonic()
        finished, failed = collector.finished.get(), collector.failed.get()
        while not finished.wait(0.5):
            if failed.is_set():
                role, error = collector.failures.get()[0]
                # a role often fails because a peer process died (a trainer rank's collective
                # breaks when another rank is killed): name the dead process first, if any
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline and all(p.alive() for p in self.hosts.values()):
                    time.sleep(0.1)
                self.check_hosts()
                raise RunFailed(f"role {role} failed: {error.splitlines()[0]} (traceback in "
                                f"{self.log_file(role)})\n{resume_advice(self.run_dir)}")
            self.check_hosts()
            if self.scaler is not None:
                self.scaler.apply_pending()  # moves of the online planner, between steps
            now = time.monotonic()
            if now - last_poll > 2.0:
                collector.busy = self.busy_fractions(self.role_stats())
                last_poll = now
            since = now - max(collector.last_step_at.get(), last_hang)
            if since > self.cfg.logging.hang_timeout_s:
                click.echo(self.hang_report(since), err=True)
                self.dump_stacks()
                last_hang = now
        return collector.result.get()


# -- preparing the run directory -----------------------------------------------------------


def prepare_new(cfg: RunConfig, run_dir: str | os.PathLike) -> tuple[RunConfig, Path, LaunchInfo]:
    rd = Path(run_dir)
    if (rd / "metrics.jsonl").exists():
        raise ConfigError(f"run directory {rd} already holds a run: resume it with `afctl up --resume {rd}` or choose another --run-dir")
    from asyncflow.actors._preflight import check_inputs

    check_inputs(cfg)  # imports, devices, data fields, chat template: before any process starts
    rd.mkdir(parents=True, exist_ok=True)
    data_path = cfg.data.path
    if not data_path:
        from asyncflow.algorithms.tasks import write_jsonl

        data_path = str(write_jsonl(rd / "data.jsonl", cfg.data.num_prompts, seed=cfg.data.seed, task=cfg.data.task))
    if cfg.eval.every_steps:  # the held-out split must leave prompts to train on: say so now, not in the loader
        from asyncflow.actors._run import read_prompts, split_prompts

        try:
            split_prompts([str(r["prompt"]) for r in read_prompts(data_path)], cfg.eval.num_prompts, cfg.data.seed)
        except ValueError as exc:
            raise ConfigError(f"{exc} (data: {data_path})") from None
    model_dir = cfg.model.path
    if not model_dir:
        from asyncflow.algorithms.tasks import make_task_model

        click.echo(f"building the tiny {cfg.model.tiny} model into {rd / 'model'} ...")
        model_dir = str(make_task_model(rd / "model", seed=cfg.seed, arch=cfg.model.tiny, task=cfg.data.task,
                                        warm_start_steps=cfg.model.tiny_warm_start_steps if cfg.model.tiny_warm_start else 0))
    launch = LaunchInfo(model_dir=os.path.abspath(model_dir), base_model_dir=os.path.abspath(model_dir),
                        data_path=os.path.abspath(data_path))
    cfg = with_run_secret(cfg)
    write_run_config(cfg, rd)
    (rd / "launch.json").write_bytes(msgspec.json.format(msgspec.json.encode(launch)))
    return cfg, rd, launch


SECRET_FILE = "secret"
"""RUN_DIR/secret: the cluster secret of a config that sets one (mode 0600)."""


def with_run_secret(cfg: RunConfig) -> RunConfig:
    """A run on loopback tcp with neither a secret nor TLS gets a random secret of its
    own (kept in RUN_DIR/secret): without one, any local user could stop its hosts.
    Every host is started by this driver and gets it with the transport; `afctl status`
    reads it from RUN_DIR/secret. Off loopback the config must set one (or ``tls_dir``)."""
    t = cfg.cluster.transport
    if t.scheme != "tcp" or t.tls_dir or t.secret_bytes() or not is_loopback(t.bind_host):
        return cfg
    transport = msgspec.structs.replace(t, secret=secrets.token_hex(16))
    return msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, transport=transport))


def write_run_config(cfg: RunConfig, rd: Path) -> None:
    """RUN_DIR/config.json, which never holds the cluster secret (it is read by every
    role and copied around); a secret set in the config goes to RUN_DIR/secret at mode 0600."""
    transport = cfg.cluster.transport
    if transport.secret:
        write_private(rd / SECRET_FILE, transport.secret.encode())
        cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(
            cfg.cluster, transport=msgspec.structs.replace(transport, secret="")))
    (rd / "config.json").write_text(dump_config(cfg))


def read_run_config(rd: Path) -> RunConfig:
    """RUN_DIR/config.json with the secret of RUN_DIR/secret put back (when there is one)."""
    rd = Path(rd)
    cfg = msgspec.json.decode((rd / "config.json").read_bytes(), type=RunConfig)
    secret_file = rd / SECRET_FILE
    if secret_file.exists():
        transport = msgspec.structs.replace(cfg.cluster.transport, secret=secret_file.read_text())
        cfg = msgspec.structs.replace(cfg, cluster=msgspec.structs.replace(cfg.cluster, transport=transport))
    return cfg


def prepare_resume(run_dir: str, overrides: Sequence[str] = ()) -> tuple[RunConfig, Path, LaunchInfo]:
    """Continue RUN_DIR from its newest good checkpoint; ``overrides`` (``--set``) may
    change only the keys of core/resumable.py, and are saved into config.json."""
    from asyncflow.core.resumable import apply_resume_overrides

    rd = Path(run_dir)
    if not (rd / "config.json").exists():
        raise ConfigError(f"{rd} is not a run directory (no config.json)")
    saved = read_run_config(rd)
    cfg = apply_resume_overrides(saved, overrides)
    ckpt, damaged = latest_good_checkpoint(rd)
    for path, wrong in damaged:
        click.echo(f"!! checkpoint {path.name} is damaged: {wrong}; skipping it", err=True)
    if ckpt is None:
        if damaged:
            raise ConfigError(f"{rd}: every complete checkpoint is damaged (see above); start a new run")
        raise ConfigError(f"{rd} has no complete checkpoint to resume from (checkpoints/step_*/DONE)")
    if damaged:
        click.echo(f"!! resuming from {ckpt}, the newest checkpoint that verifies", err=True)
    previous = msgspec.json.decode((rd / "launch.json").read_bytes(), type=LaunchInfo)
    step = int((ckpt / "DONE").read_text())
    if step >= cfg.train.num_steps:
        raise ConfigError(f"{rd} already finished its {cfg.train.num_steps} steps; to train more, raise "
                          f"train.num_steps: afctl up --resume {rd} --set train.num_steps={step + max(1, step)}")
    if cfg is not saved:
        write_run_config(cfg, rd)
    launch = LaunchInfo(
        model_dir=str(ckpt / "model"), base_model_dir=previous.base_model_dir, data_path=previous.data_path,
        start_step=step, resume_from=str(ckpt),
        role_states=msgspec.msgpack.decode((ckpt / "roles.msgpack").read_bytes()),
    )
    (rd / "launch.json").write_bytes(msgspec.json.format(msgspec.json.encode(launch)))
    # steps after the checkpoint will be trained again: drop their records so each step appears once
    for name in ("metrics.jsonl", "trained.jsonl"):
        path = rd / name
        if path.exists():
            kept = [line for line in _complete_lines(path) if json.loads(line)["step"] < step]
            path.write_text("".join(line + "\n" for line in kept))
    return cfg, rd, launch


def _complete_lines(path: Path) -> list[str]:
    """The lines of a JSON-lines file the run appends to, without a torn last line (a
    process killed mid-write leaves one; it is dropped, and said so)."""
    text = path.read_text()
    lines = [line for line in text.splitlines() if line]
    if lines and not text.endswith("\n"):
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            click.echo(f"!! {path.name}: dropped a torn last line ({len(lines[-1])} characters)", err=True)
            lines.pop()
    return lines


def resume_advice(rd: Path) -> str:
    """The resume command when the run has a complete checkpoint; otherwise why there is none."""
    from asyncflow.actors.trainer import latest_checkpoint

    ckpt = latest_checkpoint(rd)
    if ckpt is not None:
        return f"Resume from its last checkpoint ({ckpt.name}): afctl up --resume {rd}"
    cfg_every = read_run_config(rd).train.checkpoint_every if (rd / "config.json").exists() else 0
    why = (f"train.checkpoint_every = {cfg_every}: the first is saved after step {cfg_every}" if cfg_every
           else "train.checkpoint_every = 0 saves one only at the end")
    return f"No checkpoint to resume from: none was saved yet ({why}); fix the cause and start the run again."


def default_run_dir(config_path: str) -> str:
    return os.path.join("runs", f"{Path(config_path).stem}-{datetime.now():%Y%m%d-%H%M%S}")


def run(cfg: RunConfig | None, run_dir: str | os.PathLike | None, resume: str | None = None,
        resume_overrides: Sequence[str] = ()) -> dict:
    """Run to the end; returns the summary (also written to RUN_DIR/summary.json).
    Give a config and a run directory for a new run, or ``resume=RUN_DIR`` (with
    ``resume_overrides``: ``--set`` items of keys that may change on resume).

    When a process that cannot be restarted alone is lost (the queue, a shard, the
    loader, a trainer rank, or its node), the run stops cleanly and, up to
    ``cluster.max_resumes`` times, resumes itself from its last checkpoint."""
    quiet_progress_bars()  # before the tiny model is built and saved
    cfg, rd, launch = prepare_resume(resume, resume_overrides) if resume else prepare_new(cfg, run_dir)
    resumes: list[dict] = []
    while True:
        try:
            summary = _run_once(cfg, rd, launch)
        except RunFailed as exc:
            ckpt, _ = latest_good_checkpoint(rd)
            if not exc.process_lost or len(resumes) >= cfg.cluster.max_resumes or ckpt is None:
                if exc.process_lost and cfg.cluster.max_resumes and ckpt is None:
                    click.echo("!! no checkpoint yet to resume from (train.checkpoint_every)", err=True)
                raise
            resumes.append({"error": str(exc).splitlines()[0], "checkpoint": str(ckpt), "time": time.time()})
            click.echo(f"!! {str(exc).splitlines()[0]}\n!! resuming from {ckpt} "
                       f"(automatic resume {len(resumes)} of {cfg.cluster.max_resumes})", err=True)
            cfg, rd, launch = prepare_resume(str(rd))
            continue
        if resumes:
            summary["resumes"] = resumes
            (rd / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _run_once(cfg: RunConfig, rd: Path, launch: LaunchInfo) -> dict:
    faulthandler.enable()
    from asyncflow.actors._preflight import check

    click.echo(check(cfg, launch.model_dir))
    launcher = Launcher(cfg, rd, launch)
    launcher.plan()
    t0 = time.monotonic()
    click.echo(f"run directory: {rd}  ({cfg.workflow.mode}, staleness {cfg.staleness}, "
               f"{len(launcher.host_specs)} processes, steps {launch.start_step}..{cfg.train.num_steps - 1})")
    interrupted = False
    try:
        launcher.start()
        result = launcher.wait()
        stats = launcher.role_stats()
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: stopping every process. {resume_advice(rd)}", err=True)
        interrupted = True
        raise
    finally:
        launcher.stop()
        if interrupted:  # what ran until Ctrl-C / SIGTERM, marked as such (no role stats: the roles are gone)
            summary = summarize(rd, cfg, {}, time.monotonic() - t0, launcher.restarts, None, interrupted=True)
            (rd / "summary.json").write_text(json.dumps(summary, indent=2))
    wall_s = time.monotonic() - t0
    summary = summarize(rd, cfg, stats, wall_s, launcher.restarts, result)
    (rd / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def summarize(rd: Path, cfg: RunConfig, stats: dict[str, protocol.RoleStats], wall_s: float, restarts: list, result,
              interrupted: bool = False) -> dict:
    """summary.json. Totals and rates cover the whole run, every launch of a resumed
    one (``samples_per_s`` = all samples over the sum of the launches' training spans);
    ``launch_*`` figures, ``wall_s`` and the busy fractions are this launch's."""
    from asyncflow.actors._summary import launch_span_s, launches, reward_trend, train_span_s

    path = rd / "metrics.jsonl"
    rows = [json.loads(line) for line in _complete_lines(path)] if path.exists() else []
    this = launches(rows)[-1] if rows else []
    busy = {name: s.busy_s for name, s in stats.items()}
    span = train_span_s(rows)
    launch_span = launch_span_s(this) if this else wall_s
    first, last = reward_trend(rows)
    samples, tokens = sum(r["samples"] for r in rows), sum(r["tokens"] for r in rows)
    launch_samples = sum(r["samples"] for r in this)
    return {
        "mode": cfg.workflow.mode,
        "staleness": cfg.staleness,
        "interrupted": interrupted,
        "steps": len(rows),
        "launches": len(launches(rows)),
        "wall_s": round(wall_s, 2),
        "train_span_s": round(span, 2),
        "samples": samples,
        "tokens": tokens,
        "samples_per_s": samples / max(span, 1e-9),
        "tokens_per_s": tokens / max(span, 1e-9),
        "launch_steps": len(this),
        "launch_train_span_s": round(launch_span, 2),
        "launch_samples": launch_samples,
        "launch_samples_per_s": launch_samples / max(launch_span, 1e-9),
        "reward_first_10pct": first,
        "reward_last_10pct": last,
        "staleness_max": max((r["staleness_max"] for r in rows), default=0),
        "busy_s": busy,
        # over this launch's training span (its first step's start to its last step's end): start-up excluded
        "busy_fraction": {name: min(1.0, b / max(launch_span, 1e-9)) for name, b in busy.items()},
        "pipeline_efficiency": min(1.0, max(busy.values(), default=0.0) / max(launch_span, 1e-9)),
        "restarts": restarts,
        "checkpoint": result.checkpoint if result else "",
        **val_summary(rd, rows),
    }


def val_summary(rd: Path, rows: list[dict]) -> dict:
    """The evaluations' figures: the best (that of checkpoints/best when saved) and the last."""
    from asyncflow.actors._eval import read_best

    evals = [r for r in rows if "val/accuracy" in r]
    best = read_best(rd)
    if best is None and evals:
        top = max(evals, key=lambda r: r["val/accuracy"])  # the first of equals, as the trainer keeps it
        best = {"value": top["val/accuracy"], "step": top["step"]}
    return {
        "val_best_accuracy": best["value"] if best else None,
        "val_best_step": int(best["step"]) if best else None,
        "val_final_accuracy": evals[-1]["val/accuracy"] if evals else None,
    }
