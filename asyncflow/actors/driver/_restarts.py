"""The restart policy of the driver: when a restartable worker process dies, when to
start it again, and when to give up. Pure logic, no processes, no clock of its own
(the caller passes ``now``, a ``time.monotonic()`` reading).

The shape is Erlang/OTP's supervisor *intensity* and *period*: at most
``max_restarts`` restarts of one role within any ``window_s`` seconds. A role is the
``name`` of a restartable ``RoleSpec`` (``runtime/spec.py``; a custom role's is its own): the
workers of one role share the budget, since a fault that kills one on start (a reward
module that fails to import, a full device) kills them all.

Invariants (tests/actors/test_restart_policy.py):
- the first restart of a role in a window is immediate; each further one waits
  twice as long as the one before, from ``backoff_s`` up to ``MAX_BACKOFF_S``;
- a death that would be restart number ``max_restarts + 1`` within the window is
  refused (``None``): the caller stops the run cleanly (and resumes it, with
  ``cluster.max_resumes``); with ``max_restarts = 0`` every death is refused;
- restarts older than the window no longer count, so a long run survives any
  number of deaths spread out in time.
"""

from __future__ import annotations

from collections import deque

MAX_BACKOFF_S = 60.0
"""The longest wait before a restart, however many came before it."""


class RestartPolicy:
    def __init__(self, max_restarts: int, window_s: float, backoff_s: float):
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if window_s <= 0 or backoff_s < 0:
            raise ValueError(f"window_s must be > 0 and backoff_s >= 0, got {window_s} and {backoff_s}")
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.backoff_s = backoff_s
        self._restarts: dict[str, deque[float]] = {}  # role -> times its restarts were granted

    def on_death(self, role: str, now: float) -> float | None:
        """A process of ``role`` died (or died while it was being restarted): the time
        at which to start it again, or None when the role's budget is spent."""
        times = self._restarts.setdefault(role, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if len(times) >= self.max_restarts:
            return None
        delay = 0.0 if not times else min(MAX_BACKOFF_S, self.backoff_s * 2 ** (len(times) - 1))
        times.append(now)
        return now + delay

    def num_recent(self, role: str, now: float) -> int:
        """Restarts of ``role`` granted within the window before ``now``."""
        return sum(1 for t in self._restarts.get(role, ()) if t > now - self.window_s)
