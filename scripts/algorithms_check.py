"""The algorithms side by side: examples/local.toml with each policy loss / advantage
estimator of the registry that practitioners pick between, over several seeds, each run
an ``afctl up`` in a fresh process (``convergence_parity.run_one``). Prints one line per
run and one JSON line (``{"algorithms": ...}``: per algorithm and seed the last-10%
reward, the held-out greedy accuracy and samples/s), which ``scripts/results.py``
(section ``algorithms``) puts in docs/results.md. Runs whose RUN_DIR already has a
summary.json are read, not rerun. About 50 s per run on 2 cores.

    python scripts/algorithms_check.py --seeds 0 1 2 --out runs/algorithms
    python scripts/algorithms_check.py --steps 150 ...        # shorter runs (say so where they are shown)
    python scripts/algorithms_check.py --config examples/smollm2.toml --rollout-seed ...   # the real model

``--rollout-seed`` sets ``rollout.engine.seed`` to each run's seed as well (the global ``seed`` does not
reach the rollout's sampler; docs/config.md): without it the seeds of a run differ only in their data.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convergence_parity import run_one  # noqa: E402

ALGORITHMS: dict[str, list[str]] = {
    "GRPO": [],  # the example as shipped: group-normalised advantages, PPO clip 0.2, token-mean
    "GSPO": ["algorithm.loss.name=gspo", "algorithm.loss.clip_low=0.0003", "algorithm.loss.clip_high=0.0004"],
    "CISPO": ["algorithm.loss.name=cispo", "algorithm.loss.clip_low=1.0", "algorithm.loss.clip_high=4.0"],
    "Dr. GRPO": ["algorithm.std_normalize=false", "algorithm.loss.agg=seq-mean-token-sum-norm"],
    "RLOO": ["algorithm.name=rloo"],
    "REINFORCE++": ["algorithm.name=reinforce_plus_plus"],
    "REINFORCE++-baseline": ["algorithm.name=reinforce_plus_plus_baseline"],
}
"""Each algorithm's keys over examples/local.toml (each loss at its paper's clip range)."""


def table_lines(a: dict) -> list[str]:
    """The markdown table of one run of this script (its JSON line's ``algorithms`` object)."""
    out = [
        "| algorithm | keys | reward, last 10% (per seed) | mean | held-out greedy accuracy, final (per seed) | mean "
        "| samples/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, x in a["algorithms"].items():
        keys = ", ".join(f"`{k}`" for k in x["keys"]) or "(as shipped)"
        per_seed = " / ".join(f"{v:.3f}" for v in x["reward_last_10pct"])
        acc = " / ".join("-" if v is None else f"{v:.2f}" for v in x["val_final_accuracy"])
        acc_mean = "-" if x["val_final_accuracy_mean"] is None else f"{x['val_final_accuracy_mean']:.3f}"
        out.append(
            f"| {name} | {keys} | {per_seed} | **{x['reward_last_10pct_mean']:.3f}** | {acc} | {acc_mean} | "
            f"{x['samples_per_s_mean']:.{0 if x['samples_per_s_mean'] >= 100 else 2}f} |"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/local.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=0, help="train.num_steps (0: the config's)")
    parser.add_argument("--only", nargs="+", choices=sorted(ALGORITHMS), help="these algorithms alone")
    parser.add_argument("--rollout-seed", action="store_true", help="rollout.engine.seed = the run's seed too (its sampler)")
    parser.add_argument("--out", default="runs/algorithms")
    args = parser.parse_args()
    out = Path(args.out)
    steps = [f"train.num_steps={args.steps}"] if args.steps else []
    result: dict = {
        "config": args.config,
        "seeds": args.seeds,
        "steps": args.steps or None,
        "rollout_seed": args.rollout_seed,
        "algorithms": {},
    }
    for name, keys in ALGORITHMS.items():
        if args.only and name not in args.only:
            continue
        slug = name.lower().replace(". ", "_").replace("+", "p").replace("-", "_")
        runs = [
            run_one(
                args.config,
                out / f"{slug}-seed{seed}",
                "async",
                seed,
                [*keys, *steps, *([f"rollout.engine.seed={seed}"] if args.rollout_seed else [])],
            )
            for seed in args.seeds
        ]
        last = [r["reward_last_10pct"] for r in runs]
        acc = [r.get("val_final_accuracy") for r in runs]
        result["algorithms"][name] = {
            "keys": keys,
            "reward_last_10pct": [round(x, 4) for x in last],
            "reward_last_10pct_mean": round(statistics.mean(last), 4),
            "val_start_accuracy": [r.get("val_start_accuracy") for r in runs],
            "val_final_accuracy": acc,
            "val_final_accuracy_mean": round(statistics.mean(a for a in acc if a is not None), 4)
            if any(a is not None for a in acc)
            else None,
            "samples_per_s": [round(r["samples_per_s"], 2) for r in runs],
            "samples_per_s_mean": round(statistics.mean(r["samples_per_s"] for r in runs), 2),
            "wall_s": round(sum(r["wall_s"] for r in runs)),
        }
        r = result["algorithms"][name]
        print(
            f"{name:<22} last-10% reward {r['reward_last_10pct_mean']:.3f} {r['reward_last_10pct']}  held-out accuracy "
            f"{r['val_final_accuracy']}  samples/s {r['samples_per_s_mean']:.0f}",
            file=sys.stderr,
            flush=True,
        )
    print(json.dumps({"algorithms": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
