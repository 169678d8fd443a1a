"""The gateway's journal: every recorded turn, reward and queue write of its sessions,
appended to ``RUN_DIR/gateway/journal.jsonl``, so that a restarted replica serves the
sessions of the one that died (docs/gateway.md, "When the serving replica restarts").

One JSON line per event, written (and flushed to the OS) before the request that
caused it is answered:

- ``turn``: a session's turn: the new context ids, the reply's ids, log-probs, text,
  finish, version and weights digest, the request's messages (the first turn also
  ``prompt_ids``), the session's group key;
- ``reward``: its reward (and group key);
- ``writing``: sessions about to be put into the queue; ``unwritten``: that write
  failed before any row was put (they wait again);
- ``dropped``: a session given up (no reward in time, its group incomplete).

Invariants:
- A line is appended before the request is answered: an answered turn survives a
  kill -9 of the process (the OS has the bytes; a machine crash is not covered).
- Replay gives back every open session as it was recorded, the rewarded sessions
  that still wait for their group, and the ids of sessions finished for good (a later
  turn of one is refused, never started afresh).
- Queue writes are at most once: ``writing`` is journaled before the rows are put, so
  a replica killed between the two loses those sessions rather than writing them twice.
"""

from __future__ import annotations

import json
import threading
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


class Journal:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a")

    def append(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, **fields}, separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


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
            out.turns.setdefault(ev["s"], []).append(ev)
        elif kind == "reward":
            out.rewards[ev["s"]] = ev
        elif kind == "writing":
            writing.update(ev["s"])
        elif kind == "unwritten":  # the write failed before any row was put: they wait again
            writing.difference_update(ev["s"])
        elif kind == "dropped":
            out.closed.add(ev["s"])
    out.closed |= writing
    for s in out.closed:
        out.rewards.pop(s, None)
        out.turns.pop(s, None)
    return out
