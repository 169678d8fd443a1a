"""phase(name): time a part of a role's activity, for the per-step breakdown.

A role's activities (``LoopActor.activity``: generate, train, sync_weights...) are
spans; ``phase`` marks finer parts inside them (the trainer's forward, backward and
optimizer step; the rollout's model calls and sampling; the queue's encode and
round trips) without the code that runs them knowing about actors. A process has
at most one sink, installed by its worker role when its work starts; without one
``phase`` costs one global read. Phases never count as busy or idle time (their
activity does); they go to the trace as spans named ``<activity>/<phase>`` on a
second lane of the role's track, and ``afctl bench e2e --breakdown`` sums them.

Dependency-free on purpose: engines and the queue client import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager

Sink = Callable[[str, float, float], None]  # (phase name, start monotonic s, duration s)

_sink: Sink | None = None


def set_sink(sink: Sink | None) -> None:
    """Install (or remove, with None) the process's phase sink."""
    global _sink
    _sink = sink


@contextmanager
def phase(name: str):
    """Time the block as phase ``name`` of the activity in progress."""
    sink = _sink
    if sink is None:
        yield
        return
    start = time.monotonic()
    try:
        yield
    finally:
        sink(name, start, time.monotonic() - start)
