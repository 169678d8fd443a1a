"""FreezeWatch: the driver tells a frozen process from a dead one, and ends one frozen too long.

A process host answers ``Ping`` on its listener thread (``core/host.py``), even while
its actors work, so a host that answers none for ``FROZEN_AFTER_S`` has stopped as a
whole: SIGSTOP or Ctrl-Z (its ``/proc`` state is ``T``), a debugger (``t``), swapped
out, or a thread that holds the interpreter. Its pid is still there: it is frozen,
not dead. The driver pings every host of this machine each second
(``_heartbeat.py``) and, from its wait loop (``Supervisor.check``):

- names a host frozen for ``FROZEN_AFTER_S`` once, with its pid and state; its peers
  meanwhile send their requests again until it answers (``core/retry.py``), so one
  that wakes goes on where it stopped and the run with it;
- says so when it answers again;
- kills one frozen for ``cluster.transport.freeze_timeout_s`` (SIGKILL ends a stopped
  process too), after which it is handled like any dead process: a worker of a
  restartable role is restarted in place with its rows requeued; the loss of any
  other process stops the run, which ``cluster.max_resumes`` resumes.

Ray hosts are not watched here (their own heartbeat, ``ray_hosts.py``, treats a host
that does not answer as lost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncflow.actors.driver._heartbeat import Heartbeat
from asyncflow.core.transport import TransportConfig

FROZEN_AFTER_S = 10.0
"""A host that answers no Ping for this long is named frozen."""
PING_INTERVAL_S = 1.0

_STATES = {
    "T": "stopped by a signal (SIGSTOP, Ctrl-Z): `kill -CONT {pid}` continues it",
    "t": "stopped by a debugger",
    "D": "waiting in the kernel (disk or swap)",
    "R": "running, but not answering (a thread holds the interpreter?)",
    "S": "sleeping, but not answering",
}


def process_state(pid: int) -> str:
    """The one-letter state of ``pid`` (``/proc/<pid>/stat``), or "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def describe_state(pid: int) -> str:
    state = process_state(pid)
    if not state:
        return "gone"
    return f"state {state}, " + _STATES.get(state, "not answering").format(pid=pid)


@dataclass
class Review:
    """What one look at the watched hosts found."""

    lines: list[str] = field(default_factory=list)
    """To print: hosts newly frozen, hosts that answer again."""
    overdue: dict[str, str] = field(default_factory=dict)
    """Hosts frozen past the freeze timeout -> why they are to be killed."""


class FreezeWatch:
    def __init__(
        self,
        transport: TransportConfig,
        frozen_after_s: float = FROZEN_AFTER_S,
        interval_s: float = PING_INTERVAL_S,
    ):
        self.freeze_timeout_s = transport.freeze_timeout_s
        self.frozen_after_s = min(frozen_after_s, self.freeze_timeout_s)
        self.heartbeat = Heartbeat(transport, interval_s=interval_s, lost_after_s=self.frozen_after_s)
        self._pids: dict[str, int] = {}  # host -> the pid watched
        self._frozen: dict[str, float] = {}  # host named frozen -> its silence when last seen

    def start(self) -> FreezeWatch:
        self.heartbeat.start()
        return self

    def stop(self) -> None:
        self.heartbeat.stop()

    def watching(self, host: str, pid: int) -> bool:
        """Whether ``host`` is watched in its process ``pid`` (a restart changes it)."""
        return self._pids.get(host) == pid

    def watch(self, host: str, pid: int, address: str) -> None:
        """Watch ``host`` (its process ``pid``, its host actor at ``address``) from now."""
        self.heartbeat.watch(host, f"host.{host}", address)
        self._pids[host] = pid
        self._frozen.pop(host, None)

    def forget(self, host: str) -> None:
        self.heartbeat.forget(host)
        self._pids.pop(host, None)
        self._frozen.pop(host, None)

    def review(self, alive: dict[str, int]) -> Review:
        """Look at the hosts whose process is alive (host -> pid)."""
        out = Review()
        silent = self.heartbeat.silent()
        for host, pid in alive.items():
            seconds = silent.get(host)
            if seconds is None or self._pids.get(host) != pid:
                continue
            if seconds > self.frozen_after_s and host not in self._frozen:
                out.lines.append(
                    f"!! process {host} (pid {pid}) has not answered for {seconds:.0f} s: frozen, not dead "
                    f"({describe_state(pid)}). Its peers send their requests again until it answers; frozen for "
                    f"cluster.transport.freeze_timeout_s = {self.freeze_timeout_s:g} s, it is killed and restarted"
                )
            elif seconds <= self.frozen_after_s and host in self._frozen:
                out.lines.append(f"!! process {host} (pid {pid}) answers again, after {self._frozen[host]:.0f} s frozen")
                del self._frozen[host]
                continue
            if seconds > self.frozen_after_s:
                self._frozen[host] = seconds
            if seconds > self.freeze_timeout_s:
                out.overdue[host] = (
                    f"was frozen for {seconds:.0f} s ({describe_state(pid)}; cluster.transport.freeze_timeout_s = "
                    f"{self.freeze_timeout_s:g}) and was killed"
                )
        return out
