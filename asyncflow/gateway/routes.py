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

Invariants: a session is served by one replica at a time; while its replica is down
(``down``: the front could not reach it) its requests are refused (``ReplicaDown``,
a retryable 503) and new sessions go to the live ones; once the replica is back
(``up``: restarted in place, it restores its sessions from its journal) the session goes
on there. A replica down for ``grace_s``, or one out of the roster (``set_roster``: the
online planner removed it) and down, is ``due``: its sessions are handed over once
(``hand_over``) to live replicas, a group's together, and stay there (the front moves
their recorded state, ``front.py``). A replica out of the roster gets no new session; one
the roster adds gets new sessions from then on.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
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
        """Every replica routed to so far (those out of the roster included, while they serve their sessions)."""
        self.policy = policy
        self._session: dict[str, int] = {}
        self._group: dict[str, int] = {}
        self._open: dict[int, set[str]] = {r: set() for r in self.replicas}
        self._down: dict[int, float] = {}  # a down replica -> when it was first found down
        self._retired: set[int] = set()  # out of the roster: no new session
        self._handed_over: set[int] = set()  # down, its sessions handed over (until it is up again)
        self._next = 0
        self._lock = threading.Lock()
        self.num_refused = 0
        """Requests refused because their replica was down."""
        self.num_moved = 0
        """Sessions handed over from a replica that did not come back."""

    def _live(self) -> list[int]:
        return [r for r in self.replicas if r not in self._down and r not in self._retired]

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
        live = self._live()
        if not live:
            self.num_refused += 1
            raise ReplicaDown(None)
        return min(live, key=lambda r: (len(self._open[r]), r))

    def _round_robin(self) -> int:
        live = self._live()
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

    def down(self, replica: int, now: float = 0.0) -> None:
        """``replica`` does not answer (``now``: a monotonic reading; the first one counts)."""
        with self._lock:
            self._down.setdefault(replica, now)

    def up(self, replica: int) -> None:
        with self._lock:
            self._down.pop(replica, None)
            self._handed_over.discard(replica)

    def is_down(self, replica: int) -> bool:
        with self._lock:
            return replica in self._down

    # -- replicas that do not come back, and the roster ------------------------------------
    def set_roster(self, replicas: list[int]) -> None:
        """The run's rollout replicas now (the Supervisor's record): one not routed to yet gets
        new sessions from now on, one missing gets none (it serves its sessions while it lives)."""
        with self._lock:
            for r in replicas:
                if r not in self._open:
                    self.replicas.append(r)
                    self._open[r] = set()
            self._retired = set(self.replicas) - set(replicas)

    def due(self, now: float, grace_s: float | None) -> list[int]:
        """The down replicas whose sessions are to be handed over now: those down for ``grace_s``
        (None: never) and those out of the roster (they never come back), each once."""
        with self._lock:
            return sorted(
                r
                for r, since in self._down.items()
                if r not in self._handed_over and (r in self._retired or (grace_s is not None and now - since >= grace_s))
            )

    def hand_over(self, replica: int, sessions: dict[str, str | None], finished: Collection[str] = ()) -> dict[str, int]:
        """Pin the sessions of ``replica`` (each with its group key; ``finished``: rewarded or
        done, not counted open) to live replicas: a group's where it was moved before, else the
        least loaded one; the replica's other sessions (no recorded turn) are routed afresh.
        Returns each session's new replica; ReplicaDown when no replica is live."""
        with self._lock:
            if not self._live():
                raise ReplicaDown(None)
            moved: dict[str, int] = {}
            regrouped: dict[str, int] = {}
            for session, group in sessions.items():
                to = regrouped.get(group) if group is not None else None
                if to is None:
                    to = self._least_loaded()
                    if group is not None:
                        regrouped[group] = to
                moved[session] = to
                self._session[session] = to
                if session not in finished:
                    self._open[to].add(session)
            for group, to in regrouped.items():
                self._group[group] = to
            for session in [s for s, r in self._session.items() if r == replica and s not in moved]:
                del self._session[session]
            for group in [g for g, r in self._group.items() if r == replica]:
                del self._group[group]
            self._open[replica].clear()
            self._handed_over.add(replica)
            self.num_moved += len(moved)
            return moved

    def counts(self) -> dict[str, float]:
        with self._lock:
            out = {f"gateway/open_sessions_{r}": float(len(s)) for r, s in self._open.items()}
            out["gateway/refused_replica_down"] = float(self.num_refused)
            out["gateway/sessions_moved"] = float(self.num_moved)
            return out
