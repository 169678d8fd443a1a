"""The paper's table on the digital twin (docs/results.md, "Scale"): ``afctl twin`` for each model and NPU count, one after the other,
and the planner's figures at the paper-like workload with a reference beside them
(scripts/paper_table.py's). Prints each twin's progress on stderr and one JSON line.

    python scripts/twin_table.py --cases 7b:32,64,256,1024 32b:32,64,256,1024 --steps 5 --out runs/twin
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["7b:32,64,256,1024", "32b:32,64,256,1024"], help="MODEL:NPUS,NPUS,...")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hardware", default="910b")
    parser.add_argument("--out", default="runs/twin")
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
        cmd = [sys.executable, "-m", "asyncflow.cli.main", "twin", "--model", model, "--npus", str(npus)]
        cmd += ["--hardware", args.hardware, "--steps", str(args.steps), "--json", "--out", str(out / f"{model}-{npus}")]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        sys.stderr.write(done.stderr)
        if done.returncode != 0:  # kept, with its error, and the table goes on
            error = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            results.append({"model": model, "npus": npus, "failed": error})
            continue
        rep = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
        rep["planner_paper_workload_speedup"] = paper_workload_speedup(model, npus)
        rep["wall_s"] = round(sum(m["wall_s"] for m in rep["modes"].values()), 1)
        results.append(rep)
    print(
        json.dumps(
            {"steps": args.steps, "hardware": args.hardware, "cases": results, "wall_s": round(time.monotonic() - started)}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
