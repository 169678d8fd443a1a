"""The front's routing table: which rollout replica serves each gateway session. Pure
state, no HTTP (``front.py`` serves it).

- ``sticky`` (the default): a session goes, at its first request, to the replica of its
  group when its group key is known there already (a group's sessions meet in one
  replica's feed, ``feed.py``), else to the live replica holding the fewest open
  sessions (the lowest index on a tie); every later request of it goes to the same
  replica, so the conversation's prefix is where it was run (``prefix.py``).
- ``round_robin``: every request to the next replica whatever its session; only for
  measuring what stickiness buys (``scripts/bench_sticky.py``, where the replicas share
  one session store: replicas of a run do not, and a run never routes this way).

Invariants: a session is served by one replica only; while its replica is down
(``down``: the front could not reach it) its requests are refused (``ReplicaDown``,
a retryable 503) and new sessions go to the live ones; once the replica is back
(``up``: restarted in place, it restores its sessions from its journal) the session goes
on there. A session never moves.
"""

from __future__ import annotations

import threading
from typing import Literal

Policy = Literal["sticky", "round_robin"]


class ReplicaDown(Exception):
    """The replica a request must go to is down (or every replica is, for a new session)."""

    def __init__(self, replica: int | None):
        super().__init__(f"rollout.{replica} is down" if replica is not None else "every serving replica is down")
        self.replica = replica


class RouteTable:
    def __init__(self, replicas: list[int], policy: Policy = "sticky"):
        self.replicas = list(replicas)
        self.policy = policy
        self._session: dict[str, int] = {}
        self._group: dict[str, int] = {}
        self._open: dict[int, set[str]] = {r: set() for r in self.replicas}
        self._down: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()
        self.num_refused = 0
        """Requests refused because their replica was down."""

    def route(self, session: str, group: str | None = None) -> int:
        """The replica that serves this request of ``session`` (pinned at its first)."""
        with self._lock:
            if self.policy == "round_robin":
                return self._round_robin()
            replica = self._session.get(session)
            if replica is None:
                replica = self._group.get(group) if group is not None else None
                if replica is None:
                    replica = self._least_loaded()
                if replica in self._down:
                    self.num_refused += 1
                    raise ReplicaDown(replica)
                self._session[session] = replica
                self._open[replica].add(session)
                if group is not None:
                    self._group.setdefault(group, replica)
            elif replica in self._down:
                self.num_refused += 1
                raise ReplicaDown(replica)
            return replica

    def _least_loaded(self) -> int:
        live = [r for r in self.replicas if r not in self._down]
        if not live:
            self.num_refused += 1
            raise ReplicaDown(None)
        return min(live, key=lambda r: (len(self._open[r]), r))

    def _round_robin(self) -> int:
        live = [r for r in self.replicas if r not in self._down]
        if not live:
            self.num_refused += 1
            raise ReplicaDown(None)
        replica = live[self._next % len(live)]
        self._next += 1
        return replica

    def replica_of(self, session: str) -> int | None:
        with self._lock:
            return self._session.get(session)

    def pin(self, session: str, replica: int, group: str | None = None) -> None:
        """``session`` is served by ``replica`` (an anonymous session, named by its replica's answer)."""
        with self._lock:
            self._session.setdefault(session, replica)
            self._open[self._session[session]].add(session)
            if group is not None:
                self._group.setdefault(group, replica)

    def forget(self, session: str) -> None:
        """Route ``session`` afresh next time (a placeholder for an anonymous request)."""
        with self._lock:
            replica = self._session.pop(session, None)
            if replica is not None:
                self._open[replica].discard(session)

    def group_replica(self, group: str) -> int | None:
        with self._lock:
            return self._group.get(group)

    def finished(self, session: str) -> None:
        """``session`` has its reward: it no longer counts toward its replica's load."""
        with self._lock:
            replica = self._session.get(session)
            if replica is not None:
                self._open[replica].discard(session)

    def down(self, replica: int) -> None:
        with self._lock:
            self._down.add(replica)

    def up(self, replica: int) -> None:
        with self._lock:
            self._down.discard(replica)

    def is_down(self, replica: int) -> bool:
        with self._lock:
            return replica in self._down

    def counts(self) -> dict[str, float]:
        with self._lock:
            out = {f"gateway/open_sessions_{r}": float(len(s)) for r, s in self._open.items()}
            out["gateway/refused_replica_down"] = float(self.num_refused)
            return out
