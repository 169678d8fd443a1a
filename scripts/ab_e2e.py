"""Before/after of a code change: ``afctl bench e2e`` of two source trees, interleaved.

A code change cannot run side by side with itself in one ``bench e2e``; this runs
the two trees' ``bench e2e`` alternately (before, after, before, after...) in one
invocation, each with its own ``examples/local.toml`` (or ``--config`` relative to
each tree), so load changes on a shared machine hit both alike. Prints the mean
samples/s of sync and async per tree, their ratios, the ms per step of every role's
busy time (from each run's trace.json, ``bench/_breakdown.py``) and one JSON line.

    python scripts/ab_e2e.py --before-rev <base commit> --rounds 2 --steps 100
    python scripts/ab_e2e.py --before /some/old/tree --after . --rounds 2 --steps 100
    python scripts/ab_e2e.py --before-rev <rev> --queue-rounds 200   # and `afctl bench queue` of each tree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncflow.bench._breakdown import breakdown  # noqa: E402


def run_tree(tree: Path, config: str, steps: int, out: Path, sets: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "asyncflow.cli.main",
        "bench",
        "e2e",
        "--config",
        config,
        "--steps",
        str(steps),
        "--json",
        "--out",
        str(out),
        *[arg for s in sets for arg in ("--set", s)],
    ]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: bench e2e failed ({done.returncode}):\n{done.stdout[-3000:]}")
    result = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    for mode in ("sync", "async"):
        b = breakdown(json.loads((out / mode / "trace.json").read_text()), steps)
        result[f"{mode}_busy_ms"] = {role: round(r["busy_ms"], 2) for role, r in b.items()}
        result[f"{mode}_cpu_ms"] = {role: round(r["cpu_ms"], 2) for role, r in b.items()}
        result[f"{mode}_activities_ms"] = {role: {a: round(ms, 2) for a, ms in r["activities"].items()} for role, r in b.items()}
    result["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return result


def run_queue(tree: Path, rounds: int) -> dict:
    """``afctl bench queue`` of one tree (round trip and bandwidth of the TransferQueue)."""
    cmd = [sys.executable, "-m", "asyncflow.cli.main", "bench", "queue", "--rounds", str(rounds), "--json"]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: bench queue failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="source tree of the old code")
    parser.add_argument("--before-rev", help="or a git revision of this repository, extracted into OUT/before-tree")
    parser.add_argument("--after", default=ROOT, type=Path, help="source tree of the new code (default: this one)")
    parser.add_argument("--config", default="examples/local.toml", help="relative to each tree")
    parser.add_argument(
        "--before-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="bench e2e --set for the before runs (the tree's bench e2e must take --set)",
    )
    parser.add_argument(
        "--after-set", action="append", default=[], metavar="KEY=VALUE", help="bench e2e --set for the after runs"
    )
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/ab"))
    parser.add_argument(
        "--queue-rounds",
        type=int,
        default=0,
        help="also run each tree's `afctl bench queue --rounds N` in every round, after its bench e2e (0: not)",
    )
    args = parser.parse_args()
    if args.before_rev:
        tree = (args.out / "before-tree").resolve()
        if not (tree / "asyncflow").is_dir():
            tree.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(["git", "archive", args.before_rev], cwd=ROOT, stdout=subprocess.PIPE, check=True)
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        args.before = tree
    if args.before is None:
        parser.error("give --before TREE or --before-rev REV")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for name, tree in trees.items():
            print(f"== round {r + 1}: {name} ({tree})", file=sys.stderr, flush=True)
            sets = args.before_set if name == "before" else args.after_set
            runs[name].append(run_tree(tree, args.config, args.steps, (args.out / f"{name}-{r}").resolve(), sets))
            if args.queue_rounds:
                runs[name][-1]["queue"] = run_queue(tree, args.queue_rounds)
    summary: dict = {
        "steps": args.steps,
        "rounds": args.rounds,
        "config": args.config,
        "before_rev": args.before_rev,
        "before_set": args.before_set,
        "after_set": args.after_set,
        "load_avg_1m": [x["load_avg_1m"] for name in runs for x in runs[name]],
    }
    for name, results in runs.items():
        summary[name] = {
            "sync_samples_per_s": round(statistics.mean(x["sync_samples_per_s"] for x in results), 1),
            "async_samples_per_s": round(statistics.mean(x["async_samples_per_s"] for x in results), 1),
            "async_pipeline_efficiency": round(statistics.mean(x["async_pipeline_efficiency"] for x in results), 3),
            **{
                f"{mode}_{what}_ms": {
                    role: round(statistics.mean(x[f"{mode}_{what}_ms"].get(role, 0.0) for x in results), 2)
                    for role in results[0][f"{mode}_{what}_ms"]
                }
                for mode in ("sync", "async")
                for what in ("busy", "cpu")
            },
            **{
                f"{mode}_activities_ms": {
                    role: {
                        a: round(statistics.mean(x[f"{mode}_activities_ms"].get(role, {}).get(a, 0.0) for x in results), 2)
                        for a in sorted({a for x in results for a in x[f"{mode}_activities_ms"].get(role, {})})
                    }
                    for role in results[0][f"{mode}_activities_ms"]
                }
                for mode in ("sync", "async")
            },
            "each": [
                {
                    **{k: x[k] for k in ("sync_samples_per_s", "async_samples_per_s", "load_avg_1m")},
                    **(
                        {"queue_round_trip_ms": x["queue"]["round_trip_ms"], "queue_samples_per_s": x["queue"]["samples_per_s"]}
                        if "queue" in x
                        else {}
                    ),
                }
                for x in results
            ],
        }
        if args.queue_rounds:
            summary[name]["queue_round_trip_ms"] = round(statistics.mean(x["queue"]["round_trip_ms"] for x in results), 3)
            summary[name]["queue_samples_per_s"] = round(statistics.mean(x["queue"]["samples_per_s"] for x in results), 1)
    for mode in ("sync", "async"):
        key = f"{mode}_samples_per_s"
        summary[f"{mode}_after_over_before"] = round(summary["after"][key] / summary["before"][key], 3)
    if args.queue_rounds:
        summary["queue_round_trip_after_over_before"] = round(
            summary["after"]["queue_round_trip_ms"] / summary["before"]["queue_round_trip_ms"], 3
        )
    b, a = summary["before"], summary["after"]
    print(f"{'':<28}{'before':>10}{'after':>10}")
    for key in ("sync_samples_per_s", "async_samples_per_s", "async_pipeline_efficiency", "queue_round_trip_ms"):
        if key in a:
            print(f"{key:<28}{b[key]:>10.3f}{a[key]:>10.3f}")
    for mode in ("sync", "async"):
        for role in a[f"{mode}_busy_ms"]:
            print(
                f"{mode + ' busy ms/step ' + role:<28}{b[f'{mode}_busy_ms'].get(role, 0.0):>10.2f}"
                f"{a[f'{mode}_busy_ms'][role]:>10.2f}"
            )
    print(
        f"after/before samples/s: sync {summary['sync_after_over_before']:.2f}x, async {summary['async_after_over_before']:.2f}x"
    )
    print(json.dumps({"ab": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
