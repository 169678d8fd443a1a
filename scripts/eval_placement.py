"""Where evaluation runs, measured: ``afctl up CONFIG`` with ``eval.where = "trainer"``
(the trainer stops for each evaluation) against ``"process"`` (the evaluator process
evaluates while the trainer goes on), alternating, ``--reps`` runs of each, each in a
fresh process as a user runs it. Printed: one line per run, then one JSON line
(``{"eval_placement": ...}``) with each placement's wall times (start-up included), the
held-out accuracy of every version evaluated, and the mean wall-time saving of
``process`` against ``trainer``.

    python scripts/eval_placement.py --config examples/smollm2.toml --reps 2 --out runs/eval_placement
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLACES = ("trainer", "process")


def run_one(config: str, where: str, run_dir: Path, sets: list[str]) -> dict:
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "asyncflow.cli.main", "up", config, "--run-dir", str(run_dir), "--set", f"eval.where={where}"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout[-3000:]}")
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    return {
        "wall_s": round(wall, 1),
        "accuracy": {str(e["version"]): e["val/accuracy"] for e in evals},
        "eval_s": {str(e["version"]): round(e["val/time_s"], 1) for e in evals},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="examples/smollm2.toml")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", default="runs/eval_placement")
    p.add_argument("--set", action="append", default=[], help="another config change for every run")
    args = p.parse_args()
    out = Path(args.out).resolve()
    runs: dict[str, list[dict]] = {w: [] for w in PLACES}
    for rep in range(args.reps):
        for where in PLACES:  # alternating: a drift of the machine's speed falls on both
            r = run_one(args.config, where, out / f"{where}-{rep}", args.set)
            runs[where].append(r)
            print(f"{where:8s} run {rep}: {r['wall_s']:.1f} s, accuracy {r['accuracy']}, evaluations {r['eval_s']} s", flush=True)
    mean = {w: statistics.mean(r["wall_s"] for r in runs[w]) for w in PLACES}
    result = {
        "config": args.config,
        "reps": args.reps,
        "trainer": {
            "wall_s": [r["wall_s"] for r in runs["trainer"]],
            "wall_mean_s": round(mean["trainer"], 1),
            "runs": runs["trainer"],
        },
        "process": {
            "wall_s": [r["wall_s"] for r in runs["process"]],
            "wall_mean_s": round(mean["process"], 1),
            "runs": runs["process"],
        },
        "saving": round(1 - mean["process"] / mean["trainer"], 3),
        "same_accuracy": all(a["accuracy"] == b["accuracy"] for a, b in zip(runs["trainer"], runs["process"])),
    }
    print(json.dumps({"eval_placement": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
