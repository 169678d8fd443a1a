"""The driver of ``afctl up`` (not an actor itself): prepares the run directory,
starts every process host and actor, shows progress, restarts failed workers, and
stops everything cleanly.

The driver process runs the directory, the collector and (with ``[planner] online``)
the planner; every other process host comes from the config through
``topology.plan_hosts`` (the queue, its shards, one host per role instance), and
``supervisor.Supervisor`` holds them. The driver waits on the collector's ``ended``
event (the trainer's RunFinished, or a RoleFailed), and every half second meanwhile
handles dead processes, the planner's moves, the busy fractions and the stall report.

The stall report: when no trainer step completes for ``stall_timeout_s`` (the larger
of ``logging.hang_timeout_s`` and ``STALL_STEP_FACTOR`` x the slowest step so far, or
before the first step x the preflight's estimate of a step), the driver prints a short
block (what every role is doing, the queue per task) and writes every process's Python
stacks to ``RUN_DIR/logs/stall-<n>.txt``, which the block names.

Fault tolerance (``supervisor.py``): when a process of a restartable role dies, the
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
import functools
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click
import msgspec

from asyncflow.actors.driver import cluster_file as _cluster_file
from asyncflow.actors.driver import topology
from asyncflow.actors.driver._freezes import FreezeWatch
from asyncflow.actors.driver._oom import OomCount, run_memory_estimates
from asyncflow.actors.driver._pinning import pinning
from asyncflow.actors.driver._teardown import StageRunner, Teardown
from asyncflow.actors.driver.collector import CollectorActor, Subscribe
from asyncflow.actors.driver.prepare import prepare_new, prepare_resume, resume_advice
from asyncflow.actors.driver.roster import RosterActor
from asyncflow.actors.driver.summary import summarize
from asyncflow.actors.driver.supervisor import RunFailed, Supervisor
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime.run_dir import LaunchInfo
from asyncflow.actors.trainer.checkpoints import done_step, latest_good_checkpoint
from asyncflow.config import names
from asyncflow.config.run import RunConfig
from asyncflow.core import protocol
from asyncflow.core.actor import ServedActor, serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.disk_space import no_space_left
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.host import STACKS_WAIT_S, collect_stacks, stacks_path
from asyncflow.core.ref import close_sockets
from asyncflow.core.tq.client import MANAGER_NAME, TQClient

if TYPE_CHECKING:
    from asyncflow.actors.driver._scaling import Scaler
    from asyncflow.actors.driver.ray_hosts import RayHosts

log = logging.getLogger(__name__)

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


HANG_REPORT_ASK_S = 5.0
"""How long the stall report waits for the queue's answers (a stalled queue must not hold it)."""
STALL_STEP_FACTOR = 3.0
"""A stall is declared after this many times the slowest step seen (or the preflight's
estimate of a step, before the first), when that is longer than ``logging.hang_timeout_s``."""


def oversubscribed(cfg: RunConfig, hosts: list[str], cores: int | None = None) -> str:
    """A warning when the computing processes of a cpu run ask for more than twice this
    machine's cores in torch threads (each then runs at a fraction of its speed, and
    the step gets slower, not faster); empty otherwise."""
    if cfg.cluster.device != "cpu" or cfg.cluster.launcher != "local":
        return ""
    cores = cores or os.cpu_count() or 1
    busy = [h for h in hosts if topology.computes(h)]
    threads = len(busy) * cfg.cluster.threads_per_process
    if threads <= 2 * cores:
        return ""
    return (
        f"!! {len(busy)} computing processes x {cfg.cluster.threads_per_process} thread(s) on {cores} cores: "
        "oversubscribed, each runs at a fraction of its speed; lower rollout.num_replicas or "
        "cluster.threads_per_process"
    )


def stall_timeout_s(hang_timeout_s: float, slowest_step_s: float, estimate_s: float | None) -> float:
    """Seconds without a trainer step after which the driver reports a stall: the larger
    of ``hang_timeout_s`` and ``STALL_STEP_FACTOR`` x the slowest step seen so far
    (``slowest_step_s``; 0: none yet), or, before the first step, x the preflight's
    estimate of a step's time (``estimate_s``; None: no estimate)."""
    expected = slowest_step_s if slowest_step_s > 0 else (estimate_s or 0.0)
    return max(hang_timeout_s, STALL_STEP_FACTOR * expected)


class BusyPoll:
    """When the driver asks every worker for its busy time (``GetRoleStats``, one ask each)
    for the busy fractions the collector adds to each step's metrics line: every
    ``interval_s`` until the first step (so the first line has them), then only when a new
    step has come and ``interval_s`` has passed since the last round. A step of minutes (a
    real model at scale) costs one round of asks, not one per interval; each line still
    takes the latest figures."""

    def __init__(self, interval_s: float = 2.0):
        self.interval_s = interval_s
        self._last_s: float | None = None  # when the last round was
        self._steps_then = 0  # the collector's step count at the last round

    def due(self, now: float, num_steps: int) -> bool:
        if self._last_s is not None and (
            now - self._last_s < self.interval_s or (num_steps > 0 and num_steps <= self._steps_then)
        ):
            return False
        self._last_s, self._steps_then = now, num_steps
        return True


class Launcher:
    def __init__(self, cfg: RunConfig, run_dir: Path, launch: LaunchInfo, step_estimate_s: float | None = None):
        self.cfg = cfg
        self.run_dir = run_dir
        self.launch = launch
        self.step_estimate_s = step_estimate_s  # the preflight's estimate of a step (s), for the stall timeout
        self.num_stall_reports = 0
        self.roles = topology.roles_of(cfg)
        self.supervisor = Supervisor(cfg, run_dir)
        self.ended = threading.Event()  # set by the collector: RunFinished or RoleFailed
        self.stopping = False
        self.lost_process = False  # a process the run cannot go on without died: stop fast, then resume
        self.scaler: Scaler | None = None  # the online planner's driver side ([planner] online = true)
        self.ray_hosts: RayHosts | None = None  # [cluster] launcher = "ray"
        # what start builds, each None until its stage runs (the undos are in ``teardown``)
        self.teardown = Teardown()
        self.directory: ServedActor | None = None
        self.dc: DirectoryClient | None = None
        self.collector: ServedActor | None = None
        self.transport = cfg.cluster.transport
        self.started_wall_s: float | None = None  # when cluster.json was first written
        self._addresses: set[str] = set()  # the run's actors' (listed as the stop begins): the driver's sockets to them close
        self._stage: StageRunner = lambda name, fn, *args: fn(*args)  # the stop's, while it runs

    def tasks(self) -> list[str]:
        return topology.tasks(self.roles, self.cfg)

    def plan(self) -> None:
        self.supervisor.plan(topology.plan_hosts(self.cfg, str(self.run_dir), self.roles))

    # -- start / stop --------------------------------------------------------------------
    def start(self) -> None:
        """Start the driver's actors, then every process host and actor. Each stage that
        builds something pushes its undo onto ``self.teardown`` as soon as it exists,
        which ``stop`` unwinds: a start that fails half way is stopped exactly as far as
        it got."""
        cfg, sup, undo = self.cfg, self.supervisor, self.teardown
        ipc_dir = tempfile.mkdtemp(prefix="af-")  # short: ipc paths are limited to ~100 bytes
        # a cached dialer to an actor that is gone redials it forever (8% of a core in an idle
        # driver after one run): the driver's sockets to every actor of the run close last
        undo.push("close the driver's sockets to the run's actors", self._close_sockets, ipc_dir)
        undo.push(f"remove {ipc_dir}", shutil.rmtree, ipc_dir, True)  # the ipc sockets' directory (empty by then)
        transport = msgspec.structs.replace(cfg.cluster.transport, ipc_dir=ipc_dir)
        if cfg.cluster.launcher == "ray":  # Ray places the hosts; the driver listens on its node's address
            from asyncflow.actors.driver.ray_hosts import RayHosts

            self.ray_hosts = ray_hosts = RayHosts(cfg.cluster, sup.num_devices)
            undo.push("close the Ray hosts", ray_hosts.close)
            sup.spawn, sup.spawn_many = ray_hosts.spawn, ray_hosts.spawn_many
            transport = ray_hosts.connect(transport)
        self.transport = transport.validate()
        sup.pin_cores, why = pinning(cfg)  # before any host starts: the cores are watched idle (actors/driver/_pinning.py)
        if why:
            click.echo(why)
        self.directory = directory = start_directory(self.transport)
        undo.push("stop the directory", directory.stop)
        self.dc = dc = DirectoryClient(directory.address, self.transport)
        from asyncflow.actors.driver._loggers import build_loggers

        loggers = build_loggers(cfg.logging, self.run_dir, cfg)
        for logger in loggers:
            undo.push(f"close logger {type(logger).__name__}", logger.close)
        self.collector = collector = serve_actor(
            CollectorActor,
            names.COLLECTOR,
            self.transport,
            directory_address=directory.address,
            run_dir=str(self.run_dir),
            num_steps=cfg.train.num_steps,
            progress=cfg.logging.progress,
            loggers=loggers,
            trace_every_s=cfg.logging.trace_every_s if cfg.logging.spans else 0.0,
            ended=self.ended,
        )
        undo.push("stop the collector", collector.stop)
        undo.push("write trace.json", collector.pykka_ref.ask, messages.WriteTrace(path=str(self.run_dir / "trace.json")))
        dc.register(collector.entry())
        roster = serve_actor(
            RosterActor, names.ROSTER, self.transport, directory_address=directory.address, replicas=sup.replicas
        )
        undo.push("stop the roster", roster.stop)
        dc.register(roster.entry())
        env = {
            **quiet_progress_bars(),
            "OMP_NUM_THREADS": str(cfg.cluster.threads_per_process),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(
                filter(None, [*cfg.cluster.python_path, os.getcwd(), os.environ.get("PYTHONPATH", "")])
            ),
            "ASYNCFLOW_SPANS": "1" if cfg.logging.spans else "0",
            "ASYNCFLOW_LOG_DIR": str((self.run_dir / "logs").absolute()),
        }
        sup.attach(dc, self.transport, env)
        sup.on_restart = self.write_cluster_file
        if cfg.cluster.launcher == "local":  # a frozen host is named, and killed once frozen too long (_freezes.py)
            sup.freezes = FreezeWatch(self.transport).start()
            undo.push("stop the freeze watch", sup.freezes.stop)
            sup.oom = OomCount.of_this_process()  # a SIGKILL the kernel counted is named an out-of-memory kill
        click.echo(f"starting {len(sup.names())} processes: {', '.join(sup.names())}")
        crowded = oversubscribed(cfg, sup.names())
        if crowded:
            click.echo(crowded)
        undo.push("mark cluster.json stopped", _cluster_file.mark_stopped, self.run_dir.absolute())
        undo.push("stop the processes", self._stop_processes)  # those started, should the start fail half way
        sup.spawn_all()
        self.write_cluster_file()
        queue = sup.names(topology.QUEUE) + sup.names(topology.SHARD)
        sup.start_actors(queue)
        if self.launch.resume_from:
            saved = TQClient(dc, consumer="driver").load(str(Path(self.launch.resume_from) / "queue"))
            click.echo(f"resumed the queue: {saved.num_rows} rows from {self.launch.resume_from}")
        sup.start_actors([h for h in sup.names() if h not in queue])
        if cfg.rollout.gateway.enabled and cfg.rollout.gateway.all_replicas:  # one URL before every replica's gateway
            from asyncflow.gateway.front import serve_front

            front = serve_front(
                cfg.rollout.gateway,
                self.run_dir,
                cfg.rollout.num_replicas,
                roster=sup.replica_indices,  # replicas the online planner adds or removes
                secret=self.transport.secret_bytes(),
            )
            undo.push("stop the gateway front", front.close)
        if cfg.planner.online:
            from asyncflow.actors.driver._scaling import Scaler

            self.scaler = Scaler(cfg, self.run_dir, sup, dc, self.roles, subscribe=self.subscribe, stopping=lambda: self.stopping)
            undo.push("stop the online planner", self.scaler.stop)
            self.scaler.start()
        for name in sup.workers():
            dc.ref(name).ask(messages.StartWork(), timeout_s=30)
        click.echo("every process is up; waiting for the first step (the first rollouts and the first batch)")
        gateway = gateway_line(self.run_dir, cfg)
        if gateway:
            click.echo(gateway)

    def _client(self) -> DirectoryClient:
        assert self.dc is not None, "start() comes first"
        return self.dc

    def _collector(self) -> ServedActor:
        assert self.collector is not None, "start() comes first"
        return self.collector

    def subscribe(self, refs: list) -> None:
        """Tell every following StepMetrics to these in-process refs (the planner)."""
        self._collector().pykka_ref.ask(Subscribe(refs))

    def write_cluster_file(self) -> None:
        """RUN_DIR/cluster.json and the pointer to it, for `afctl status` (no secret)."""
        assert self.directory is not None, "start() comes first"
        if self.started_wall_s is None:
            self.started_wall_s = time.time()  # kept when a restart rewrites the file
        _cluster_file.write(
            _cluster_file.ClusterFile(
                run_dir=str(self.run_dir.absolute()),
                directory=self.directory.address,
                transport=self.transport,
                driver_pid=os.getpid(),
                started_at=self.started_wall_s,
                hosts={h: p.pid for h, p in self.supervisor.procs().items()},
                workers=self.supervisor.workers(),
                tasks=self.tasks(),
            )
        )

    def stop(self) -> list[tuple[str, BaseException]]:
        """Unwind what ``start`` built, newest first (``teardown``): the online planner,
        the processes (the workers' loops first, each finishing its unit, then the queue's
        last notices, then the hosts), the roster, the collector (after it writes
        trace.json), the loggers, the directory, Ray, the ipc directory, the driver's
        sockets. Nothing is stopped that did not start; a second stop finds nothing.

        Every stage runs whatever failed before it: an error (a full disk while writing
        the trace, a host that cannot be stopped) is logged and returned as
        ``(stage, error)``, and the next stage goes on, so the driver never waits at
        exit on an actor left running. An interrupt (Ctrl-C again, SIGTERM) ends the
        stage it lands in, not the stop: every stage still runs (the driver's own actors'
        threads would keep the process from exiting), and the interrupt is raised once
        the stop is done."""
        errors: list[tuple[str, BaseException]] = []
        interrupts: list[KeyboardInterrupt] = []

        def stage(name: str, fn, *args) -> None:
            try:
                fn(*args)
            except Exception as exc:  # the stop path's containment boundary: the next stages must run
                log.error(
                    "stopping the run: %s failed: %s: %s (going on with the rest of the stop)", name, type(exc).__name__, exc
                )
                errors.append((name, exc))
            except KeyboardInterrupt as exc:
                log.warning("stopping the run: interrupted during %s; finishing the stop (every stage is bounded)", name)
                interrupts.append(exc)

        self.stopping = True
        self._stage = stage
        try:
            if (
                self.dc is not None and self.directory is not None and self.teardown.names()
            ):  # a second stop: all gone  # the driver's sockets to these close at the end
                dc = self.dc
                self._addresses.add(self.directory.address)
                stage("list the run's actors", lambda: self._addresses.update(e.address for e in dc.list()))
        except KeyboardInterrupt as between:
            interrupts.append(between)
        try:
            self.teardown.unwind(stage)
        except KeyboardInterrupt as between:  # between two stages (each undo has run)
            interrupts.append(between)
        for name, exc in errors:  # a full disk named as such, with the free space (what to fix first)
            why = no_space_left(exc, self.run_dir) or f"{type(exc).__name__}: {exc}"
            click.echo(f"!! while stopping: {name} failed: {why}", err=True)
        if interrupts:
            raise interrupts[0]
        return errors

    def _stop_processes(self) -> None:
        """The workers' loops, the queue's last notices, then every host process (those
        started: a start that failed half way has fewer)."""
        stage = self._stage
        workers = self.supervisor.workers()
        procs = self.supervisor.procs()
        if self.lost_process:
            # the run resumes from its last checkpoint: nothing a worker would finish or ack
            # now is kept, and workers that wait on the lost process would hold the stop for
            # their whole timeouts (serially: minutes), so the hosts are ended at once
            with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
                futures = {h: pool.submit(p.terminate, LOST_STOP_GRACE_S) for h, p in procs.items()}
        else:
            with ThreadPoolExecutor(max_workers=max(1, len(workers))) as pool:  # at once: each finishes its unit
                stops = {name: pool.submit(self._stop_worker, name) for name in workers}
            for name, future in stops.items():
                stage(f"stop role {name}", future.result)
            stage("settle the queue's bookkeeping", self._settle_queue)
            with ThreadPoolExecutor(max_workers=max(1, len(procs))) as pool:
                futures = {h: pool.submit(p.stop, timeout_s=20) for h, p in procs.items()}
        for host, future in futures.items():
            stage(f"stop host {host}", future.result)

    def _close_sockets(self, ipc_dir: str) -> None:
        """Close the driver's sockets to every actor of the run (listed as the stop began)
        and to every address in the run's ipc directory."""
        addresses, prefix = self._addresses, f"ipc://{ipc_dir}/"
        close_sockets(lambda address: address in addresses or address.startswith(prefix))

    def _settle_queue(self) -> None:
        """The workers' last acks (flushed as they stopped) travel on as notices: each
        controller's to the manager, then the manager's frees to the shards and the
        controllers. Deliver them before the queue's processes stop: a notice to an
        actor already stopped would wait out its timeout and hold the stop that long.
        Nothing to settle where the queue's process is not up (lost, or never planned)."""
        if not self.supervisor.runs(MANAGER_NAME):
            return
        manager = self._client().ref(MANAGER_NAME, wait_s=0.5)
        info = manager.ask(protocol.GetQueueInfo(), timeout_s=10)
        for name in info.controllers.values():
            self._client().ref(name, wait_s=0.5).ask(protocol.FlushNotices(), timeout_s=30)
        manager.ask(protocol.FlushNotices(), timeout_s=30)

    def _stop_worker(self, name: str) -> None:
        if not self.supervisor.actor_alive(name):
            return  # its process is gone: asking would only wait out the timeout
        try:
            self._client().ref(name, wait_s=0.1).ask(protocol.Stop(), timeout_s=60)
        except (AsyncflowError, LookupError):
            pass  # never started, or already gone

    # -- watching ------------------------------------------------------------------------
    def role_stats(self) -> dict[str, messages.RoleStats]:
        out = {}
        for name in self.supervisor.workers():
            if not self.supervisor.actor_alive(name):
                continue
            try:
                out[name] = self._client().ref(name, wait_s=0.5).ask(messages.GetRoleStats(), timeout_s=5)
            except (AsyncflowError, LookupError):
                pass  # restarting or gone: no figure this time
        return out

    def busy_fractions(self, stats: dict[str, messages.RoleStats]) -> dict[str, float]:
        return {n: s.busy_s / max(1e-9, s.busy_s + sum(s.wait_s.values())) for n, s in stats.items()}

    def run_state(self) -> messages.RunState:
        # block=True is the default; spelled out, it selects pykka's typed overload that returns the reply, not a Future
        return self._collector().pykka_ref.ask(messages.GetRunState(), block=True)

    def check_hosts(self) -> None:
        """Handle the processes that died since the last look, and start again those
        whose restart is due (``Supervisor.check``). Raises RunFailed (never anything
        else for a death)."""
        if self.stopping:
            return
        try:
            self.supervisor.check()
        except RunFailed as exc:
            self.lost_process = exc.process_lost  # the stop that follows ends the hosts at once
            raise

    def hang_report(
        self,
        waited_s: float,
        last_spans: dict[str, tuple[str, float]],
        stacks_file: Path | None = None,
        timeout_s: float | None = None,
    ) -> str:
        """The stall report's block for the terminal: one line per role, the queue per
        task, and where every process's Python stacks are (``dump_stacks``)."""
        why = f" (stall timeout {timeout_s:.0f} s)" if timeout_s is not None else ""
        lines = [f"no trainer step completed in {waited_s:.0f} s{why}; what every role is doing:"]
        stats = self.role_stats()
        now = time.time()
        suspects = []  # (seconds without a finished span, role, what it is doing): roles busy, not waiting
        for name in self.supervisor.workers():
            span = last_spans.get(name)
            age = now - span[1] if span else waited_s
            last = f"last span {span[0]!r} ended {age:.1f} s ago" if span else "no span received"
            s = stats.get(name)
            if s is None:
                lines.append(f"  {name:<14} NO ANSWER to GetRoleStats ({last})")
                suspects.append((age, name, "not answering"))
            else:
                lines.append(
                    f"  {name:<14} pid {s.pid:<7} state {s.state:<14} version {s.version:<4} items {s.num_items:<6} {last}"
                )
                if not s.state.startswith("wait_") and s.state not in ("idle", "done", "paused"):
                    suspects.append((age, name, f"in {s.state!r}"))
        if suspects:
            age, name, doing = max(suspects)
            lines.append(f"  most likely stalled: {name} ({doing}, no span finished for {age:.1f} s)")
        else:
            lines.append("  every role is waiting: the task states below show which rows are missing")
        try:
            if not self.supervisor.runs(MANAGER_NAME):
                raise LookupError("its process is not running")
            tq = TQClient(self.dc, consumer="driver", timeout_s=HANG_REPORT_ASK_S)
            status = tq.status()
            lines.append(
                f"  queue: {status.num_live_rows}/{status.capacity_rows} rows live, "
                f"{status.num_waiting_allocations} allocations waiting"
            )
            for task in self.tasks():
                t = tq.task_status(task)
                lines.append(
                    f"  task {task:<10} {t.num_rows} rows, {t.num_acked} acked, handed out {t.num_pending}, "
                    f"{t.num_waiting} GetBatch waiting"
                )
        except (AsyncflowError, LookupError) as exc:  # the queue's process lost or stalled itself
            lines.append(f"  queue: no answer ({exc})")
        if stacks_file is not None:
            lines.append(f"  Python stacks of every process: {stacks_file}")
        return "\n".join(lines)

    def dump_stacks(self, n: int) -> Path:
        """Every process's Python stacks (SIGUSR1 to all at once; each host appends its
        dump to its own stacks file, ``core.host.collect_stacks``), then the driver's,
        into ``RUN_DIR/logs/stall-<n>.txt``; returns its path."""
        logs = (self.run_dir / "logs").absolute()  # the hosts' ASYNCFLOW_LOG_DIR
        logs.mkdir(parents=True, exist_ok=True)
        procs = self.supervisor.procs()
        stacks = collect_stacks(procs, logs)
        path = logs / f"stall-{n}.txt"
        with path.open("w") as f:
            for host, proc in procs.items():
                f.write(f"--- Python stacks of process {host} (pid {proc.pid}) ---\n")
                text = stacks[host]
                if text is None:
                    text = (
                        "(not running)\n"
                        if not proc.alive()
                        else f"(no dump within {STACKS_WAIT_S:g} s in {stacks_path(logs, host)}: on another machine, its "
                        "own RUN_DIR/logs there; or the process has not set up its handler yet)\n"
                    )
                f.write(text)
            f.write(f"--- Python stacks of the driver (pid {os.getpid()}) ---\n")
            f.flush()
            faulthandler.dump_traceback(file=f, all_threads=True)
        return path

    def stall_report(self, waited_s: float, last_spans: dict[str, tuple[str, float]], timeout_s: float) -> str:
        """Write the next ``stall-<n>.txt`` and return the block naming it."""
        self.num_stall_reports += 1
        stacks_file = self.dump_stacks(self.num_stall_reports)
        return self.hang_report(waited_s, last_spans, stacks_file, timeout_s)

    def wait(self) -> messages.RunFinished:
        """Until the trainer's RunFinished (returned) or a role's RoleFailed (RunFailed);
        meanwhile, every half second: dead processes, the planner's moves, the busy
        fractions (``BusyPoll``: once per new step, at most every 2 s) and, when no step came
        for ``stall_timeout_s``, the stall report."""
        busy_poll = BusyPoll()
        last_hang = time.monotonic()
        while not self.ended.wait(0.5):
            self.check_hosts()
            if self.scaler is not None:
                self.scaler.apply_pending()  # moves of the online planner, between steps
            now = time.monotonic()
            state = self.run_state()
            if busy_poll.due(now, state.num_steps):
                self._collector().pykka_ref.tell(messages.SetBusy(fractions=self.busy_fractions(self.role_stats())))
            since = min(state.since_step_s, now - last_hang)
            timeout_s = stall_timeout_s(self.cfg.logging.hang_timeout_s, state.slowest_step_s, self.step_estimate_s)
            if since > timeout_s:
                click.echo(self.stall_report(since, state.last_spans, timeout_s), err=True)
                last_hang = now
        state = self.run_state()
        if state.finished is None:
            self._role_failed(state.failures[0])
        return state.finished

    def _role_failed(self, failure: messages.RoleFailed) -> NoReturn:
        """Raise RunFailed for a role's error, naming first a dead process it may have
        failed for (a trainer rank's collective breaks when another rank is killed)."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and all(p.alive() for p in self.supervisor.procs().values()):
            time.sleep(0.1)
        self.check_hosts()
        # the resume hint is added once every process has stopped (``_run_once``): the trainer may
        # finish a checkpoint in its stop, and the hint names the newest one then on disk
        raise RunFailed(
            f"role {failure.role} failed: {failure.error.splitlines()[0]} (traceback in "
            f"{self.supervisor.log_file(failure.role)})",
            advice_after_stop=True,
        )


def run(
    cfg: RunConfig | None, run_dir: str | os.PathLike | None, resume: str | None = None, resume_overrides: Sequence[str] = ()
) -> dict:
    """Run to the end; returns the summary (also written to RUN_DIR/summary.json).
    Give a config and a run directory for a new run, or ``resume=RUN_DIR`` (with
    ``resume_overrides``: ``--set`` items of keys that may change on resume).

    When a process that cannot be restarted alone is lost (the queue, a shard, the
    loader, a trainer rank, or its node), the run stops cleanly and, up to
    ``cluster.max_resumes`` times, resumes itself from its last checkpoint."""
    quiet_progress_bars()  # before the tiny model is built and saved
    # The run directory holds the data, the optimizer state and recorded conversations:
    # everything the run (and every process it starts: they inherit the umask) writes
    # is for its user alone, 0700 directories and 0600 files (docs/security.md).
    umask = os.umask(PRIVATE_UMASK)
    try:
        return _run_private(cfg, run_dir, resume, resume_overrides)
    finally:
        os.umask(umask)


PRIVATE_UMASK = 0o077


def _run_private(
    cfg: RunConfig | None, run_dir: str | os.PathLike | None, resume: str | None, resume_overrides: Sequence[str]
) -> dict:
    started = time.monotonic()
    if resume:
        cfg, rd, launch = prepare_resume(resume, resume_overrides)
    else:
        assert cfg is not None and run_dir is not None, "a new run needs a config and a run directory"
        cfg, rd, launch = prepare_new(cfg, run_dir)
    prepare_s = time.monotonic() - started  # data, the tiny model and its warm start: before any process
    os.chmod(rd, 0o700)  # a run directory made before this rule, or by hand, closes too
    resumes: list[dict] = []
    restarts: list[dict] = []  # every launch's (an automatic resume's launch adds its own): summary.json's
    while True:
        try:
            summary = _run_once(cfg, rd, launch, prepare_s, restarts)
        except RunFailed as exc:
            ckpt, _ = latest_good_checkpoint(rd)
            finished = done_step(ckpt) if ckpt is not None else None
            if exc.process_lost and finished is not None and finished >= cfg.train.num_steps:
                # lost after the last step was trained and checkpointed (while the run wound
                # down): the work is done, and a resume would find nothing to train
                assert ckpt is not None
                click.echo(
                    f"!! {str(exc).splitlines()[0]}\n!! after the run had trained its {cfg.train.num_steps} steps "
                    f"and saved {ckpt.name}: nothing is lost, nothing to resume",
                    err=True,
                )
                end = messages.RunFinished(last_step=finished - 1, checkpoint=str(ckpt))
                summary = summarize(rd, cfg, {}, time.monotonic() - started, restarts, end)
                summary["lost_at_end"] = str(exc).splitlines()[0]
                if resumes:
                    summary["resumes"] = resumes
                (rd / "summary.json").write_text(json.dumps(summary, indent=2))
                return summary
            if not exc.process_lost or len(resumes) >= cfg.cluster.max_resumes or ckpt is None:
                if exc.process_lost and cfg.cluster.max_resumes and ckpt is None:
                    click.echo("!! no checkpoint yet to resume from (train.checkpoint_every)", err=True)
                raise
            resumes.append({"error": str(exc).splitlines()[0], "checkpoint": str(ckpt), "time": time.time()})
            click.echo(
                f"!! {str(exc).splitlines()[0]}\n!! resuming from {ckpt} "
                f"(automatic resume {len(resumes)} of {cfg.cluster.max_resumes})",
                err=True,
            )
            started = time.monotonic()
            cfg, rd, launch = prepare_resume(str(rd))
            prepare_s = time.monotonic() - started
            continue
        if resumes:
            summary["resumes"] = resumes
            (rd / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def gateway_line(run_dir: Path, cfg: RunConfig) -> str:
    """Where the gateway answers (its replica wrote RUN_DIR/gateway.json as it started),
    and for how long; empty without one."""
    if not cfg.rollout.gateway.enabled:
        return ""
    try:
        info = json.loads((run_dir / "gateway.json").read_text())
    except (OSError, ValueError):
        return "gateway: its address is not in RUN_DIR/gateway.json yet (see the replica's log)"
    served = f"rollout.{info['replica']}" if info["replica"] != "all" else f"{info['replicas']} rollout replicas, sticky sessions"
    return (
        f"gateway: OpenAI-compatible API at {info['url']}/v1 ({served}; trajectories to "
        f"{info['trajectories']}); it serves while the run trains: {cfg.train.num_steps} steps (train.num_steps)"
    )


def rollout_engine_line(cfg: RunConfig, model_dir: str) -> str:
    """Which rollout engine the replicas build for ``model_dir`` and why (``auto``: the
    model's family; ``engines.factory.resolve_rollout_type``). ConfigError where
    ``type = "native"`` names a model the native engine does not implement."""
    from asyncflow.config.load import ConfigError
    from asyncflow.engines.factory import resolve_rollout_type

    kind = cfg.rollout.engine.type
    taken, why = resolve_rollout_type(kind, model_dir)
    if kind == "native":
        family_engine, reason = resolve_rollout_type("auto", model_dir)
        if family_engine != "native":
            raise ConfigError(
                f'rollout.engine.type = "native": {reason}; set it to "auto" (or "hf": the model\'s own forward, slower)'
            )
    streams, mode_why = cfg.rollout_mode_why()
    return f"rollout engine: {taken} ({why}); {'streamed' if streams else 'unit by unit'} ({mode_why})"


def _run_once(cfg: RunConfig, rd: Path, launch: LaunchInfo, prepare_s: float = 0.0, restarts: list[dict] | None = None) -> dict:
    """One launch, to its end. ``restarts``: those of the earlier launches of this ``afctl up``
    (lost, then resumed automatically); this launch's are added to it however it ends, and
    summary.json lists them all."""
    restarts = [] if restarts is None else restarts
    faulthandler.enable()
    from asyncflow.actors.driver.preflight import check, launch_step_estimate, mean_prompt_tokens

    try:  # the activations' share of the memory estimate needs the prompts' length
        prompt_tokens: float | None = mean_prompt_tokens(cfg, launch.data_path, launch.base_model_dir)
    except (OSError, ValueError, KeyError):
        prompt_tokens = None  # launch_step_estimate says why below
    click.echo(rollout_engine_line(cfg, launch.model_dir))
    click.echo(check(cfg, launch.model_dir, launch.reward_model_dir, prompt_tokens))
    estimate = launch_step_estimate(cfg, launch.model_dir, launch.data_path, launch.base_model_dir)
    timeout_s = stall_timeout_s(cfg.logging.hang_timeout_s, 0.0, estimate.seconds)
    click.echo(
        f"{estimate.line}\n  a stall is reported after {timeout_s:.0f} s without a step (logging.hang_timeout_s, or "
        f"{STALL_STEP_FACTOR:g} x the slowest step: docs/faults.md, 'Stalls')"
    )
    launcher = Launcher(cfg, rd, launch, estimate.seconds or None)
    launcher.supervisor.memory_estimates = functools.partial(
        run_memory_estimates, cfg, launch.model_dir, launch.reward_model_dir, prompt_tokens
    )  # named beside a host's out-of-memory kill
    launcher.plan()
    t0 = time.monotonic()
    click.echo(
        f"run directory: {rd}  ({cfg.workflow.mode}, staleness {cfg.staleness}, "
        f"{len(launcher.supervisor.names())} processes, steps {launch.start_step + 1}..{cfg.train.num_steps})"
    )
    interrupted = False
    failed: RunFailed | None = None
    try:
        launcher.start()
        result = launcher.wait()
        stats = launcher.role_stats()
    except KeyboardInterrupt:
        click.echo("\ninterrupted: stopping every process (a checkpoint being written is finished first)", err=True)
        interrupted = True
        raise
    except RunFailed as exc:
        failed = exc
        raise
    finally:
        try:
            launcher.stop()
        finally:
            restarts.extend(launcher.supervisor.restarts)  # a lost launch's too: the next launch's summary keeps them
            # the resume hint only now: the stop may have finished a checkpoint, which the resume uses
            if interrupted:  # what ran until Ctrl-C / SIGTERM, marked as such (no role stats: the roles are gone)
                click.echo(f"stopped. {resume_advice(rd)}", err=True)
                summary = summarize(rd, cfg, {}, time.monotonic() - t0, restarts, None, interrupted=True)
                (rd / "summary.json").write_text(json.dumps(summary, indent=2))
            if failed is not None and failed.advice_after_stop:
                failed.add_advice(resume_advice(rd))
    wall_s = time.monotonic() - t0
    summary = summarize(rd, cfg, stats, wall_s, restarts, result)
    summary["pinned_trainer_cores"] = launcher.supervisor.pin_cores or 0  # the run's decision (actors/driver/_pinning.py)
    summary["prepare_s"] = round(prepare_s, 2)
    (rd / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
