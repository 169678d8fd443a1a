"""The gateway's journal: every recorded turn, reward and queue write of its sessions,
appended to ``RUN_DIR/gateway/journal.jsonl``, so that a restarted replica serves the
sessions of the one that died (docs/gateway.md, "When the serving replica restarts").

One JSON line per event, written (and flushed to the OS) before the request that
caused it is answered:

- ``turn``: a session's turn: the new context ids, the reply's ids, log-probs, text,
  finish, version and weights digest, the request's messages (the first turn also
  ``prompt_ids``, and ``anon`` when the request named no session), the session's group key;
- ``reward``: its reward (and group key);
- ``writing``: sessions about to be put into the queue; ``unwritten``: that write
  failed before any row was put (they wait again);
- ``dropped``: a session given up (no reward in time, its group incomplete);
- ``evicted``: sessions the store dropped to make room for a new one (``sessions.py``:
  finished ones, then anonymous ones): no longer served, and a rewarded one still waits
  for its group;
- ``moved``: sessions handed over to another replica (written by the front, ``front.py``,
  on the journal of a replica that did not come back); ``closed``: sessions finished for
  good on the replica they were handed over from (the one that takes them over writes it).

Invariants:
- A line is appended before the request is answered: an answered turn survives a
  kill -9 of the process (the OS has the bytes; a machine crash is not covered).
- Replay gives back every open session as it was recorded, the rewarded sessions
  that still wait for their group, and the ids of sessions finished for good (a later
  turn of one is refused, never started afresh). What it gives back to be served is what
  the store held: an evicted session is not served again, an anonymous one stays
  anonymous (so it can make room again). An evicted id that a later turn starts again is
  a new session.
- Queue writes are at most once: ``writing`` is journaled before the rows are put, so
  a replica killed between the two loses those sessions rather than writing them twice.
- A journal is held (an exclusive ``flock``) by the one process that writes it: a gateway
  for its life, taking it before it replays (waiting while another holds it), or the front
  for a handover, which takes it only if nobody holds it (``claim``: the replica's process
  is gone; the kernel releases the lock of a dead process). So sessions are handed over
  only from a replica that is not running, and a replica restarted afterwards replays the
  ``moved`` line: two replicas never hold one session.
"""

from __future__ import annotations

import fcntl
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

JOURNAL_FILE = "gateway/journal.jsonl"


@dataclass
class Replayed:
    turns: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Open or rewarded sessions: their turn events in order."""
    rewards: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Rewarded sessions not yet (known to be) written: their reward events."""
    closed: set[str] = field(default_factory=set)
    """Sessions written to the queue or dropped: finished for good."""
    evicted: set[str] = field(default_factory=set)
    """Rewarded sessions of ``turns`` that the store dropped to make room: they wait for their
    group, but are not served."""


class JournalHeld(RuntimeError):
    """Another process holds the journal (module docstring)."""


class Journal:
    def __init__(self, path: str | Path, wait_s: float = 60.0):
        """Open ``path`` for appending and hold it, waiting up to ``wait_s`` while another
        process does (a handover under way; JournalHeld after that)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a")
        deadline = time.monotonic() + wait_s
        while not self._hold():
            if time.monotonic() > deadline:
                self._file.close()
                raise JournalHeld(
                    f"{self.path} is held by another process for over {wait_s:g} s (is that replica still running?)"
                )
            time.sleep(0.05)

    def _hold(self) -> bool:
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    @classmethod
    def claim(cls, path: str | Path) -> Journal | None:
        """The journal held by the caller, or None when another holds it (its replica lives)."""
        try:
            return cls(path, wait_s=0.0)
        except JournalHeld:
            return None

    def append(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()  # and the lock with it


def replay(path: str | Path) -> Replayed:
    """The sessions of a journal (module docstring); a torn last line (the process died
    while writing it) is skipped."""
    out = Replayed()
    p = Path(path)
    if not p.exists():
        return out
    writing: set[str] = set()
    for line in p.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = ev["e"]
        if kind == "turn":
            if ev["s"] in out.evicted:  # an evicted id started again: a new session
                out.evicted.discard(ev["s"])
                out.rewards.pop(ev["s"], None)
                out.turns.pop(ev["s"], None)
            out.turns.setdefault(ev["s"], []).append(ev)
        elif kind == "reward":
            out.rewards[ev["s"]] = ev
        elif kind == "writing":
            writing.update(ev["s"])
        elif kind == "unwritten":  # the write failed before any row was put: they wait again
            writing.difference_update(ev["s"])
        elif kind == "evicted":  # a rewarded one still waits for its group; an open one is gone
            for s in ev["s"]:
                if s in out.rewards:
                    out.evicted.add(s)
                else:
                    out.turns.pop(s, None)
        elif kind == "dropped":
            out.closed.add(ev["s"])
        elif kind in ("moved", "closed"):  # handed over to another replica, or finished for good on the one before
            out.closed.update(ev["s"])
    out.closed |= writing
    for s in out.closed:
        out.rewards.pop(s, None)
        out.turns.pop(s, None)
    out.evicted -= out.closed
    return out
