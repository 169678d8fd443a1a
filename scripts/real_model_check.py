"""A real pretrained model learns: examples/smollm2.toml, async and sync, several seeds.

Each (mode, seed) is one ``afctl up examples/smollm2.toml`` in a fresh process, as a user
runs it (runs whose RUN_DIR already holds a summary.json are read, not rerun). The config
evaluates the starting weights (``eval.at_start``) and every ``eval.every_steps`` steps,
greedy, on its held-out prompts. Printed: one line per run, then one JSON line
(``{"real_model": ...}``) with each run's held-out accuracy at the start, at the end and
at its best, its wall time (start-up and evaluations included), samples/s, and whether it
met the target: final accuracy at least ``--factor`` x the start and at least
``--floor``, within ``--minutes`` of wall time.

Needs the model directory the config names: ``afctl model import-gguf smollm2
models/smollm2-135m`` (README.md, "A real pretrained model").

    python scripts/real_model_check.py --seeds 0 1 --modes async sync --out runs/real_model
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convergence_parity import run_one  # noqa: E402  (a sibling script)


def figures(summary: dict, run_dir: Path, factor: float, floor: float, minutes: float) -> dict:
    """One run's figures from its summary.json and metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(int(r["step"]) + 1, round(r["val/accuracy"], 4)) for r in rows if "val/accuracy" in r]
    start, final = summary.get("val_start_accuracy"), summary.get("val_final_accuracy")
    met = (
        start is not None
        and final is not None
        and final >= factor * start
        and final >= floor
        and summary["wall_s"] <= minutes * 60
    )
    return {
        "val_start_accuracy": start,
        "val_final_accuracy": final,
        "val_best_accuracy": summary.get("val_best_accuracy"),
        "val_curve": curve,
        "steps": summary["steps"],
        "wall_s": round(summary["wall_s"], 1),
        "samples_per_s": round(summary["samples_per_s"], 3),
        "reward_first_10pct": round(summary["reward_first_10pct"], 4),
        "reward_last_10pct": round(summary["reward_last_10pct"], 4),
        "met_target": bool(met),
        "run_dir": str(run_dir),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/smollm2.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--modes", nargs="+", default=["async", "sync"], choices=["sync", "async"])
    parser.add_argument("--out", default="runs/real_model")
    parser.add_argument("--factor", type=float, default=3.0, help="target: final accuracy >= factor x the start's")
    parser.add_argument("--floor", type=float, default=0.30, help="target: final accuracy >= this")
    parser.add_argument("--minutes", type=float, default=30.0, help="target: wall time of a run")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="a config key (repeatable)"
    )
    args = parser.parse_args()
    out = Path(args.out)
    result: dict = {
        "config": args.config,
        "seeds": args.seeds,
        "overrides": args.overrides,
        "target": {"factor": args.factor, "floor": args.floor, "minutes": args.minutes},
    }
    print(f"{'mode':<6} {'seed':>4} {'start':>6} {'final':>6} {'best':>6} {'minutes':>8} {'samples/s':>10}  target")
    runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    for seed in args.seeds:  # seed by seed, both modes: a check cut short still compares the modes
        for mode in args.modes:
            run_dir = out / f"{mode}-seed{seed}"
            summary = run_one(args.config, run_dir, mode, seed, args.overrides)
            f = figures(summary, run_dir, args.factor, args.floor, args.minutes)
            runs[mode].append(f)
            print(
                f"{mode:<6} {seed:>4} {f['val_start_accuracy']:>6.3f} {f['val_final_accuracy']:>6.3f} "
                f"{f['val_best_accuracy']:>6.3f} {f['wall_s'] / 60:>8.1f} {f['samples_per_s']:>10.2f}  "
                f"{'met' if f['met_target'] else 'missed'}",
                flush=True,
            )
    result.update(runs)
    print(json.dumps({"real_model": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
