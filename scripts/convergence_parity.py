"""Convergence parity: async against sync on the same config, seed by seed.

Runs a config (default examples/local.toml) in sync and in async mode for several
seeds, each with ``afctl up`` in a fresh process as a user would, then prints one
line per run, the means, and one JSON line (``{"parity": ...}``) with the per-seed
last-10% reward, samples/s and final/best validation accuracy of each mode. Runs
whose RUN_DIR already has a summary.json are read, not rerun (delete them to
measure again). About 40-50 s per run on a 2-core machine.

    python scripts/convergence_parity.py --seeds 0 1 2 --out runs/parity
    python scripts/convergence_parity.py --set algorithm.clip_against=proximal --out runs/parity-prox

The JSON line is what ``scripts/results.py`` puts in docs/results.md, and what
``tests/runs/test_learning.py`` (marked slow) checks on a shorter run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def run_one(config: str, run_dir: Path, mode: str, seed: int, overrides: list[str]) -> dict:
    """``afctl up`` of one (mode, seed); its summary.json."""
    if not (run_dir / "summary.json").exists():
        sets = [
            f"seed={seed}",
            f"data.seed={seed}",
            f"workflow.mode={mode}",
            "logging.progress=false",
            "train.checkpoint_every=0",
            *overrides,
        ]
        cmd = [sys.executable, "-m", "asyncflow.cli.main", "up", config, "--run-dir", str(run_dir)]
        for s in sets:
            cmd += ["--set", s]
        print(f"== {mode}, seed {seed} -> {run_dir}", file=sys.stderr, flush=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{mode} seed {seed} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def parity(config: str, seeds: list[int], out: Path, overrides: list[str], modes: tuple[str, ...] = ("sync", "async")) -> dict:
    """Every (mode, seed) run; the figures of the JSON line."""
    result: dict = {"config": config, "seeds": seeds, "overrides": overrides}
    for mode in modes:
        runs = [run_one(config, out / f"{mode}-seed{seed}", mode, seed, overrides) for seed in seeds]
        last = [r["reward_last_10pct"] for r in runs]
        result[mode] = {
            "reward_first_10pct": [round(r["reward_first_10pct"], 4) for r in runs],
            "reward_last_10pct": [round(x, 4) for x in last],
            "reward_last_10pct_mean": round(statistics.mean(last), 4),
            "samples_per_s": [round(r["samples_per_s"], 1) for r in runs],
            "staleness_max": [r["staleness_max"] for r in runs],
            "val_final_accuracy": [r.get("val_final_accuracy") for r in runs],
            "val_best_accuracy": [r.get("val_best_accuracy") for r in runs],
            "run_dirs": [str(out / f"{mode}-seed{seed}") for seed in seeds],
        }
    if "sync" in result and "async" in result:
        result["async_minus_sync"] = round(
            result["async"]["reward_last_10pct_mean"] - result["sync"]["reward_last_10pct_mean"], 4
        )
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/local.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/parity")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key for both modes (repeatable), as afctl up --set",
    )
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--plot", action="store_true", help="also draw the reward curves into OUT/parity.png")
    args = parser.parse_args()
    out = Path(args.out)
    result = parity(args.config, args.seeds, out, args.overrides, tuple(args.modes))
    print(f"{'mode':<6} {'seed':>4} {'reward first 10%':>17} {'last 10%':>9} {'samples/s':>10} {'val final/best':>15}")
    for mode in args.modes:
        r = result[mode]
        for i, seed in enumerate(args.seeds):
            val = f"{r['val_final_accuracy'][i]}/{r['val_best_accuracy'][i]}"
            print(
                f"{mode:<6} {seed:>4} {r['reward_first_10pct'][i]:>17.3f} {r['reward_last_10pct'][i]:>9.3f} "
                f"{r['samples_per_s'][i]:>10.1f} {val:>15}"
            )
        print(f"{mode}: last-10% reward mean {r['reward_last_10pct_mean']:.3f} over {len(args.seeds)} seeds")
    if args.plot:
        dirs = [d for mode in args.modes for d in result[mode]["run_dirs"]]
        subprocess.run(
            [sys.executable, "-m", "asyncflow.cli.main", "plot", *dirs, "--png", str(out / "parity.png"), "--smooth", "10"],
            check=True,
        )
    print(json.dumps({"parity": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
