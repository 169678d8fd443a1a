"""Handing over the sessions of a rollout replica that does not come back (docs/gateway.md,
"Several replicas"): the front reads them from the replica's journal, which lives on in
RUN_DIR, and gives each to a live replica, which journals them as its own and serves them
where they were (``server.Gateway.adopt``). File work only, no HTTP: ``front.py`` posts
each ``Handover`` to its replica's ``ADOPT_ROUTE``.

Invariants:
- Only a journal nobody holds is handed over (``Journal.claim``: the replica's process is
  gone), and the ``moved`` line is appended to it before any replica is told: a replica
  restarted on it afterwards replays the sessions as finished for good, so two replicas
  never hold one session and a rewarded session is written to the queue at most once (a
  handover that fails half way loses sessions rather than duplicating them).
- A group's sessions go to one replica (``routes.RouteTable.hand_over`` decides where).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from asyncflow.gateway.journal import Journal, replay

ADOPT_ROUTE = "/v1/asyncflow/internal/adopt"


class Handover(msgspec.Struct, kw_only=True):
    """Sessions one replica takes over from ``source``: their journal events as recorded there."""

    source: int
    turns: dict[str, list[dict[str, Any]]] = {}
    """Open or rewarded sessions: their ``turn`` events in order."""
    rewards: dict[str, dict[str, Any]] = {}
    """Their ``reward`` events (rewarded sessions waiting for their group, or kept for reading)."""
    closed: list[str] = []
    """Sessions finished for good there (trained on, dropped): answered 409 where they go."""


Decide = Callable[[dict[str, str | None], set[str]], dict[str, int]]
"""(each session's group key, the finished ones) -> each session's new replica."""


def take_over(journal: str | Path, source: int, decide: Decide) -> dict[int, Handover] | None:
    """The handovers of replica ``source``'s sessions, by the replica that takes them (as
    ``decide`` places them), marked moved in its journal; None while its journal is held (the
    replica's process lives: restarting, or not answering). ``decide`` may raise (no live
    replica): then nothing is marked."""
    held = Journal.claim(journal)
    if held is None:
        return None
    try:
        state = replay(journal)
        groups = {s: _group(turns, state.rewards.get(s)) for s, turns in state.turns.items()}
        finished = set(state.rewards) | state.closed
        targets = decide({**groups, **dict.fromkeys(state.closed)}, finished)
        if targets:
            held.append("moved", s=sorted(targets), to=targets)
    finally:
        held.close()
    out: dict[int, Handover] = {}
    for session, to in targets.items():
        h = out.setdefault(to, Handover(source=source))
        if session in state.turns:
            h.turns[session] = state.turns[session]
            if session in state.rewards:
                h.rewards[session] = state.rewards[session]
        else:
            h.closed.append(session)
    return out


def _group(turns: list[dict[str, Any]], reward: dict[str, Any] | None) -> str | None:
    """A session's group key as its journal last gave it."""
    group = None
    for ev in turns:
        group = ev.get("group") or group
    return (reward or {}).get("group") or group
