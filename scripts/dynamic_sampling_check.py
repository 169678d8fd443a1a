"""Dynamic sampling: trainer steps to reach the baseline's reward, with and without.

For each seed, runs a config (default examples/local.toml) twice with ``afctl up``
(``scripts/convergence_parity.py``'s ``run_one``): as it is, and with
``algorithm.dynamic_sampling = true`` (plus ``--oversample`` and ``--max-rounds``,
the refill rounds). Runs whose RUN_DIR already has a summary.json are read, not rerun.

The reward of a step is that of every response the step sampled: ``reward_mean``
without dynamic sampling, ``sampled_reward_mean`` with it (all the step's groups,
dropped ones included, not only the informative ones trained on, whose mean is
biased). Curves are smoothed by a trailing mean of ``--window`` steps. The target of
a seed is the baseline's smoothed reward at its last step (examples/local.toml: step
300); steps-to-reward is the first step whose smoothed reward reaches the target
(the baseline reaches it by its last step by definition; a run that never does
counts as its number of steps). Prints one line per seed and one JSON line.

Two figures over the seeds: the mean of the seeds' steps-to-reward (each seed against
its own baseline: the crossing of one noisy curve with one noisy end point), and the
steps-to-reward of the mean curves (the seeds' smoothed curves averaged step by step,
the target being the mean baseline curve at its last step: "the reward the baseline
reaches at its last step", with the seed noise averaged out before the crossing).

    python scripts/dynamic_sampling_check.py --seeds 0 1 2 --out runs/dynsample
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convergence_parity import run_one  # noqa: E402


def metrics(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl, step by step."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sorted(lines, key=lambda m: m["step"])


def rewards(run_dir: Path) -> list[float]:
    """The reward of every response each step sampled, step by step."""
    return [m.get("sampled_reward_mean", m["reward_mean"]) for m in metrics(run_dir)]


def mean_staleness(run_dir: Path) -> float:
    """The run's mean over steps of the trained rows' mean staleness (trainer version - generating version)."""
    return round(statistics.mean(m["staleness_mean"] for m in metrics(run_dir)), 3)


def batch_figures(run_dir: Path) -> dict:
    """Per run: the mean filtered fraction and refill rounds per step, and the steps that
    trained fewer groups than the fullest step did (short of informative groups)."""
    lines = metrics(run_dir)
    kept = [m["kept_groups"] for m in lines]
    return {
        "filtered_frac_mean": round(statistics.mean(m["filtered_frac"] for m in lines), 3),
        "refill_rounds_mean": round(statistics.mean(m.get("refill_rounds", 0.0) for m in lines), 3),
        "short_steps": sum(k < max(kept) for k in kept),
    }


def smoothed(values: list[float], window: int) -> list[float]:
    """Trailing mean over up to ``window`` steps."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def mean_curve(curves: list[list[float]]) -> list[float]:
    """Step by step mean of equally long curves (the seeds' smoothed rewards)."""
    return [statistics.mean(values) for values in zip(*curves, strict=True)]


def steps_to(curve: list[float], target: float, window: int) -> int:
    """Trainer steps (1-based count) until the smoothed curve first reaches ``target``,
    counting only full windows; ``len(curve)`` if it never does."""
    for i in range(window - 1, len(curve)):
        if curve[i] >= target - 1e-12:
            return i + 1
    return len(curve)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/local.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/dynsample")
    parser.add_argument("--mode", default="async", choices=["sync", "async"])
    parser.add_argument("--oversample", type=float, default=2.0, help="algorithm.dynamic_sampling_oversample")
    parser.add_argument(
        "--max-rounds", type=int, default=4, help="algorithm.dynamic_sampling_max_rounds (refill rounds; 0: no refill)"
    )
    parser.add_argument("--window", type=int, default=25, help="steps in the trailing mean of the reward")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="for both runs")
    args = parser.parse_args()
    out = Path(args.out)
    dynamic = [
        "algorithm.dynamic_sampling=true",
        f"algorithm.dynamic_sampling_oversample={args.oversample}",
        f"algorithm.dynamic_sampling_max_rounds={args.max_rounds}",
    ]
    rows = []
    base_curves: list[list[float]] = []
    dyn_curves: list[list[float]] = []
    for seed in args.seeds:  # the two runs of a seed one after the other: side by side on a loaded machine
        base_dir, dyn_dir = out / f"base-seed{seed}", out / f"dynamic-x{args.oversample:g}-r{args.max_rounds}-seed{seed}"
        base_summary = run_one(args.config, base_dir, args.mode, seed, args.overrides)
        dyn_summary = run_one(args.config, dyn_dir, args.mode, seed, [*args.overrides, *dynamic])
        base, dyn = smoothed(rewards(base_dir), args.window), smoothed(rewards(dyn_dir), args.window)
        base_curves.append(base)
        dyn_curves.append(dyn)
        target = base[-1]
        rows.append(
            {
                "seed": seed,
                "target": round(target, 4),
                "base_steps": steps_to(base, target, args.window),
                "dynamic_steps": steps_to(dyn, target, args.window),
                "dynamic_final": round(dyn[-1], 4),
                "base_samples_per_s": round(base_summary["samples_per_s"], 1),
                "dynamic_samples_per_s": round(dyn_summary["samples_per_s"], 1),
                "base_wall_s": round(base_summary["wall_s"], 1),
                "dynamic_wall_s": round(dyn_summary["wall_s"], 1),
                "base_staleness_mean": mean_staleness(base_dir),
                "dynamic_staleness_mean": mean_staleness(dyn_dir),
                **batch_figures(dyn_dir),
            }
        )
    print(f"{'seed':>4} {'target':>7} {'steps base':>10} {'steps dyn':>9} {'final base':>10} {'final dyn':>9}")
    for r in rows:
        print(
            f"{r['seed']:>4} {r['target']:>7.3f} {r['base_steps']:>10} {r['dynamic_steps']:>9} "
            f"{r['target']:>10.3f} {r['dynamic_final']:>9.3f}"
        )
    base_mean = statistics.mean(r["base_steps"] for r in rows)
    base_curve, dyn_curve = mean_curve(base_curves), mean_curve(dyn_curves)
    curve_target = base_curve[-1]
    curve_base_steps = steps_to(base_curve, curve_target, args.window)
    curve_dyn_steps = steps_to(dyn_curve, curve_target, args.window)
    dyn_mean = statistics.mean(r["dynamic_steps"] for r in rows)
    result = {
        "config": args.config,
        "mode": args.mode,
        "oversample": args.oversample,
        "max_rounds": args.max_rounds,
        "window": args.window,
        "overrides": args.overrides,
        "seeds": rows,
        "base_steps_mean": round(base_mean, 1),
        "dynamic_steps_mean": round(dyn_mean, 1),
        "fewer_steps": round(1 - dyn_mean / base_mean, 4),
        "mean_curve": {
            "target": round(curve_target, 4),
            "base_steps": curve_base_steps,
            "dynamic_steps": curve_dyn_steps,
            "fewer_steps": round(1 - curve_dyn_steps / curve_base_steps, 4),
            "dynamic_final": round(dyn_curve[-1], 4),
        },
    }
    print(f"steps to the baseline's final reward: {base_mean:.1f} -> {dyn_mean:.1f} ({result['fewer_steps']:.1%} fewer)")
    mc = result["mean_curve"]
    print(
        f"mean curves over {len(rows)} seeds: target {mc['target']:.3f}, steps {curve_base_steps} -> {curve_dyn_steps} "
        f"({mc['fewer_steps']:.1%} fewer); final {mc['target']:.3f} -> {mc['dynamic_final']:.3f}"
    )
    print(json.dumps({"dynamic_sampling": result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
