"""CollectorActor: runs in the driver; receives what the roles report.

Takes: StepMetrics (appends one JSON object per trainer step to metrics.jsonl,
prints the progress line and passes it on to the subscribers: the planner),
RunFinished, RoleFailed (each sets the ``ended`` event the driver waits on), Spans;
from the driver: SetBusy (the roles' busy fractions it polls, added to each metrics
object; the loggers get it too), GetRunState (-> RunState), WriteTrace, and in its
own process ``Subscribe`` (pykka refs, not a wire message); Ping, Stop.

The trace (RUN_DIR/trace.json, Chrome trace event format, times in microseconds of
wall clock): one track (pid) per role with its spans as complete events (cat
"busy" or "wait"); a "policy version" counter on each role's track wherever its
version changes; "staleness" on the trainer's track per step; a flow from the
trainer's ``sync_weights`` span that published version v to every rollout
``swap_weights`` span that loaded v (flow id ``v * 1000 + track``). Phases of an
activity (``<activity>/<phase>``, ``core/phases.py``) are spans of cat "phase" on
lane (tid) 1 of the role's track; a "cpu" counter holds the CPU seconds of the
role's process, sent with each batch of spans.

The trace is streamed, so a long run costs no more memory than a short one: the collector holds only the events not yet
written, at most ``trace_chunk_events``, and appends them to trace.json every
``logging.trace_every_s``, whenever a chunk is full, and at the end. An append
overwrites only the file's closing ``]}``, so the file is a whole Chrome trace
between appends, memory and the cost of a write stay constant however long the
run, and a run killed mid-way keeps its trace up to its last append. A reader that
meets an append half done reads up to the last whole event (``cli/runs.load_trace``).
Events are in arrival order (Perfetto sorts them); process names come when a role's
first spans do, flows when the replica's swap does. A resumed run's collector (one per
launch) first renames the earlier launch's trace.json to trace.launch-<k>.json, so each
launch keeps its own trace (``afctl trace`` shows them all, ``cli/runs.launch_traces``).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import click

from asyncflow.actors.driver.summary import console_step
from asyncflow.actors.runtime import messages
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.core.actor import Actor
from asyncflow.core.disk_space import no_space_left

TRACE_CHUNK_EVENTS = 20_000
"""Events the collector holds before it appends them to trace.json (also appended every
``logging.trace_every_s`` and at the end)."""
TRACE_HEAD = '{"displayTimeUnit": "ms", "traceEvents": [\n'
TRACE_TAIL = "\n]}\n"
KEEP_VERSIONS = 64
"""Publish times kept to link a replica's swap to (a swap comes a few versions late at most)."""


def keep_earlier_launch(trace_path: Path) -> None:
    """Rename an earlier launch's trace.json to trace.launch-<k>.json, k the next free number."""
    if not trace_path.exists():
        return
    k = 1
    while (kept := trace_path.with_name(f"trace.launch-{k}.json")).exists():
        k += 1
    os.replace(trace_path, kept)


class Subscribe:
    """In-process (driver -> collector): tell every following StepMetrics to these pykka
    refs (the planner); an empty list ends the subscription. Answered with Ok."""

    def __init__(self, refs: list):
        self.refs = list(refs)


class CollectorActor(Actor):
    Inbox = messages.CollectorIn

    def __init__(
        self,
        ctx,
        run_dir: str,
        num_steps: int,
        progress: bool,
        loggers: list | None = None,
        trace_every_s: float = 0.0,
        on_trace_written: Callable[[int], None] | None = None,
        ended: threading.Event | None = None,
        trace_chunk_events: int = TRACE_CHUNK_EVENTS,
    ):
        """``on_trace_written(num_events)`` is called in the actor's thread after each live
        rewrite of trace.json (e.g. to follow a live run). ``ended`` is set on RunFinished
        and on RoleFailed: what the driver waits on."""
        super().__init__(ctx)
        self.metrics_path = Path(run_dir) / "metrics.jsonl"
        self.trace_path = Path(run_dir) / "trace.json"
        keep_earlier_launch(self.trace_path)
        self.trace_every_s = trace_every_s
        self._trace_failed = False  # the last periodic write failed (said once, until one succeeds)
        self.on_trace_written = on_trace_written
        self._traced = 0  # events written to trace.json so far
        self.trace_chunk_events = trace_chunk_events
        self._named: set[str] = set()  # roles whose process_name is written
        self.num_steps = num_steps
        self.progress = progress
        self.loggers = loggers or []
        self.ended = ended or threading.Event()
        self.failures: list[messages.RoleFailed] = []
        self.result: messages.RunFinished | None = None
        self.last_step_at = time.monotonic()
        self.slowest_step_s = 0.0  # between two StepMetrics (the first: its step_time_s), for the driver's stall timeout
        self.num_steps_seen = 0
        self.last_values: dict[str, float] = {}
        self.busy: dict[str, float] = {}  # role -> busy fraction, refreshed by the driver
        self.subscribers: list = []  # in-process pykka refs told every StepMetrics (Subscribe: the planner)
        self.trace_events: list[dict] = []  # not yet written to trace.json
        self._tracks: dict[str, int] = {}  # role -> track (Chrome trace pid)
        self._role_pids: dict[str, int] = {}  # role -> OS pid
        self._last_version: dict[str, int] = {}
        self._published: dict[int, float] = {}  # version -> ts (us) of the trainer's sync_weights span
        self._swaps: dict[int, list[tuple[int, float]]] = {}  # version -> (track, ts us) of swaps before its publish
        self.last_span: dict[str, tuple[str, float]] = {}  # role -> (name, wall-clock end s), for the hang report

    def on_start(self) -> None:
        if self.trace_every_s > 0:
            self.call_later(self.trace_every_s, self._write_live)

    def _write_live(self) -> None:
        try:
            if self.trace_events:  # nothing new: leave the file as it is
                written = self.write_trace(str(self.trace_path))
                self._trace_failed = False
                if self.on_trace_written is not None:
                    self.on_trace_written(written)
        except OSError as exc:  # a full disk, say: the run goes on; its trace is written when it can be
            if not self._trace_failed:
                why = no_space_left(exc, self.trace_path) or f"{type(exc).__name__}: {exc}"
                click.echo(f"!! could not write {self.trace_path} ({why}); it is tried again as the run goes on", err=True)
            self._trace_failed = True
        finally:
            self.call_later(self.trace_every_s, self._write_live)

    def handle(self, msg, pending):
        match msg:
            case messages.StepMetrics(step=step, values=values):
                values = dict(values)
                values.update({f"busy/{role}": round(frac, 4) for role, frac in self.busy.items()})
                with self.metrics_path.open("a") as f:
                    f.write(json.dumps(values) + "\n")
                for logger in self.loggers:
                    logger.log(step, values)
                if "staleness_max" in values:
                    self.trace_events.append(
                        {
                            "ph": "C",
                            "name": "staleness",
                            "ts": time.time() * 1e6,
                            "pid": self._track(names.TRAINER),
                            "args": {"max": values["staleness_max"], "mean": values.get("staleness_mean", 0.0)},
                        }
                    )
                now = time.monotonic()
                # the first step's gap would count the processes' start: its own time instead
                took = now - self.last_step_at if self.num_steps_seen else values.get("step_time_s", 0.0)
                self.slowest_step_s = max(self.slowest_step_s, took)
                self.num_steps_seen += 1
                self.last_step_at = now
                self.last_values = values
                if self.progress:
                    click.echo(progress_line(values, self.num_steps, self.busy))
                for ref in self.subscribers:
                    ref.tell(msg)
                return protocol.Ok()
            case messages.Spans():
                self._add_spans(msg)
                return protocol.Ok()
            case messages.RunFinished():
                self.result = msg
                self.ended.set()
                return protocol.Ok()
            case messages.RoleFailed():
                self.failures.append(msg)
                self.ended.set()
                return protocol.Ok()
            case messages.SetBusy(fractions=fractions):
                self.busy = dict(fractions)
                return protocol.Ok()
            case messages.GetRunState():
                return messages.RunState(
                    finished=self.result,
                    failures=list(self.failures),
                    since_step_s=time.monotonic() - self.last_step_at,
                    last_spans=dict(self.last_span),
                    slowest_step_s=self.slowest_step_s,
                    num_steps=self.num_steps_seen,
                )
            case messages.WriteTrace(path=path):
                self.write_trace(path)
                return protocol.Ok()
            case Subscribe(refs=refs):
                self.subscribers = refs
                return protocol.Ok()
            case protocol.Stop():
                return protocol.Ok()

    def _track(self, role: str) -> int:
        track = self._tracks.get(role)
        if track is None:
            track = self._tracks[role] = len(self._tracks) + 1
        return track

    def _add_spans(self, msg: messages.Spans) -> None:
        """Spans as complete events, version counters where the version changes, flow ends."""
        track = self._track(msg.role)
        self._role_pids[msg.role] = msg.pid
        events = self.trace_events
        n = len(msg.names)
        versions = msg.versions if len(msg.versions) == n else [-1] * n
        final_version = int(msg.counters.get("version", -1))
        activities = []  # positions of the activity spans; phases ("<activity>/<phase>") go on lane 1
        for i, (name, start, dur) in enumerate(zip(msg.names, msg.starts_s, msg.durations_s)):
            if "/" in name:
                events.append(
                    {"ph": "X", "name": name, "cat": "phase", "ts": start * 1e6, "dur": dur * 1e6, "pid": track, "tid": 1}
                )
            else:
                activities.append(i)
        for j, i in enumerate(activities):
            name, start, dur = msg.names[i], msg.starts_s[i], msg.durations_s[i]
            ts = start * 1e6
            events.append(
                {
                    "ph": "X",
                    "name": name,
                    "cat": "wait" if name.startswith("wait_") else "busy",
                    "ts": ts,
                    "dur": dur * 1e6,
                    "pid": track,
                    "tid": 0,
                }
            )
            end_version = versions[activities[j + 1]] if j + 1 < len(activities) else final_version
            if name == "sync_weights" and versions[i] >= 0:
                self._publish(versions[i] + 1, ts)
            elif name == "swap_weights" and end_version >= 0:
                self._swap(end_version, track, ts)
            if end_version >= 0 and end_version != self._last_version.get(msg.role):
                self._last_version[msg.role] = end_version
                events.append(
                    {"ph": "C", "name": "policy version", "ts": ts + dur * 1e6, "pid": track, "args": {"version": end_version}}
                )
        if "cpu_s" in msg.counters:
            events.append(
                {"ph": "C", "name": "cpu", "ts": time.time() * 1e6, "pid": track, "args": {"cpu_s": float(msg.counters["cpu_s"])}}
            )
        if activities:
            i = activities[-1]
            self.last_span[msg.role] = (msg.names[i], msg.starts_s[i] + msg.durations_s[i])
        if msg.role not in self._named:
            self._named.add(msg.role)
            events.extend(self._names(msg.role))
        if len(events) >= self.trace_chunk_events:
            self._append_trace()

    def _names(self, role: str) -> list[dict]:
        track = self._tracks[role]
        pid = self._role_pids.get(role)
        label = f"{role} (pid {pid})" if pid else role
        return [
            {"ph": "M", "name": "process_name", "pid": track, "tid": 0, "args": {"name": label}},
            {"ph": "M", "name": "process_sort_index", "pid": track, "tid": 0, "args": {"sort_index": track}},
        ]

    def _publish(self, version: int, ts: float) -> None:
        self._published[version] = ts
        for track, swap_ts in self._swaps.pop(version, ()):
            self._flow(version, track, swap_ts)
        for old in [v for v in self._published if v < version - KEEP_VERSIONS]:  # bounded: versions long past
            del self._published[old]
        for old in [v for v in self._swaps if v < version - KEEP_VERSIONS]:
            del self._swaps[old]  # loaded from the start checkpoint: no publish to link

    def _swap(self, version: int, track: int, ts: float) -> None:
        if version in self._published:
            self._flow(version, track, ts)
        else:
            self._swaps.setdefault(version, []).append((track, ts))

    def _flow(self, version: int, track: int, ts: float) -> None:
        trainer = self._tracks.get(names.TRAINER)
        if trainer is None:
            return
        flow_id = version * 1000 + track
        common = {"name": f"weights v{version}", "cat": "weights", "id": flow_id, "tid": 0}
        self.trace_events.append({"ph": "s", **common, "ts": self._published[version], "pid": trainer})
        self.trace_events.append({"ph": "f", "bp": "e", **common, "ts": ts, "pid": track})

    def _append_trace(self) -> None:
        """Append the events held to trace.json (created, atomically, by the first)."""
        for role in self._tracks:  # a role seen only in metrics (the trainer's staleness) is named too
            if role not in self._named:
                self._named.add(role)
                self.trace_events.extend(self._names(role))
        events, self.trace_events = self.trace_events, []
        body = ",\n".join(json.dumps(e) for e in events)
        path = self.trace_path
        if self._traced == 0 or not path.exists():
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(TRACE_HEAD + body + TRACE_TAIL)
            os.replace(tmp, path)
        elif body:
            with path.open("r+b") as f:
                f.seek(-len(TRACE_TAIL), os.SEEK_END)
                f.write((",\n" + body + TRACE_TAIL).encode())
        self._traced += len(events)

    def write_trace(self, path: str) -> int:
        """RUN_DIR/trace.json in the Chrome trace event format (Perfetto, chrome://tracing):
        what is held is appended; another ``path`` gets a copy. Returns the events written."""
        self._append_trace()
        if Path(path).resolve() != self.trace_path.resolve():
            tmp = Path(path).with_name(Path(path).name + ".tmp")
            shutil.copyfile(self.trace_path, tmp)
            os.replace(tmp, path)
        return self._traced


def progress_line(v: dict[str, float], num_steps: int, busy: dict[str, float]) -> str:
    t = max(v["time_s"], 1e-9)
    roles = " ".join(
        f"{r.split('.')[0][:7]}{'' if r.count('.') == 0 else r.split('.')[-1]}={f:.2f}" for r, f in sorted(busy.items())
    )
    val = f" | val acc {v['val/accuracy']:.3f}" if "val/accuracy" in v else ""
    if "env/tool_call_rate" in v:  # with an environment (docs/environments.md)
        val += f" | tool calls {v['env/tool_call_rate']:.2f}"
    return (
        f"step {console_step(v):>4}/{num_steps} | reward {v['reward_mean']:.3f}{val} | "
        f"{v['total_samples'] / t:7.1f} samples/s | {v['total_tokens'] / t:8.0f} tok/s | "
        f"stale<={int(v['staleness_max'])} | resp {v['response_len_mean']:.1f} tok | busy {roles}"
    )
