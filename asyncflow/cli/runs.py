"""Reading finished (or running) run directories for ``afctl trace`` and ``afctl plot``.

No plotting here: these functions are cheap to import and used by tests too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from asyncflow.config import names

ROLE_ORDER = names.DISPLAY_ORDER


@dataclass
class Span:
    name: str
    start_s: float  # seconds since the run's first span
    duration_s: float

    @property
    def waiting(self) -> bool:
        return self.name.startswith("wait_")


@dataclass
class Timeline:
    label: str
    mode: str
    tracks: dict[str, list[Span]] = field(default_factory=dict)  # role -> spans, in time order
    t0_us: float = 0.0  # wall clock of the first span, microseconds
    end_s: float = 0.0  # end of the last span, seconds since t0
    num_flows: int = 0
    flows: list[tuple[str, float, str, float]] = field(default_factory=list)  # (from role, s, to role, s): weight sync
    counters: dict[str, int] = field(default_factory=dict)  # counter name -> number of samples

    def busy_fraction(self, role: str) -> float:
        spans = self.tracks[role]
        busy = sum(s.duration_s for s in spans if not s.waiting)
        total = sum(s.duration_s for s in spans)
        return busy / total if total > 0 else 0.0


def role_sort_key(role: str) -> tuple:
    kind, _, index = role.partition(".")
    rank = ROLE_ORDER.index(kind) if kind in ROLE_ORDER else len(ROLE_ORDER)
    return (rank, kind, int(index) if index.isdigit() else -1, index)  # "trainer" before "trainer.1"


def run_mode(run_dir: Path) -> str:
    """ "sync", "async (k=1)"..., from RUN_DIR/config.json ("" when absent)."""
    path = run_dir / "config.json"
    if not path.exists():
        return ""
    workflow = json.loads(path.read_text()).get("workflow", {})
    mode = workflow.get("mode", "")
    return f"{mode} (k={workflow.get('staleness', '?')})" if mode == "async" else mode


def run_label(run_dir: Path) -> str:
    mode = run_mode(run_dir)
    return f"{run_dir.name} [{mode}]" if mode else run_dir.name


def load_trace(path: Path) -> dict:
    """A run's trace.json. The collector appends to it in chunks (``actors/driver/collector.py``):
    met in the middle of an append, it is read up to its last whole event."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} does not exist: the run has not written its first events yet or ran with [logging] spans = false"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        head = '{"displayTimeUnit": "ms", "traceEvents": [\n'
        if not text.startswith(head):
            raise ValueError(f"{path} is not valid JSON ({exc}): was the run killed while writing it?") from None
        events = []
        for line in text[len(head) :].splitlines():
            line = line.rstrip(",")
            if not line.startswith("{"):
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the append in progress
        return {"displayTimeUnit": "ms", "traceEvents": events}


def launch_traces(run_dir: Path) -> list[Path]:
    """The traces of every launch of a run, in order: trace.launch-1.json, ... (earlier
    launches of a resumed run, kept by each new launch's collector), then trace.json
    (the last). Absent files are left out; only trace.json when the run never resumed."""
    earlier = [p for p in run_dir.glob("trace.launch-*.json") if p.stem.removeprefix("trace.launch-").isdigit()]
    earlier.sort(key=lambda p: int(p.stem.removeprefix("trace.launch-")))
    last = run_dir / "trace.json"
    return earlier + ([last] if last.exists() or not earlier else [])


def validate_trace(trace: dict, max_run_s: float | None = None) -> list[str]:
    """Problems of a Chrome trace (an empty list when valid): the JSON object form with
    ``traceEvents``, every event with a known phase and its required fields, a named
    track for every pid with spans, no negative span, and, given ``max_run_s`` (the
    run's wall time), no span longer than the run."""
    problems: list[str] = []
    events = trace.get("traceEvents") if isinstance(trace, dict) else None
    if not isinstance(events, list):
        return ["not a Chrome trace object: no 'traceEvents' list"]
    named, with_spans = set(), set()
    flows: dict[tuple, int] = {}
    for k, e in enumerate(events):
        ph = e.get("ph")
        if ph not in ("X", "M", "C", "s", "f", "t", "B", "E", "i", "I"):
            problems.append(f"event {k}: unknown phase {ph!r}")
            continue
        need = {
            "X": ("name", "ts", "dur", "pid"),
            "M": ("name", "pid", "args"),
            "C": ("name", "ts", "pid", "args"),
            "s": ("name", "ts", "pid", "id"),
            "f": ("name", "ts", "pid", "id"),
        }.get(ph, ("ts", "pid"))
        missing = [f for f in need if f not in e]
        if missing:
            problems.append(f"event {k} ({ph} {e.get('name', '?')!r}): missing {missing}")
            continue
        if ph == "M" and e["name"] == "process_name":
            named.add(e["pid"])
        elif ph == "X":
            with_spans.add(e["pid"])
            if e["dur"] < 0:
                problems.append(f"event {k}: span {e['name']!r} has a negative duration {e['dur']}")
            elif max_run_s is not None and e["dur"] / 1e6 > max_run_s:
                problems.append(
                    f"event {k}: span {e['name']!r} lasts {e['dur'] / 1e6:.1f} s, longer than the run ({max_run_s:.1f} s)"
                )
        elif ph == "C" and not all(isinstance(v, (int, float)) for v in e["args"].values()):
            problems.append(f"event {k}: counter {e['name']!r} has a non-numeric value")
        elif ph in ("s", "f"):
            flows[(e["id"], ph)] = flows.get((e["id"], ph), 0) + 1
    for pid in sorted(with_spans - named):
        problems.append(f"track {pid} has spans but no process_name")
    for flow_id, ph in flows:
        if (flow_id, "f" if ph == "s" else "s") not in flows:
            problems.append(
                f"flow {flow_id} has a {'start' if ph == 's' else 'finish'} but no {'finish' if ph == 's' else 'start'}"
            )
    return problems


def timeline(trace: dict, label: str = "", mode: str = "") -> Timeline:
    """Spans per role (named by the process_name metadata, without the pid)."""
    events = trace["traceEvents"]
    names = {
        e["pid"]: e["args"]["name"].split(" (pid")[0] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") != "phase"]  # phases: bench e2e --breakdown
    tl = Timeline(label=label, mode=mode)
    if not spans:
        return tl
    tl.t0_us = min(e["ts"] for e in spans)
    for e in sorted(spans, key=lambda e: e["ts"]):
        role = names.get(e["pid"], f"track {e['pid']}")
        tl.tracks.setdefault(role, []).append(Span(e["name"], (e["ts"] - tl.t0_us) / 1e6, e["dur"] / 1e6))
    tl.end_s = max(s.start_s + s.duration_s for spans in tl.tracks.values() for s in spans)
    tl.tracks = dict(sorted(tl.tracks.items(), key=lambda kv: role_sort_key(kv[0])))
    tl.num_flows = sum(1 for e in events if e.get("ph") == "s")
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    for e in events:
        if e.get("ph") == "f" and e["id"] in starts:
            s = starts[e["id"]]
            tl.flows.append(
                (names.get(s["pid"], ""), (s["ts"] - tl.t0_us) / 1e6, names.get(e["pid"], ""), (e["ts"] - tl.t0_us) / 1e6)
            )
    for e in events:
        if e.get("ph") == "C":
            tl.counters[e["name"]] = tl.counters.get(e["name"], 0) + 1
    return tl


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: {run_dir} is not a run directory, or no step finished yet")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_wall_s(run_dir: Path) -> float | None:
    path = run_dir / "summary.json"
    return json.loads(path.read_text()).get("wall_s") if path.exists() else None


def sync_first(run_dirs: list[Path]) -> list[Path]:
    """Sync runs above async ones (stable otherwise): the bubbles are compared top to bottom."""
    return sorted(run_dirs, key=lambda d: 0 if run_mode(d) == "sync" else 1)
