"""Process hosts: one OS process that runs named actors from specs.

The driver calls :func:`spawn_host`; the child (``python -m asyncflow.core.host``)
serves a ``HostActor`` named ``host.<name>``, registers it in the directory, and
starts the actors it is asked for (``StartActors``), registering each by name.
``Stop`` stops every actor, unregisters them, and ends the process.

No orphans: the child asks Linux to SIGTERM it when its parent dies
(``PR_SET_PDEATHSIG``) and stops cleanly on SIGTERM (and on SIGINT unless a driver
started it: Ctrl-C reaches the whole process group, and the driver stops the roles
in order first).
SIGUSR1 dumps the Python stack of every thread (faulthandler: it runs even while a
thread holds the GIL) to ``<name>.stacks.txt`` in the log directory the driver names
(``LOG_DIR_ENV``), or to stderr without one; the driver's stall report gathers each
process's dump with :func:`collect_stacks`.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from asyncflow.core import protocol
from asyncflow.core.actor import Actor, ActorContext, ServedActor, serve_actor
from asyncflow.core.directory import DirectoryClient
from asyncflow.core.disk_space import no_space_left
from asyncflow.core.errors import ActorGone, ActorTimeout, AsyncflowError, HostExited
from asyncflow.core.ref import close_all_sockets
from asyncflow.core.transport import TRANSPORT_ENV, TransportConfig, sweep_ipc_dir

log = logging.getLogger(__name__)


def class_path(cls: type) -> str:
    """``package.module:Class``: how a process host finds ``cls`` (``import_object``'s
    inverse). Every ``ActorSpec.cls`` is made by it, from the class, never written by hand."""
    return f"{cls.__module__}:{cls.__qualname__}"


def actor_spec(name: str, cls: type, **kwargs: Any) -> protocol.ActorSpec:
    """The wire form of "start ``cls(ctx, **kwargs)`` as ``name``"."""
    return protocol.ActorSpec(name=name, cls=class_path(cls), kwargs=msgspec.msgpack.encode(kwargs))


def import_object(path: str) -> Any:
    """``package.module:attr`` -> the object, with an error that says what to fix."""
    module_name, _, attr = path.partition(":")
    if not attr:
        raise ValueError(f"{path!r} is not a dotted path of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ValueError(f"cannot import module {module_name!r} of {path!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None


def start_actors(
    specs: list[protocol.ActorSpec], transport: TransportConfig, directory: DirectoryClient | None
) -> list[ServedActor]:
    """Start each spec's actor in this process and register it. A failure (an import,
    the actor's ``__init__``) is logged with its whole traceback, which goes to the
    process's log file (``LOG_DIR_ENV``), then raised: the driver gets only its message."""
    served = []
    for spec in specs:
        try:
            cls = import_object(spec.cls)
            if not (isinstance(cls, type) and issubclass(cls, Actor)):
                raise TypeError(f"{spec.cls} is not an asyncflow Actor subclass")
            kwargs = msgspec.msgpack.decode(spec.kwargs) if spec.kwargs else {}
            actor = serve_actor(cls, spec.name, transport, directory_address=directory.address if directory else None, **kwargs)
        except Exception as exc:
            log.exception("starting actor %s (%s) failed: %s: %s", spec.name, spec.cls, type(exc).__name__, exc)
            raise
        served.append(actor)
        if directory is not None:
            directory.register(actor.entry())
    return served


class _Leftovers:
    """In-process (the host's own exit path): which actors the host still runs, and
    which it could not stop; answered as ``(stuck, running)`` lists of names/actors."""


class HostActor(Actor):
    """Takes StartActors, StopActor, Ping, Stop; answers Started / Ok. In-process,
    ``_Leftovers`` from the host's exit path."""

    Inbox = protocol.HostIn
    Urgent = (protocol.Ping,)  # the driver's heartbeat: answered while StartActors loads a model
    Control = True  # small frames only (control_max_message_bytes)

    def __init__(self, ctx: ActorContext, stopped: threading.Event):
        super().__init__(ctx)
        self._stopped = stopped
        self.actors: dict[str, ServedActor] = {}
        self.stuck: list[str] = []  # actors whose stop timed out or failed (their threads may still run)

    def handle(self, msg, pending):
        match msg:
            case protocol.StartActors(specs=specs):
                started = start_actors(specs, self.ctx.transport, self.ctx.directory)
                self.actors.update({a.name: a for a in started})
                return protocol.Started(entries=[a.entry() for a in started])
            case protocol.StopActor(name=name):
                self._stop_one(name)
                return protocol.Ok()
            case protocol.Stop():
                for name in reversed(list(self.actors)):  # the reverse of the start order: the
                    self._stop_one(name)  # queue's controllers before the manager they notify
                self._stopped.set()
                return protocol.Ok()
            case _Leftovers():
                return list(self.stuck), list(self.actors.values())

    def handle_urgent(self, msg):
        return protocol.Pong(
            name=self.ctx.name, pid=os.getpid(), host=socket.gethostname(), num_rejected_frames=self.ctx.num_rejected_frames
        )

    def _stop_one(self, name: str) -> None:
        actor = self.actors.pop(name, None)
        if actor is None:
            raise KeyError(f"this host runs no actor named {name!r}; it runs {sorted(self.actors)}")
        try:
            self.ctx.directory.unregister(name, actor.address)
        except (ActorTimeout, ActorGone):
            log.warning("directory gone while unregistering %s", name)
        if not _stop_contained(actor, ACTOR_STOP_S):
            self.stuck.append(name)


PARENT_ENV = "ASYNCFLOW_PARENT_PID"


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent dies. Set by the child itself, not in a
    ``preexec_fn``: that runs Python in the forked child, which finalizes the other
    threads' nng contexts there, and nng panics ("not fork-reentrant safe") once a
    driver has threads that asked something (the online planner's, a restart mid-run)."""
    if sys.platform.startswith("linux") and parent_pid:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:  # the parent died before the request was in place
            os.kill(os.getpid(), signal.SIGTERM)


REGISTER_POLL_S = 0.5
"""How often a host's start looks whether the process exited while its registration
is awaited (each look is one directory lookup that waits this long)."""
EXIT_GRACE_S = 2.0
"""After a host's connection broke, how long to wait for its exit to be visible."""


class HostProcess:
    """Driver-side handle of a spawned process host."""

    def __init__(self, name: str, proc: subprocess.Popen, directory: DirectoryClient):
        self.name = name
        self.proc = proc
        self._directory = directory

    @property
    def actor_name(self) -> str:
        return f"host.{self.name}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, specs: list[protocol.ActorSpec], timeout_s: float = 120.0) -> list[protocol.ActorEntry]:
        """Start ``specs`` in this host once it registered. A host that exits first
        raises HostExited at once (its exit is watched while the registration is
        awaited), as does one that dies while it starts the actors."""
        ref = self._wait_registered(timeout_s)
        try:
            return ref.ask(protocol.StartActors(specs=specs), timeout_s=timeout_s).entries
        except (ActorGone, ActorTimeout):
            if self._exited_within(EXIT_GRACE_S):
                raise HostExited(self.name, self.returncode, "while it started its actors") from None
            raise

    def _wait_registered(self, timeout_s: float):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._directory.ref(self.actor_name, wait_s=REGISTER_POLL_S, refresh=True)
            except LookupError:
                if not self.alive():
                    raise HostExited(self.name, self.returncode, "before it registered") from None
                if time.monotonic() >= deadline:
                    raise LookupError(
                        f"process host {self.name!r} (pid {self.pid}) did not register within {timeout_s:g} s; "
                        f"it is still running: its stacks (`kill -USR1 {self.pid}`) show where it hangs"
                    ) from None

    def _exited_within(self, seconds: float) -> bool:
        """Whether the process has exited, or does within ``seconds`` (its socket
        breaks a moment before the exit is visible)."""
        deadline = time.monotonic() + seconds
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code once the process ended (negative: the signal that ended it)."""
        return self.proc.returncode

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop cleanly; SIGKILL after ``timeout_s`` if it does not exit."""
        if self.alive():
            try:
                self._directory.ref(self.actor_name, wait_s=0.5).ask(protocol.Stop(), timeout_s=timeout_s)
            except (AsyncflowError, LookupError) as exc:  # whatever the answer, the process must end
                log.warning("host %s did not stop on request (%s); terminating", self.name, exc)
                self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def terminate(self, grace_s: float) -> None:
        """SIGTERM (the host stops its actors, briefly), SIGKILL after ``grace_s``."""
        if self.alive():
            self.proc.terminate()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def dump_stacks(self) -> None:
        """The host writes every thread's Python stack to its stacks file (``stacks_path``;
        stderr without a log directory): SIGUSR1."""
        os.kill(self.pid, signal.SIGUSR1)

    def kill(self) -> None:
        """SIGKILL (fault-injection and last resort)."""
        self.proc.kill()
        self.proc.wait()


CPUS_ENV = "ASYNCFLOW_CPUS"
"""Cores (comma-separated ids) a host process runs on, set by the driver
(``[cluster] pin_trainer_cores``); unset: every core."""


def spawn_host(
    name: str,
    directory: DirectoryClient,
    transport: TransportConfig,
    specs: list[protocol.ActorSpec] | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
) -> HostProcess:
    """Start a process host and (optionally) actors in it; returns once they are registered."""
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env[TRANSPORT_ENV] = transport.to_env()
    child_env[PARENT_ENV] = str(os.getpid())
    directory.unregister(f"host.{name}")  # a host restarted under the same name must not be confused with the dead one
    cmd = [sys.executable, "-m", "asyncflow.core.host", "--name", name, "--directory", directory.address]
    proc = subprocess.Popen(cmd, env=child_env)  # no preexec_fn: see _die_with_parent
    host = HostProcess(name, proc, directory)
    if specs:
        try:
            host.start(specs, timeout_s=timeout_s)
        except BaseException:
            host.stop(timeout_s=5)
            raise
    return host


STOP_GRACE_S = 30.0
"""A host asked to stop exits within this long, even if an actor hangs in its unit
of work or in on_stop (its stacks are printed first, so the hang can be found)."""
ORPHAN_GRACE_S = 10.0
"""The same for a host whose driver died (kill -9): no peer is left to finish with. Counted
from the signal that told it (the kernel's SIGTERM, or the look that saw the driver gone),
the settling look (``ORPHAN_SETTLE_S``) and the exit itself (``ORPHAN_EXIT_S``) included."""
ORPHAN_EXIT_S = 0.5
"""What an orphan keeps of ``ORPHAN_GRACE_S`` for the exit itself after its exit timer
fires: its stacks printed, its run's ipc directory swept (``transport.sweep_ipc_dir``)."""
ACTOR_STOP_S, ORPHAN_ACTOR_STOP_S = 10.0, 3.0
"""How long the stop of one actor waits for it (its unit of work in progress to end)."""


PARENT_POLL_S = 2.0
"""How often a serving host looks whether its driver is still its parent."""
SIGNAL_POLL_S = 0.2
"""How often a serving host looks whether a SIGTERM (or SIGINT) was recorded."""
ORPHAN_SETTLE_S = 1.0
"""How long a host woken by SIGTERM looks whether its driver is dying (``_orphaned``)."""


def _orphaned(parent_pid: int, settle_s: float = ORPHAN_SETTLE_S) -> bool:
    """Whether this host's driver is gone. PR_SET_PDEATHSIG fires when the driver's
    *thread* that started this process dies: while the other threads of a killed driver
    are still dying, the kernel hands this process to one of them, so ``getppid()``
    names the driver for a moment more. Look again for up to ``settle_s``; a driver
    that sent SIGTERM itself stays our parent all along."""
    if not parent_pid:
        return False
    deadline = time.monotonic() + settle_s
    while os.getppid() == parent_pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _exit_by(end: float, name: str, parent_pid: int = 0, orphan_of: int = 0, transport: TransportConfig | None = None) -> None:
    """Exit (stacks printed first) at monotonic time ``end``, or ``ORPHAN_GRACE_S`` (less
    ``ORPHAN_EXIT_S``) after the driver ``parent_pid`` is seen gone, whichever comes first.
    An orphan (``orphan_of``: its dead driver's pid, or found so while waiting) sweeps its
    run's ipc directory before it exits (``transport.sweep_ipc_dir``)."""

    started = time.monotonic()

    def expire() -> None:
        deadline, watching, dead = end, parent_pid, orphan_of
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.25))
            if watching and os.getppid() != watching:  # the driver died while this host stopped
                deadline = min(deadline, time.monotonic() + ORPHAN_GRACE_S - ORPHAN_EXIT_S)
                watching, dead = 0, watching
        print(f"[{name}] did not stop within {deadline - started:.1f} s; stacks follow, then exit", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(all_threads=True)
        if dead and transport is not None:
            _sweep(transport, dead)
        os._exit(1)

    threading.Thread(target=expire, name=f"{name}-exit-timer", daemon=True).start()


def _sweep(transport: TransportConfig, driver_pid: int) -> None:
    """An orphan's last act: its dead driver's sockets and its own (it is exiting) out of the
    run's ipc directory, and the directory with them when this host is the last one out (the
    driver, killed, never removed it)."""
    try:
        sweep_ipc_dir(transport, gone={driver_pid, os.getpid()})
    except OSError as exc:  # a directory that cannot be swept must not keep the exit from happening
        log.warning("could not sweep the ipc directory %s: %s", transport.ipc_dir, exc)


LOG_DIR_ENV = "ASYNCFLOW_LOG_DIR"
"""Set by the driver to RUN_DIR/logs: each host writes its whole log (tracebacks
included) to ``<name>.log`` there and only each record's first line to stderr."""


STACKS_SUFFIX = ".stacks.txt"


def stacks_path(log_dir: str | os.PathLike, name: str) -> Path:
    """Where host ``name`` appends its Python stacks on SIGUSR1, one dump after the other."""
    return Path(log_dir) / f"{name}{STACKS_SUFFIX}"


STACKS_WAIT_S = 3.0
"""How long ``collect_stacks`` waits for the processes' dumps."""
STACKS_SETTLE_S = 0.2
"""A dump is complete once its file has not grown for this long."""


class DumpsStacks(Protocol):
    """A process handle that can be asked for its stacks (``HostProcess``, a Ray host's)."""

    def alive(self) -> bool: ...

    def dump_stacks(self) -> None: ...


def collect_stacks(
    procs: Mapping[str, DumpsStacks],
    log_dir: str | os.PathLike,
    timeout_s: float = STACKS_WAIT_S,
    settle_s: float = STACKS_SETTLE_S,
) -> dict[str, str | None]:
    """Ask every live process for its stacks at once (SIGUSR1) and return, per name, the
    dump each appended to its stacks file (``stacks_path``), or None: not running, or
    nothing arrived within ``timeout_s`` (a process on another machine whose log
    directory is not this one, or one that had not set up its handler yet)."""
    paths = {name: stacks_path(log_dir, name) for name in procs}

    def size(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    offsets = {name: size(path) for name, path in paths.items()}
    asked = []
    for name, proc in procs.items():
        if proc.alive():
            try:
                proc.dump_stacks()
                asked.append(name)
            except ProcessLookupError:  # it ended after the look
                pass
    sizes, grew_at = dict(offsets), {}
    waiting, deadline = set(asked), time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)
        now = time.monotonic()
        for name in list(waiting):
            current = size(paths[name])
            if current != sizes[name]:
                sizes[name], grew_at[name] = current, now
            elif name in grew_at and now - grew_at[name] >= settle_s:
                waiting.discard(name)
    out: dict[str, str | None] = dict.fromkeys(procs)
    for name in asked:
        if sizes[name] > offsets[name]:
            with paths[name].open("rb") as f:
                f.seek(offsets[name])
                out[name] = f.read(sizes[name] - offsets[name]).decode(errors="replace")
    return out


def _stacks_file(name: str):
    """The file SIGUSR1's dump goes to: this host's stacks file in the log directory
    (appended: a restarted host keeps its predecessor's dumps), or stderr without one."""
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        return sys.stderr
    os.makedirs(log_dir, exist_ok=True)
    return stacks_path(log_dir, name).open("a")


class _FirstLine(logging.Filter):
    def __init__(self, log_file: str):
        super().__init__()
        self.log_file = log_file

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "\n" in text or record.exc_info:
            record.msg, record.args, record.exc_info, record.exc_text = (
                f"{text.splitlines()[0]} (full text in {self.log_file})",
                None,
                None,
                None,
            )
        return True


class _LogFile(logging.FileHandler):
    """This process's log file (RUN_DIR/logs/<name>.log). A write that fails (a full disk)
    is said once, in one line on stderr, instead of logging's ``--- Logging error ---``
    block of tracebacks for every record: the console handler still shows each record,
    and once a write succeeds again a later failure is said again."""

    def __init__(self, path: str):
        super().__init__(path)
        self.failing = False  # the last write failed, and that was said
        self._failed_now = False

    def emit(self, record: logging.LogRecord) -> None:
        self._failed_now = False
        super().emit(record)  # a failure comes to handleError
        if self.failing and not self._failed_now:
            self.failing = False
            sys.stderr.write(f"log file {self.baseFilename}: written again\n")

    def handleError(self, record: logging.LogRecord) -> None:
        self._failed_now = True
        if self.failing:
            return
        self.failing = True
        exc = sys.exc_info()[1]
        why = (no_space_left(exc, self.baseFilename) or f"{type(exc).__name__}: {exc}") if exc is not None else "unknown"
        sys.stderr.write(f"log file {self.baseFilename}: a record could not be written ({why}); the console still has them\n")

    def close(self) -> None:
        try:
            super().close()  # closes the file whatever its last flush raises
        except OSError:  # the records it could not flush were said as they failed
            pass


def _setup_logging(name: str) -> None:
    fmt = logging.Formatter(f"[{name}] %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(os.environ.get("ASYNCFLOW_LOG", "WARNING"))
    log_dir = os.environ.get(LOG_DIR_ENV)
    if log_dir:  # the file first: it gets the record before the console's filter shortens it
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, f"{name}.log")
        to_file = _LogFile(path)
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(to_file)
    console = logging.StreamHandler()
    console.setFormatter(fmt)
    if log_dir:
        console.addFilter(_FirstLine(path))
    root.addHandler(console)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="asyncflow process host (started by the driver)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--directory", required=True)
    args = parser.parse_args(argv)
    _die_with_parent(int(os.environ.get(PARENT_ENV, "0")))
    _setup_logging(args.name)
    if os.environ.get(CPUS_ENV):  # [cluster] pin_trainer_cores: the cores the driver gave this process
        os.sched_setaffinity(0, {int(c) for c in os.environ[CPUS_ENV].split(",")})
    transport = TransportConfig.from_env().validate()
    stopped = threading.Event()  # set by the host actor on Stop
    # A signal handler takes no lock: it only records the signal, and the loop below looks.
    # (It used to call stopped.set(): a second SIGTERM arriving inside the first one's
    # Event.set, as a dying driver's threads each send one, deadlocked the host for good.)
    # Each signal is recorded with its time: an orphan's grace counts from it.
    signals: list[tuple[int, float]] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: signals.append((signum, time.monotonic())))
    if os.environ.get(PARENT_ENV):
        # Ctrl-C in a terminal reaches every process of the foreground group: a host started
        # by a driver leaves it to the driver, which stops the roles in order, then the hosts
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, lambda signum, _frame: signals.append((signum, time.monotonic())))
    stacks_file = _stacks_file(args.name)  # kept open for the process's life: faulthandler writes to its fd
    faulthandler.register(signal.SIGUSR1, file=stacks_file, all_threads=True)  # the driver's stall report asks for stacks
    directory = DirectoryClient(args.directory, transport)
    host = serve_actor(HostActor, f"host.{args.name}", transport, directory_address=args.directory, stopped=stopped)
    directory.register(host.entry())
    parent_pid = int(os.environ.get(PARENT_ENV, "0") or 0)
    # the kernel's SIGTERM when the driver dies is the fast path; looking at the parent every few
    # seconds catches a driver gone without it (a host of a killed driver once lived on for minutes)
    looked = time.monotonic()
    while not signals and not stopped.wait(timeout=SIGNAL_POLL_S):
        if parent_pid and time.monotonic() - looked > PARENT_POLL_S:
            looked = time.monotonic()
            if os.getppid() != parent_pid:
                signals.append((signal.SIGTERM, time.monotonic()))
    # only a SIGTERM can come from a dying driver; a Stop comes from a live one (no settling look)
    orphaned = _orphaned(parent_pid, ORPHAN_SETTLE_S if signals else 0.0)
    if orphaned:
        # the driver is gone, and with it every peer the actors would wait for: exit sooner, within
        # ORPHAN_GRACE_S of the signal that said so (the settling look above is inside it)
        signalled_at = signals[0][1] if signals else time.monotonic()
        exit_by = signalled_at + ORPHAN_GRACE_S - ORPHAN_EXIT_S
        log.warning(
            "the driver (pid %d) is gone, signalled at monotonic %.6f: stopping this host, which exits by monotonic "
            "%.6f at the latest (ORPHAN_GRACE_S = %g s after the signal)",
            parent_pid,
            signalled_at,
            exit_by,
            ORPHAN_GRACE_S,
        )
        _exit_by(exit_by, args.name, orphan_of=parent_pid, transport=transport)
    else:
        _exit_by(time.monotonic() + STOP_GRACE_S, args.name, parent_pid=parent_pid, transport=transport)
    leftovers: tuple[list[str], list[ServedActor]] = host.pykka_ref.ask(_Leftovers(), block=True)
    could_not_stop, running = leftovers
    stuck = could_not_stop + [  # those a Stop from the driver could not stop, and the rest
        actor.name for actor in reversed(running) if not _stop_contained(actor, ORPHAN_ACTOR_STOP_S if orphaned else ACTOR_STOP_S)
    ]
    if not orphaned:  # an orphan's driver (and its directory) is gone: do not wait on it
        try:
            directory.unregister(host.name, host.address, timeout_s=2.0)  # never a successor's entry
        except (ActorTimeout, ActorGone):
            pass
    _stop_contained(host, ACTOR_STOP_S)
    close_all_sockets()
    if orphaned or (parent_pid and os.getppid() != parent_pid):  # (or it died during this stop)
        _sweep(transport, parent_pid)  # a killed driver never removes its run's ipc directory: the last host out does
    if stuck:  # their threads never end: exit now rather than at the exit timer
        log.warning("exiting with %s still running", ", ".join(stuck))
        logging.shutdown()
        os._exit(1)
    return 0


def _stop_contained(actor: ServedActor, timeout_s: float) -> bool:
    """Stop one actor; a failure or a timeout is logged in one line and the stop goes on
    with the next (the host's exit timer ends a real hang). True if it stopped."""
    try:
        actor.stop(timeout_s=timeout_s)
        return True
    except Exception as exc:  # noqa: BLE001  (any: the rest of the stop path must run)
        log.warning(
            "%s did not stop cleanly (%s: %s); going on with the rest of the stop",
            actor.name,
            type(exc).__name__,
            exc or "no detail",
        )
        return False


if __name__ == "__main__":
    code = main()
    # Every actor is stopped, its files closed, the sockets closed and the log flushed:
    # skip the interpreter's teardown, which in a process that imported torch and
    # transformers takes 0.6 s of CPU (module by module), and with every host of a run
    # exiting at once on a small machine held the driver's stop 2-3 s
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
