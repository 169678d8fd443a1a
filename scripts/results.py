"""Measure what the results pages show, keep each measurement's JSON, and write the pages from
the JSON alone (no figure in a page is typed by hand).

    python scripts/results.py                       # measure what has no JSON yet, write the pages
    python scripts/results.py --only parity         # measure one record again (its JSON is replaced)
    python scripts/results.py --only real_paired_stream --seeds 12 13   # some seeds of a per-seed record
    python scripts/results.py --render              # measure nothing; write the pages from docs/data

What each record runs, its seeds and the page that shows it: scripts/records.py; each page's
text: scripts/pages/<page>.md (scripts/render.py fills it). A measurement's JSON line goes
to ``--work`` (default runs/results/<name>.json, beside its runs) and to docs/data/<name>.json
(tracked: a fresh checkout renders the pages). Records marked ``when_named`` (the real-model
ones: they need models/smollm2-135m or models/gemma3-270m, README.md "A real pretrained
model", and take minutes to hours on 2 cores) are measured only when ``--only`` names them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import BY_NAME, DATA_DIR, PAGES, RECORDS, ROOT, Record  # noqa: E402
from render import render  # noqa: E402


def _cpu() -> str:
    """What the figures ran on (bfloat16 instructions make the real model's mixed precision several times faster)."""
    from asyncflow.planner.io import local_cpu_peak

    peak = local_cpu_peak()
    return peak.describe.removeprefix("this CPU: ") if peak is not None else "unknown"


def command(record: Record, work: str, seed: int | str | None = None) -> list[str]:
    line = record.command.replace("{seeds}", " ".join(map(str, record.seeds))).replace("{work}", work)
    parts = shlex.split(line.replace("{seed}", str(seed)) if seed is not None else line)
    return [sys.executable if p == "python" else p for p in parts]


def run(cmd: list[str]) -> dict:
    """One invocation: its last JSON line, with the command, when, how long, the load and the CPU."""
    print(f"== {shlex.join(cmd)}", file=sys.stderr, flush=True)
    started = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {shlex.join(cmd)}\n{done.stdout[-3000:]}")
    last = [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    return {
        "command": shlex.join(["python" if c == sys.executable else c for c in cmd]),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.time() - started),
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "cpu": _cpu(),
        "result": json.loads(last),
    }


def measure(record: Record, work: Path, seeds: list[int] | None, keep_runs: bool) -> dict:
    """Run ``record``'s command (per seed: the seeds asked for, replacing their entries) and keep its JSON."""
    if not keep_runs:  # a run left by an older measurement would be read as this one's
        shutil.rmtree(work / record.name, ignore_errors=True)
    if record.per_seed:
        kept = DATA_DIR / f"{record.name}.json"
        runs = {r["seed"]: r for r in json.loads(kept.read_text())["runs"]} if kept.exists() else {}
        for seed in seeds or record.seeds:
            runs[seed] = {"seed": seed, **run(command(record, str(work), seed))}
        data = {"runs": [runs[s] for s in sorted(runs)]}
    else:
        data = run(command(record, str(work)))
    for path in (work / f"{record.name}.json", DATA_DIR / f"{record.name}.json"):
        path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def load() -> dict[str, dict]:  # name -> its JSON, for the records that have one
    return {r.name: json.loads(p.read_text()) for r in RECORDS if (p := DATA_DIR / f"{r.name}.json").exists()}


def how(name: str, data: dict[str, dict]) -> str:
    """A record's command and date, as a page gives them: the command as it ran; for a per-seed record its
    command for seed S and the dates of the first and the last seed (each seed's own: in its JSON)."""
    record, kept = BY_NAME[name], data.get(name)
    shown = shlex.join(["python" if c == sys.executable else c for c in command(record, "runs/results", "S")])
    if kept is None:
        return f"`{shown}` (not measured since the pages keep their JSON)"
    if not record.per_seed:
        cpu = f", CPU: {kept['cpu']}" if kept.get("cpu") else ""
        return f"`{kept['command']}` ({kept['when']}, {kept['seconds'] / 60:.0f} min, load {kept['load_avg_1m']}{cpu})"
    runs = kept["runs"]
    dates = sorted(r["when"] for r in runs)
    return f"`{shown}` for S = {runs[0]['seed']} to {runs[-1]['seed']} ({dates[0]} to {dates[-1]})"


def reads_any(page: str, names: list[str]) -> bool:
    """Whether ``page``'s template reads any of the records ``names`` (a page may show another's figures)."""
    template = (ROOT / "scripts" / "pages" / f"{page}.md").read_text()
    return any(re.search(rf"\b{re.escape(name)}\b", template) for name in names)


def write_pages(pages: list[str], data: dict[str, dict], reads: set[tuple[str, str]] | None = None) -> None:
    for page in pages:
        template = (ROOT / "scripts" / "pages" / f"{page}.md").read_text()
        (ROOT / PAGES[page]).write_text(render(template, data, reads, how=lambda name: how(name, data)))
        print(f"wrote {PAGES[page]}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/results", help="where each measurement's runs and JSON go")
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), help="measure these records again, no other")
    parser.add_argument("--seeds", nargs="+", type=int, help="with --only: these seeds of a per-seed record")
    parser.add_argument("--render", action="store_true", help="measure nothing; write the pages from docs/data")
    parser.add_argument(
        "--keep-runs",
        action="store_true",
        help="read the runs an interrupted measurement left finished in --work instead of starting them again",
    )
    args = parser.parse_args()
    if args.seeds and not (args.only and all(BY_NAME[n].per_seed for n in args.only)):
        parser.error("--seeds needs --only with records measured per seed (their command has {seed})")
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    data = load()
    if args.render:
        names: list[str] = []
    elif args.only:
        names = args.only
    else:
        names = [r.name for r in RECORDS if r.name not in data and not r.when_named]
    for name in names:
        data[name] = measure(BY_NAME[name], work, args.seeds, args.keep_runs)
    write_pages([p for p in PAGES if args.render or args.only is None or reads_any(p, names)], data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
