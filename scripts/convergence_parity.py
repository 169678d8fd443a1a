"""Convergence parity: async (k=1) against sync over the same number of samples.

Runs a config (default examples/local.toml) in sync and in async mode for several
seeds, then prints a table of the mean reward of the first and last 10% of steps
per run and draws the reward curves side by side (afctl plot). Not a CI test: it
takes about 2 minutes per run on a 2-core machine.

    python scripts/convergence_parity.py --seeds 0 1 2 --steps 300 --out runs/parity
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import msgspec

from asyncflow.actors.launcher import run
from asyncflow.core.config import load_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/local.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="runs/parity")
    args = parser.parse_args()
    base = load_config(args.config)
    out = Path(args.out)
    rows = []
    for seed in args.seeds:
        for mode in ("sync", "async"):
            run_dir = out / f"{mode}-seed{seed}"
            if not (run_dir / "summary.json").exists():
                cfg = msgspec.structs.replace(
                    base, seed=seed,
                    data=msgspec.structs.replace(base.data, seed=seed),
                    workflow=msgspec.structs.replace(base.workflow, mode=mode, staleness=1),
                    train=msgspec.structs.replace(base.train, num_steps=args.steps, checkpoint_every=0),
                    logging=msgspec.structs.replace(base.logging, progress=False),
                )
                print(f"== {mode}, seed {seed} -> {run_dir}", flush=True)
                run(cfg, run_dir)
            s = json.loads((run_dir / "summary.json").read_text())
            rows.append((mode, seed, s["samples"], s["reward_first_10pct"], s["reward_last_10pct"], s["samples_per_s"]))
    print(f"\n{'mode':<6} {'seed':>4} {'samples':>8} {'reward first 10%':>17} {'reward last 10%':>16} {'samples/s':>10}")
    for mode, seed, samples, first, last, sps in rows:
        print(f"{mode:<6} {seed:>4} {samples:>8.0f} {first:>17.3f} {last:>16.3f} {sps:>10.1f}")
    for mode in ("sync", "async"):
        last = [r[4] for r in rows if r[0] == mode]
        print(f"{mode}: last-10% reward mean {statistics.mean(last):.3f} +- {statistics.pstdev(last):.3f} over {len(last)} seeds")
    dirs = [str(out / f"{m}-seed{s}") for s in args.seeds for m in ("sync", "async")]
    subprocess.run([sys.executable, "-m", "asyncflow.cli.main", "plot", *dirs, "--png", str(out / "parity.png"), "--smooth", "10"], check=True)
    print(f"curves: {out / 'parity.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
