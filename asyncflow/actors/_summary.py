"""Figures of a run from its metrics.jsonl rows: pure functions, shared by
summary.json (actors/launcher.py) and ``afctl plot``.

A run resumed one or more times (``afctl up --resume``) has rows from several
launches in one metrics.jsonl. Each launch's trainer counts ``time_s``,
``total_samples`` and ``total_tokens`` from its own start, so a row whose
``total_samples`` equals its ``samples`` is the first step of a launch. Times are
never compared across launches: a span is measured inside each launch (from its first
step's start to its last step's end) and the spans are added.
"""

from __future__ import annotations


def launches(rows: list[dict]) -> list[list[dict]]:
    """The rows split by launch, in order (one list for a run never resumed)."""
    out: list[list[dict]] = []
    for r in rows:
        if not out or ("total_samples" in r and r["total_samples"] == r["samples"]):
            out.append([])
        out[-1].append(r)
    return out


def launch_span_s(rows: list[dict]) -> float:
    """Seconds from the start of the first step of ``rows`` (one launch) to the end of its last."""
    if not rows:
        return 0.0
    return rows[-1]["time_s"] - (rows[0]["time_s"] - rows[0].get("step_time_s", 0.0))


def train_span_s(rows: list[dict]) -> float:
    """Training seconds of the whole run: the sum of every launch's span."""
    return sum(launch_span_s(part) for part in launches(rows))


def reward_trend(rows: list[dict]) -> tuple[float | None, float | None]:
    """Mean ``reward_mean`` over the first and over the last tenth of the steps (at
    least one step each): summary.json's ``reward_first_10pct`` / ``reward_last_10pct``."""
    if not rows:
        return None, None
    n = max(1, len(rows) // 10)
    return sum(r["reward_mean"] for r in rows[:n]) / n, sum(r["reward_mean"] for r in rows[-n:]) / n


def run_clock(rows: list[dict]) -> list[float]:
    """Each row's end on one clock across launches: a resumed launch's steps continue
    from where the previous launch's last step ended (the gap between launches, which
    has no training, is left out)."""
    out: list[float] = []
    offset = 0.0
    for part in launches(rows):
        start = part[0]["time_s"] - part[0].get("step_time_s", 0.0)
        out.extend(offset + r["time_s"] - start for r in part)
        offset = out[-1]
    return out
