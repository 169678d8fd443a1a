"""Prefix reuse: of each turn's prompt tokens, how many this replica already ran through
the model for the same session. Pure state, no engine.

This ledger measures what a per-replica prefix cache can reuse, which is what sticky
routing (``routes.py``) preserves; what the native engine's cache did serve is
``gateway/prefix_cached_tokens`` (``engines/prefix_cache.py``: whole blocks of a prefix
run under the weights the turn runs with, while the cache still holds them). A turn's prompt is the session's whole conversation; what the
replica ran for the session's last turn is that turn's prompt and its reply but the
last reply token (sampled, never fed back). The reused tokens of a turn are the common
prefix of the two; ``reused_same_version_tokens`` counts only those run with the weights
version the turn runs with (a cache is stale after a weight swap, and an engine such as
vLLM drops it then).

Invariants: at most ``max_sessions`` sessions are remembered (the least recently used is
forgotten first; a forgotten session's next turn reuses nothing); a replica that
restarted remembers nothing (the ledger is memory only, as a cache would be).
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class PrefixLedger:
    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._ran: OrderedDict[str, tuple[list[int], int]] = OrderedDict()  # session -> (tokens run, version)
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self.reused_same_version_tokens = 0

    def turn(self, session: str, prompt_ids: list[int], version: int) -> int:
        """Count a turn of ``session`` whose prompt is ``prompt_ids``, run with ``version``;
        returns its tokens this replica already ran for the session."""
        with self._lock:
            ran, ran_version = self._ran.get(session, ([], -1))
            reused = 0
            for a, b in zip(ran, prompt_ids):
                if a != b:
                    break
                reused += 1
            self.prompt_tokens += len(prompt_ids)
            self.reused_tokens += reused
            if ran_version == version:
                self.reused_same_version_tokens += reused
            return reused

    def ran(self, session: str, prompt_ids: list[int], reply_ids: list[int], version: int) -> None:
        """The replica ran ``prompt_ids`` and the reply ``reply_ids`` (but its last token) for ``session``."""
        with self._lock:
            self._ran[session] = (list(prompt_ids) + list(reply_ids[:-1]), version)
            self._ran.move_to_end(session)
            while len(self._ran) > self.max_sessions:
                self._ran.popitem(last=False)

    def as_metrics(self) -> dict[str, float]:
        with self._lock:
            return {
                "gateway/prompt_tokens": float(self.prompt_tokens),
                "gateway/prefix_reused_tokens": float(self.reused_tokens),
                "gateway/prefix_reused_same_version_tokens": float(self.reused_same_version_tokens),
            }
