"""Before/after of the queue host's scaling (issue 31, item 2): ``bench/queue_scale.py``
of this tree and of an older one, case by case, in one invocation.

For each (rows per step, replicas) case it runs the old tree's queue and then this
tree's, one after the other, so that load on a shared machine hits both alike. The
bench module is this tree's file run with the other tree on PYTHONPATH (``python -P``):
where the queue has no ``min_rows`` (the old tree) the emulated replicas poll as the
replica did, a partial GetBatch then up to 50 ms for the next announcement.

    python scripts/queue_scale_ab.py --before-rev 68294c9 --rows 4096,16384 --replicas 8,64,256
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _trees import run_against, tree_at

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "asyncflow" / "bench" / "queue_scale.py"


def run_case(tree: Path, rows: int, replicas: int, steps: int, train_ms: float) -> dict:
    args = ["--rows", str(rows), "--replicas", str(replicas), "--steps", str(steps), "--train-ms", str(train_ms), "--json"]
    out = run_against(tree, BENCH, args)
    return json.loads([line for line in out.splitlines() if line.startswith("[")][-1])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-rev", required=True, help="git revision of the old queue, extracted into OUT/before-tree")
    parser.add_argument("--rows", default="4096,16384", help="rows per step, comma-separated")
    parser.add_argument("--replicas", default="8,64,256", help="rollout replicas, comma-separated")
    parser.add_argument("--steps", type=int, default=3, help="steps per case (the first is warm-up)")
    parser.add_argument("--train-ms", type=float, default=200.0, help="emulated training time per step")
    parser.add_argument("--out", type=Path, default=Path("runs/queue_scale_ab"))
    args = parser.parse_args()
    before = tree_at(args.before_rev, args.out / "before-tree")
    cases = []
    print(f"{'rows':>6} {'replicas':>8} {'tree':>6} {'ctl ms/step':>11} {'ctl us/row':>10} {'gets/step':>9}", file=sys.stderr)
    for rows in [int(x) for x in args.rows.split(",") if x]:
        for replicas in [int(x) for x in args.replicas.split(",") if x]:
            case = {"rows": rows, "replicas": replicas}
            for name, tree in (("before", before), ("after", ROOT)):
                res = case[name] = run_case(tree, rows, replicas, args.steps, args.train_ms)
                print(
                    f"{rows:>6} {replicas:>8} {name:>6} {res['control_cpu_ms_per_step']:>11} "
                    f"{res['control_cpu_us_per_row']:>10} {res['rollout_gets_per_step']:>9}",
                    file=sys.stderr,
                    flush=True,
                )
            cases.append(case)
    print(json.dumps({"before_rev": args.before_rev, "steps": args.steps, "train_ms": args.train_ms, "cases": cases}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
