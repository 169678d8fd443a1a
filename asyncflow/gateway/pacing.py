"""Pacing (``[rollout.gateway] pace``, with ``train``): a new session's first request is
held while the sessions ahead of it would make it too old to train. Pure state: no
HTTP, no engine, no queue; the gateway (``server.py``) passes in the version it serves
and the trainer's discards.

The rule. A step trains ``per_step`` sessions whose version v satisfies s - v <= k
(``workflow.staleness``). A session started now is sampled with the version the replica
serves, v, or a later one, and is trained after the sessions *ahead* of it: those
admitted before it and neither trained nor dropped. The replica serves version v only
once the trainer has published it, after step v - 1: by then ``per_step x v`` sessions
were trained. So, counted from an anchor (the gateway's start at version ``v0``):

    ahead = admitted - dropped - discarded - per_step x (v - v0)

``dropped`` counts the gateway's own drops (no reward in time, a group left incomplete,
a first turn that failed), ``discarded`` the trainer's (stale sessions, the queue's
count). A new session is admitted while ``ahead < (k + 1) x per_step``: it is then
trained at a step <= v + k, within the bound, if sessions are trained in the order they
started. This is AReaL's ``max_head_offpolicyness``, counted in sessions.

Groups. The trainer takes a keyed group whole, at one step, so a group is admitted
whole: its first session starts only while the group fits (``ahead + group_size <=
bound``) and counts the whole group at once; the other sessions of the group start
without waiting (the group is under way). The group's places not taken are given back
once the group is settled (written to the queue, or dropped).

Why the version and not the queue's rows: a step's rows are acked after the trainer
published the next version but possibly before the replica serves it, and the room
those acks make would let sessions start with weights that are one step too old. The
version moves only once a step is trained, and the replica's version never runs ahead
of the trainer's: the count errs on the side of holding back.

Invariants:
- only a session's first request is held (``ticket`` .. ``admit``); a session under way
  is never paced;
- first come, first served: a ticket is admitted only once every earlier one was
  admitted or gave up (``cancel``), but for a session of a group under way, which
  goes at once;
- every admitted session leaves the count exactly once: trained (the version moves),
  dropped by the gateway (``dropped``), discarded by the trainer (``discarded``), or
  never started (``release``);
- the count is never below 0: a replica restarted mid-run starts with the launch's
  weights and swaps in the trainer's newest, so its anchor version is behind; the
  version's first move then makes the count negative, which is taken as "nothing
  ahead" (the sessions restored or waiting in the queue then are counted as trained: at
  most one bound of sessions too many start once).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass


@dataclass
class PaceCounts:
    held: int = 0
    """First requests that waited for room (since the gateway started)."""
    refused: int = 0
    """First requests that waited ``pace_wait_s`` and got a 503 (the client sends them again)."""
    waiting: int = 0
    """First requests held now."""
    ahead: float = 0.0
    """Sessions started and not yet trained or dropped, as the pacer counts them (at the last check)."""
    bound: float = 0.0
    """How many may be ahead: (workflow.staleness + 1) x the sessions of a step (this replica's share)."""

    def as_metrics(self) -> dict[str, float]:
        return {f"gateway/pace_{k}": float(v) for k, v in self.__dict__.items()}


class Pacer:
    def __init__(self, per_step: float, staleness: int, version: int, ahead: int = 0, discarded: int = 0):
        """``per_step``: the sessions a step trains (this replica's share with several);
        ``staleness``: ``workflow.staleness``; ``version``: the version the replica serves
        now; ``ahead``: sessions already started and not yet trained (rows in the queue,
        sessions restored from the journal); ``discarded``: the trainer's discards so far."""
        self.per_step, self.staleness = per_step, staleness
        self._v0, self._d0 = version, discarded
        self._admitted: float = ahead
        self._dropped = 0
        self._discarded = discarded
        self._tickets: deque[int] = deque()
        self._seen_held: set[int] = set()  # tickets counted in ``held`` (once each)
        self._groups: dict[str, int] = {}  # a group under way -> its places not yet taken
        self._next = 0
        self._lock = threading.Lock()
        self.counts = PaceCounts(bound=self.bound)

    @property
    def bound(self) -> float:
        return (self.staleness + 1) * self.per_step

    def ahead(self, version: int) -> float:
        """Sessions that will be trained at steps >= ``version`` (as counted)."""
        trained = self.per_step * (version - self._v0)
        return self._admitted - self._dropped - (self._discarded - self._d0) - trained

    def ticket(self) -> int:
        """A first request's place in line."""
        with self._lock:
            t = self._next
            self._next += 1
            self._tickets.append(t)
            self.counts.waiting = len(self._tickets)
            return t

    def admit(self, ticket: int, version: int, group: str | None = None, group_size: int = 1) -> bool:
        """Whether ``ticket``'s session may start now, with the replica serving ``version``:
        a session of ``group`` while the group is under way; else it is first in line and
        it (its whole group of ``group_size``) fits under the bound, and counts as ahead."""
        with self._lock:
            ahead = self.ahead(version)
            if ahead < 0:  # the trainer took more than counted: the anchor was behind (below); count from here
                self._admitted -= ahead
                ahead = 0
            self.counts.ahead = ahead
            if group is not None and self._groups.get(group, 0) > 0:  # its group's place is kept
                self._groups[group] -= 1
                self._take(ticket)
                return True
            size = group_size if group is not None else 1
            if self._tickets[0] != ticket or ahead + size > max(self.bound, size):
                if self._tickets[0] == ticket and ticket not in self._seen_held:
                    self._seen_held.add(ticket)
                    self.counts.held += 1
                return False
            self._take(ticket)
            self._admitted += size
            if group is not None and size > 1:
                self._groups[group] = size - 1
            self.counts.ahead = ahead + size
            return True

    def _take(self, ticket: int) -> None:
        self._tickets.remove(ticket)
        self._seen_held.discard(ticket)
        self.counts.waiting = len(self._tickets)

    def settle(self, group: str | None) -> None:
        """``group`` was written to the queue or dropped: the places none of its sessions
        took are given back (a later session of the key starts a new group)."""
        with self._lock:
            self._admitted -= self._groups.pop(group, 0) if group is not None else 0

    def cancel(self, ticket: int, refused: bool = False) -> None:
        """``ticket`` gives up its place (its client went away, the gateway stops, or it
        waited too long: ``refused``, a 503)."""
        with self._lock:
            if ticket in self._tickets:
                self._tickets.remove(ticket)
            self._seen_held.discard(ticket)
            self.counts.refused += int(refused)
            self.counts.waiting = len(self._tickets)

    def release(self) -> None:
        """An admitted session that did not start (its first turn was refused or failed)."""
        with self._lock:
            self._admitted -= 1

    def started(self, num: int) -> None:
        """Sessions that came from elsewhere and are ahead now (taken over from a replica
        that did not come back)."""
        with self._lock:
            self._admitted += num

    def dropped(self, num: int) -> None:
        """Sessions the gateway dropped (no reward in time, an incomplete group): never trained."""
        with self._lock:
            self._dropped += num

    def discarded(self, total: int) -> None:
        """The trainer's discards so far (the queue's count, which only grows)."""
        with self._lock:
            self._discarded = max(self._discarded, total)
