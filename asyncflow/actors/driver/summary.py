"""Figures of a run from its metrics.jsonl rows: pure functions, shared by
summary.json (``summarize``, which reads the run's files) and ``afctl plot``.

A run resumed one or more times (``afctl up --resume``) has rows from several
launches in one metrics.jsonl. Each launch's trainer counts ``time_s``,
``total_samples`` and ``total_tokens`` from its own start, so a row whose
``total_samples`` equals its ``samples`` is the first step of a launch. Times are
never compared across launches: a span is measured inside each launch (from its first
step's start to its last step's end) and the spans are added.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from asyncflow.actors.runtime import messages
from asyncflow.config.run import RunConfig


def console_step(row: dict) -> int:
    """The step of a metrics.jsonl object (or best.json) as the progress line numbers it:
    1-based. The files' ``step`` is the step's 0-based index (docs/metrics.md); every
    number a user reads as "step N" (progress lines, summary.json, ``afctl status``,
    ``afctl plot``) goes through here."""
    return int(row["step"]) + 1


def evaluated_step(row: dict) -> int:
    """The step after which the policy of a record's ``val/*`` was published, as the
    progress line numbers it: its ``val/version`` (an evaluation in the evaluator's process
    reaches a later step's record, ``eval.where``); the record's own step without one."""
    return int(row["val/version"]) if "val/version" in row else console_step(row)


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
    """Mean reward over the first and over the last tenth of the steps (at least one
    step each): summary.json's ``reward_first_10pct`` / ``reward_last_10pct``. A step's
    reward is ``reward_mean``, or with dynamic sampling ``sampled_reward_mean`` (every
    response sampled, dropped groups included: the trained ones leave out the groups
    answered all right)."""
    if not rows:
        return None, None
    n = max(1, len(rows) // 10)
    reward = [r.get("sampled_reward_mean", r["reward_mean"]) for r in rows]
    return sum(reward[:n]) / n, sum(reward[-n:]) / n


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


def complete_lines(path: Path) -> list[str]:
    """The lines of a JSON-lines file the run appends to, without a torn last line (a
    process killed mid-write leaves one; it is dropped, and said so)."""
    text = path.read_text()
    lines = [line for line in text.splitlines() if line]
    if lines and not text.endswith("\n"):
        try:
            json.loads(lines[-1])
        except json.JSONDecodeError:
            click.echo(f"!! {path.name}: dropped a torn last line ({len(lines[-1])} characters)", err=True)
            lines.pop()
    return lines


def summarize(
    rd: Path,
    cfg: RunConfig,
    stats: dict[str, messages.RoleStats],
    wall_s: float,
    restarts: list,
    result,
    interrupted: bool = False,
) -> dict:
    """summary.json. Totals and rates cover the whole run, every launch of a resumed
    one (``samples_per_s`` = all samples over the sum of the launches' training spans);
    ``launch_*`` figures, ``wall_s`` and the busy fractions are this launch's."""
    path = rd / "metrics.jsonl"
    rows = [json.loads(line) for line in complete_lines(path)] if path.exists() else []
    this = launches(rows)[-1] if rows else []
    busy = {name: s.busy_s for name, s in stats.items()}
    span = train_span_s(rows)
    launch_span = launch_span_s(this) if this else wall_s
    first, last = reward_trend(rows)
    samples, tokens = sum(r["samples"] for r in rows), sum(r["tokens"] for r in rows)
    launch_samples = sum(r["samples"] for r in this)
    return {
        "mode": cfg.workflow.mode,
        "staleness": cfg.staleness,
        "interrupted": interrupted,
        "steps": len(rows),
        "launches": len(launches(rows)),
        "wall_s": round(wall_s, 2),
        "train_span_s": round(span, 2),
        "samples": samples,
        "tokens": tokens,
        "samples_per_s": samples / max(span, 1e-9),
        "tokens_per_s": tokens / max(span, 1e-9),
        "launch_steps": len(this),
        "launch_train_span_s": round(launch_span, 2),
        "launch_samples": launch_samples,
        "launch_samples_per_s": launch_samples / max(launch_span, 1e-9),
        "reward_first_10pct": first,
        "reward_last_10pct": last,
        "staleness_max": max((r["staleness_max"] for r in rows), default=0),
        "busy_s": busy,
        "counters": {name: dict(s.counters) for name, s in stats.items() if s.counters},
        # over this launch's training span (its first step's start to its last step's end): start-up excluded
        "busy_fraction": {name: min(1.0, b / max(launch_span, 1e-9)) for name, b in busy.items()},
        "pipeline_efficiency": min(1.0, max(busy.values(), default=0.0) / max(launch_span, 1e-9)),
        "restarts": restarts,
        "checkpoint": result.checkpoint if result else "",
        "ended": result.ended if result else "",
        **val_summary(rd, rows),
        **(session_summary(rows) if cfg.data_from_gateway else {}),
    }


def session_summary(rows: list[dict]) -> dict:
    """A run on gateway sessions: sessions trained and discarded as stale (every launch),
    the staleness they were trained at (mean over sessions, max)."""
    trained = sum(r["samples"] for r in rows)
    stale = sum(max((r.get("sessions_stale", 0) for r in part), default=0) for part in launches(rows))
    mean = sum(r.get("staleness_mean", 0.0) * r["samples"] for r in rows) / max(trained, 1)
    return {
        "sessions_trained": int(trained),
        "sessions_stale": int(stale),
        "sessions_stale_frac": stale / max(trained + stale, 1),
        "staleness_mean": mean,
    }


def val_summary(rd: Path, rows: list[dict]) -> dict:
    """The evaluations' figures: the best (that of checkpoints/best when saved) and the last.
    ``val_best_step`` is numbered as the progress line numbers steps (1-based); best.json
    and metrics.jsonl hold the 0-based index."""
    from asyncflow.actors.evaluation.evaluator import read_best

    evals = [r for r in rows if "val/accuracy" in r]
    best = read_best(rd)
    if best is None and evals:
        top = max(evals, key=lambda r: r["val/accuracy"])  # the first of equals, as the trainer keeps it
        best = {"value": top["val/accuracy"], "step": evaluated_step(top) - 1}
    start = next((r["val/start_accuracy"] for r in rows if "val/start_accuracy" in r), None)
    return {
        "val_start_accuracy": start,
        "val_best_accuracy": best["value"] if best else None,
        "val_best_step": console_step(best) if best else None,
        "val_final_accuracy": evals[-1]["val/accuracy"] if evals else None,
    }
