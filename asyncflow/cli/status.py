"""``afctl status [RUN_DIR] [--watch]``: every actor of a running cluster.

Finds the cluster from RUN_DIR/cluster.json (no RUN_DIR: the latest run this user
started on this machine, through the pointer file the driver writes, followed only
when it is a plain file of this user; the run is named on stderr), then asks the directory
for every actor, each worker role for its RoleStats, the queue for its status and
per-task state, and the weight-sync actor for the newest published version. On tcp
the cluster secret comes from ASYNCFLOW_SECRET (cluster.json never holds it).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from asyncflow.actors.runtime import messages
from asyncflow.config import names

INFRA = ("tq.", "host.", "directory", names.COLLECTOR, names.WEIGHTS, names.PLANNER, names.ROSTER, "dist.", "relay.")
"""Prefixes of the actors that are not roles (the queue, hosts, the driver's own, rendezvous,
weight relays): status never asks them for RoleStats, which they do not take (an actor
logs a warning for every message it cannot decode: a look must not leave a mark on the
run). The roster is asked what it does take, the rollout replicas it lists now."""


@click.command()
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--watch", is_flag=True, help="Refresh in place until the run ends (Ctrl-C to leave).")
@click.option("--interval", default=2.0, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def status(run_dir: Path | None, watch: bool, interval: float, as_json: bool) -> None:
    """Show every actor of the running cluster of RUN_DIR (default: the latest run
    started here): host, pid, state, busy fraction, policy version, queue depth per
    task, and weights in flight to rollout replicas."""
    import msgspec

    from asyncflow.actors.driver import cluster_file as _cluster_file

    try:
        info = _cluster_file.read(run_dir)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    if run_dir is None:  # say which: the pointer names the latest run this user started here
        click.echo(f"run {info.run_dir} (the latest you started on this machine; `afctl status RUN_DIR` for another)", err=True)
    while True:
        if not info.running or not _cluster_file.driver_alive(info):
            why = "it ended" if not info.running else f"its driver (pid {info.driver_pid}) is gone"
            click.echo(
                f"run {info.run_dir} is not running: {why}. See `afctl trace {info.run_dir}` and `afctl plot {info.run_dir}`."
            )
            sys.exit(1)
        snap = snapshot(info)
        if as_json:
            click.echo(msgspec.json.encode(snap).decode())
        else:
            text = render(snap)
            if watch:
                click.clear()
            click.echo(text)
        if not watch:
            return
        try:
            time.sleep(interval)
        except KeyboardInterrupt:
            return
        info = _cluster_file.read(info.run_dir)


def snapshot(info) -> dict:
    """One look at the cluster, as plain data (``--json`` prints it)."""
    from asyncflow.actors.driver.cluster_file import CLUSTER_FILE
    from asyncflow.core.directory import DirectoryClient
    from asyncflow.core.errors import AsyncflowError
    from asyncflow.core.tq.client import TQClient

    dc = DirectoryClient(info.directory, info.transport)
    try:
        entries = dc.list()
    except AsyncflowError as exc:
        raise click.ClickException(
            f"the directory of {info.run_dir} does not answer at {info.directory} ({exc}); if the run is on tcp, "
            f"set ASYNCFLOW_SECRET to its secret. {Path(info.run_dir) / CLUSTER_FILE} says driver pid {info.driver_pid}."
        ) from None
    infra = INFRA
    workers = set(info.workers) | {e.name for e in entries if not e.name.startswith(infra)}  # replicas added later too

    def role_stats(name: str):
        try:
            return dc.ref(name, wait_s=0.0).ask(messages.GetRoleStats(), timeout_s=3)
        except (AsyncflowError, LookupError):
            return None  # inside a long unit of work, restarting, or gone

    role_names = [e.name for e in entries if e.name in workers]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(role_names)))) as pool:
        stats = dict(zip(role_names, pool.map(role_stats, role_names)))
    actors: list[dict[str, Any]] = []  # JSON-like rows (afctl status --json)
    for e in sorted(entries, key=lambda e: _order(e.name)):
        row: dict[str, Any] = {"name": e.name, "host": e.host, "pid": e.pid, "kind": e.kind.rpartition(":")[2]}
        s = stats.get(e.name)
        if e.name in workers:
            if s is None:
                row.update(state="NO ANSWER (in a unit)")
            else:  # a role answers between units of work: its state is "idle" unless paused or done
                total = s.busy_s + sum(s.wait_s.values())
                row.update(
                    state=s.state,
                    busy=s.busy_s / total if total > 0 else 0.0,
                    version=s.version,
                    items=s.num_items,
                    wait_s=dict(s.wait_s),
                )
        actors.append(row)
    roster = next((a for a in actors if a["name"] == names.ROSTER), None)
    if roster is not None:
        try:
            replicas = dc.ref(names.ROSTER, wait_s=0.0).ask(messages.GetReplicas(), timeout_s=3).names
            roster.update(state="replicas: " + (", ".join(replicas) or "none"), replicas=list(replicas))
        except (AsyncflowError, LookupError):
            roster.update(state="NO ANSWER")
    snap: dict = {
        "run_dir": info.run_dir,
        "driver_pid": info.driver_pid,
        "up_s": time.time() - info.started_at,
        "actors": actors,
        "queue": None,
        "tasks": {},
        "weights": None,
        "last_step": _last_step(info.run_dir),
    }
    try:
        tq = TQClient(dc, consumer="afctl-status", timeout_s=3)
        q = tq.status()
        snap["queue"] = {
            "live_rows": q.num_live_rows,
            "capacity_rows": q.capacity_rows,
            "waiting_allocations": q.num_waiting_allocations,
            "freed_rows": q.num_freed_rows,
        }
        for task in info.tasks:
            t = tq.task_status(task)
            pending = sum(t.num_pending.values())
            snap["tasks"][task] = {
                "rows": t.num_rows,
                "acked": t.num_acked,
                "handed_out": pending,
                "queued": max(0, t.num_rows - t.num_acked - pending),
                "requests_waiting": t.num_waiting,
            }
    except (AsyncflowError, LookupError) as exc:
        snap["queue_error"] = str(exc)
    try:
        latest = dc.ref(names.WEIGHTS, wait_s=0.0).ask(messages.GetLatestWeights(), timeout_s=3)
        rollouts = {a["name"]: a.get("version") for a in actors if a["name"].startswith("rollout.")}
        snap["weights"] = {
            "published": latest.version,
            "bytes": latest.num_bytes,
            "in_flight_to": sorted(n for n, v in rollouts.items() if v is not None and v < latest.version),
        }
    except (AsyncflowError, LookupError):
        pass
    return snap


def render(snap: dict) -> str:
    lines = [
        f"run {snap['run_dir']}  driver pid {snap['driver_pid']}, up {snap['up_s']:.0f} s"
        + (f", last trainer step {snap['last_step']}" if snap["last_step"] is not None else ", no step yet")  # 1-based
    ]
    lines.append(
        f"{'ACTOR':<22}{'HOST':<12}{'PID':>8}  {'STATE':<18}{'BUSY':>6}  {'MOSTLY WAITS ON':<20}{'VERSION':>8}{'ITEMS':>8}"
    )
    for a in snap["actors"]:
        busy = f"{a['busy']:.0%}" if "busy" in a else ""
        version = str(a["version"]) if a.get("version", -1) >= 0 else ""
        state = a.get("state", a["kind"])
        waits: dict[str, float] = a.get("wait_s") or {}
        total = sum(waits.values())
        top = max(waits, key=waits.__getitem__) if total > 0 else ""
        waits_on = f"{top} ({waits[top] / total:.0%})" if top else ""
        if "replicas" in a:  # the roster: its list in full, in the columns a role's figures take
            lines.append(f"{a['name']:<22}{a['host'][:11]:<12}{a['pid']:>8}  {state}")
            continue
        lines.append(
            f"{a['name']:<22}{a['host'][:11]:<12}{a['pid']:>8}  {state[:17]:<18}{busy:>6}  {waits_on:<20}"
            f"{version:>8}{a.get('items', ''):>8}"
        )
    q = snap["queue"]
    if q is not None:
        lines.append(
            f"queue: {q['live_rows']}/{q['capacity_rows']} rows live, {q['waiting_allocations']} allocations "
            f"waiting, {q['freed_rows']} rows freed so far"
        )
        lines.append(f"  {'TASK':<12}{'QUEUED':>8}{'HANDED OUT':>12}{'ACKED':>8}{'WAITING GETS':>14}")
        for task, t in snap["tasks"].items():
            lines.append(f"  {task:<12}{t['queued']:>8}{t['handed_out']:>12}{t['acked']:>8}{t['requests_waiting']:>14}")
    else:
        lines.append(f"queue: no answer ({snap.get('queue_error', '')})")
    w = snap["weights"]
    if w is not None and w["published"] >= 0:
        flight = ", ".join(w["in_flight_to"]) or "none (every replica holds it)"
        lines.append(f"weights: v{w['published']} published ({w['bytes'] / 1e6:.1f} MB); in flight to: {flight}")
    return "\n".join(lines)


def _order(name: str) -> tuple:
    from asyncflow.cli.runs import role_sort_key

    infra = name.startswith(INFRA)
    return (1 if infra else 0, role_sort_key(name))


def _last_step(run_dir: str) -> int | None:
    """The last step in metrics.jsonl, numbered as the progress line numbers it (1-based)."""
    from asyncflow.actors.driver.summary import console_step

    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    import json

    return console_step(json.loads(lines[-1])) if lines else None
