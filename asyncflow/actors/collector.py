"""CollectorActor: runs in the driver; receives what the roles report.

Takes: StepMetrics (appends one JSON object per trainer step to metrics.jsonl and
prints the progress line), RunFinished, RoleFailed, Ping, Stop.
The driver reads ``finished`` / ``failures`` and adds the latest busy fractions of
every role (which it polls) to each metrics object.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import click

from asyncflow.core import protocol
from asyncflow.core.actor import Actor

COLLECTOR = "collector"


class CollectorActor(Actor):
    Inbox = protocol.CollectorIn

    def __init__(self, ctx, run_dir: str, num_steps: int, progress: bool, loggers: list | None = None):
        super().__init__(ctx)
        self.metrics_path = Path(run_dir) / "metrics.jsonl"
        self.num_steps = num_steps
        self.progress = progress
        self.loggers = loggers or []
        self.finished = threading.Event()
        self.failed = threading.Event()
        self.failures: list[tuple[str, str]] = []
        self.result: protocol.RunFinished | None = None
        self.last_step_at = time.monotonic()
        self.last_values: dict[str, float] = {}
        self.busy: dict[str, float] = {}  # role -> busy fraction, refreshed by the driver
        self.trace_events: list[dict] = []
        self._tracks: dict[str, int] = {}

    def handle(self, msg, pending):
        match msg:
            case protocol.StepMetrics(step=step, values=values):
                values = dict(values)
                values.update({f"busy/{role}": round(frac, 4) for role, frac in self.busy.items()})
                with self.metrics_path.open("a") as f:
                    f.write(json.dumps(values) + "\n")
                for logger in self.loggers:
                    logger.log(step, values)
                self.last_step_at = time.monotonic()
                self.last_values = values
                if self.progress:
                    click.echo(progress_line(values, self.num_steps, self.busy))
                return protocol.Ok()
            case protocol.Spans():
                self._add_spans(msg)
                return protocol.Ok()
            case protocol.RunFinished():
                self.result = msg
                self.finished.set()
                return protocol.Ok()
            case protocol.RoleFailed(role=role, error=error):
                self.failures.append((role, error))
                self.failed.set()
                return protocol.Ok()
            case protocol.Stop():
                return protocol.Ok()

    def _add_spans(self, msg: protocol.Spans) -> None:
        """Chrome trace events: one track (pid) per role, spans as complete events."""
        track = self._tracks.get(msg.role)
        if track is None:
            track = self._tracks[msg.role] = len(self._tracks) + 1
            self.trace_events.append({"ph": "M", "name": "process_name", "pid": track, "tid": 0,
                                      "args": {"name": f"{msg.role} (pid {msg.pid})"}})
            self.trace_events.append({"ph": "M", "name": "process_sort_index", "pid": track, "tid": 0,
                                      "args": {"sort_index": track}})
        for name, start, dur in zip(msg.names, msg.starts_s, msg.durations_s):
            self.trace_events.append({"ph": "X", "name": name, "cat": "wait" if name.startswith("wait_") else "busy",
                                      "ts": start * 1e6, "dur": dur * 1e6, "pid": track, "tid": 0})
        if msg.starts_s and msg.counters:
            end = msg.starts_s[-1] + msg.durations_s[-1]
            self.trace_events.append({"ph": "C", "name": "policy version", "ts": end * 1e6, "pid": track,
                                      "args": {k: v for k, v in msg.counters.items()}})

    def write_trace(self, path: str) -> int:
        """RUN_DIR/trace.json in the Chrome trace event format (Perfetto, chrome://tracing)."""
        events = sorted(self.trace_events, key=lambda e: e.get("ts", 0))
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return len(events)


def progress_line(v: dict[str, float], num_steps: int, busy: dict[str, float]) -> str:
    t = max(v["time_s"], 1e-9)
    roles = " ".join(f"{r.split('.')[0][:7]}{'' if r.count('.') == 0 else r.split('.')[-1]}={f:.2f}" for r, f in sorted(busy.items()))
    return (
        f"step {int(v['step']) + 1:>4}/{num_steps} | reward {v['reward_mean']:.3f} | "
        f"{v['total_samples'] / t:7.1f} samples/s | {v['total_tokens'] / t:8.0f} tok/s | "
        f"stale<={int(v['staleness_max'])} | resp {v['response_len_mean']:.1f} tok | busy {roles}"
    )
