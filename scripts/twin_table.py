"""The paper's table on the digital twin (docs/results.md, "Scale"): ``afctl twin`` for each model and NPU count, one after the other,
and the planner's figures at the paper-like workload with a reference beside them
(scripts/paper_table.py's). With ``--linearity``, the paper's scaling rows too: async alone at two NPU
counts with a batch that grows with the cluster (``--linearity-batch``), and its linearity, measured and
predicted: (samples/s at the larger / at the smaller) / (larger / smaller NPUs), 1.0 being linear.
Prints each twin's progress on stderr and one JSON line.

    python scripts/twin_table.py --cases 7b:32,64,256,1024 32b:32,64,256,1024 --steps 5 --out runs/twin \
        --linearity 7b:64,1024 32b:64,1024 --linearity-batch 1024x16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def paper_workload_speedup(model: str, npus: int) -> float:
    """The planner's async speedup over the best sync plan at scripts/paper_table.py's
    workload (256 x 8, prompts 1,024, responses 2,048 capped at 8,192, a reference)."""
    from asyncflow.planner.cost import Workload
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.models import PRESETS
    from asyncflow.planner.search import search, speedup

    return speedup(search(PRESETS[model], get_hardware("910b"), Workload(), npus))


def run_twin(model: str, npus: int, hardware: str, steps: int, out: Path, extra: list[str]) -> dict:
    """One ``afctl twin``: its JSON, or ``failed`` with its last error line (the table goes on)."""
    cmd = [sys.executable, "-m", "asyncflow.cli.main", "twin", "--model", model, "--npus", str(npus)]
    cmd += ["--hardware", hardware, "--steps", str(steps), "--json", "--out", str(out), *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return {"model": model, "npus": npus, "failed": error}
    rep = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    rep["wall_s"] = round(sum(m["wall_s"] for m in rep["modes"].values()), 1)
    return rep


def linearity_row(model: str, small: dict, large: dict) -> dict:
    """Async's linearity from ``small`` to ``large`` NPUs, on the twin and by the planner."""
    if "failed" in small or "failed" in large:
        return {"model": model, "failed": small.get("failed") or large.get("failed")}
    a, b = small["modes"]["async"], large["modes"]["async"]
    scale = large["npus"] / small["npus"]
    return {
        "model": model,
        "npus": [small["npus"], large["npus"]],
        "batch": f"{small['workload']['prompts_per_step']}x{small['workload']['group']}",
        "measured_samples_per_s": [a["measured_samples_per_s"], b["measured_samples_per_s"]],
        "predicted_samples_per_s": [a["predicted_samples_per_s"], b["predicted_samples_per_s"]],
        "linearity": b["measured_samples_per_s"] / a["measured_samples_per_s"] / scale,
        "predicted_linearity": b["predicted_samples_per_s"] / a["predicted_samples_per_s"] / scale,
        "wall_s": small["wall_s"] + large["wall_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="*", default=["7b:32,64,256,1024", "32b:32,64,256,1024"], help="MODEL:NPUS,NPUS,...")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hardware", default="910b")
    parser.add_argument("--out", default="runs/twin")
    parser.add_argument("--linearity", nargs="*", default=[], help="MODEL:SMALL,LARGE: async's scaling between two NPU counts")
    parser.add_argument("--linearity-batch", default="1024x16", help="PROMPTSxGROUP of the linearity rows' steps")
    args = parser.parse_args()
    cases = [(m, int(n)) for spec in args.cases for m, ns in [spec.split(":")] for n in ns.split(",")]
    out = Path(args.out)
    results = []
    started = time.monotonic()
    for i, (model, npus) in enumerate(cases, 1):
        print(
            f"== twin {i}/{len(cases)}: {model} on {npus} {args.hardware} ({time.monotonic() - started:.0f} s so far)",
            file=sys.stderr,
        )
        rep = run_twin(model, npus, args.hardware, args.steps, out / f"{model}-{npus}", [])
        if "failed" not in rep:
            rep["planner_paper_workload_speedup"] = paper_workload_speedup(model, npus)
        results.append(rep)
    prompts, group = args.linearity_batch.split("x")
    scaling = []
    for spec in args.linearity:
        model, counts = spec.split(":")
        small, large = (int(n) for n in counts.split(","))
        runs = []
        for npus in (small, large):
            print(f"== linearity: {model} on {npus} {args.hardware}, {args.linearity_batch}, async", file=sys.stderr)
            # the emulated step in proportion to the rows (2 s for the 256 x 8 of the cases above)
            step_s = 2.0 * int(prompts) * int(group) / (256 * 8)
            extra = ["--modes", "async", "--prompts", prompts, "--group", group, "--step-s", f"{step_s:g}"]
            runs.append(run_twin(model, npus, args.hardware, args.steps, out / f"lin-{model}-{npus}", extra))
        scaling.append(linearity_row(model, *runs))
    print(
        json.dumps(
            {
                "steps": args.steps,
                "hardware": args.hardware,
                "cases": results,
                "linearity": scaling,
                "wall_s": round(time.monotonic() - started),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
