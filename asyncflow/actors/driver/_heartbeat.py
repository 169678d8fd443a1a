"""Heartbeats: the driver pings every process host and names the ones it lost.

A process on this machine is watched through its pid; one placed on another node
(launcher = ray) is not, and a node that loses power or its link does not close
its TCP connections. So the driver asks each host actor ``Ping`` every
``interval_s``; a host with no answer for ``lost_after_s`` is lost, reported with
its name, address and last error. Invariant: a host is reported lost only after
``lost_after_s`` without any answer, and ``watch`` again (a restart) forgets the past.
A round of pings that starts long after the one before (the driver itself was frozen:
Ctrl-Z of the whole run) forgets the past too: the silence was the driver's, not theirs.

On this machine the freeze watch (``_freezes.py``) reads ``silent`` to tell a frozen
process (it does not answer, its pid is there) from a dead one.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from asyncflow.core import protocol
from asyncflow.core.errors import AsyncflowError
from asyncflow.core.ref import ActorRef, close_sockets
from asyncflow.core.transport import TransportConfig


class Heartbeat:
    def __init__(self, transport: TransportConfig, interval_s: float = 1.0, lost_after_s: float = 5.0):
        if lost_after_s <= interval_s:
            raise ValueError(f"lost_after_s ({lost_after_s}) must exceed interval_s ({interval_s})")
        self.transport = transport
        self.interval_s = interval_s
        self.lost_after_s = lost_after_s
        self._refs: dict[str, ActorRef] = {}
        self._last_answer: dict[str, float] = {}
        self._last_error: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_round = time.monotonic()  # when the last round of pings began

    def watch(self, host: str, actor_name: str, address: str) -> None:
        """Watch ``host`` (its host actor ``actor_name`` at ``address``), from now. A host
        watched again at another address (restarted) leaves its old one: the socket to it
        is closed, or it would redial the dead address for the rest of the driver."""
        with self._lock:
            old = self._refs.get(host)
            self._refs[host] = ActorRef(actor_name, address, self.transport)
            self._last_answer[host] = time.monotonic()
            self._last_error.pop(host, None)
        if old is not None and old.address != address:
            close_sockets(old.address.__eq__)

    def forget(self, host: str) -> None:
        with self._lock:
            old = self._refs.pop(host, None)
            self._last_answer.pop(host, None)
            self._last_error.pop(host, None)
        if old is not None:
            close_sockets(old.address.__eq__)

    def _forgive_own_stall(self, now: float) -> None:
        """No round of pings began for ``lost_after_s``: this process stood still (the
        whole run was frozen), so the hosts' silence since is not theirs. Under ``_lock``."""
        if now - self._last_round > self.lost_after_s:
            self._last_answer = dict.fromkeys(self._refs, now)
            self._last_round = now

    def lost(self) -> dict[str, str]:
        """Hosts without an answer for ``lost_after_s``: name -> what the driver knows."""
        now = time.monotonic()
        with self._lock:
            self._forgive_own_stall(now)
            return {
                host: f"host {host!r} at {ref.address} has not answered Ping for {now - self._last_answer[host]:.1f} s"
                f" ({self._last_error.get(host, 'no reply')}): its node is down or unreachable"
                for host, ref in self._refs.items()
                if now - self._last_answer[host] > self.lost_after_s
            }

    def silent(self) -> dict[str, float]:
        """Every watched host -> seconds since its last answer (or since it is watched)."""
        now = time.monotonic()
        with self._lock:
            self._forgive_own_stall(now)
            return {host: now - self._last_answer[host] for host in self._refs}

    def start(self) -> Heartbeat:
        self._last_round = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="asyncflow-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s * 2 + 5)

    def _ping(self, host: str, ref: ActorRef) -> None:
        try:
            ref.ask(protocol.Ping(), timeout_s=self.interval_s)
        except AsyncflowError as exc:
            with self._lock:
                if self._refs.get(host) is ref:
                    self._last_error[host] = str(exc)
            return
        with self._lock:
            if self._refs.get(host) is ref:  # not re-watched meanwhile
                self._last_answer[host] = time.monotonic()

    def _run(self) -> None:
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="heartbeat") as pool:
            while not self._stopped.is_set():
                started = time.monotonic()
                with self._lock:
                    self._forgive_own_stall(started)
                    self._last_round = started
                    refs = list(self._refs.items())
                list(pool.map(lambda item: self._ping(*item), refs))
                self._stopped.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
