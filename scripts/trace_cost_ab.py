"""Before/after of the collector's trace cost (issue 31, item 3): ``scripts/trace_cost.py`` against an
older tree and this one, at several run lengths, in one invocation. The old collector kept every event
in memory and rewrote the whole trace.json at each live write, so its CPU and memory per event grow with
the run; the bounded one appends chunks, so both stay flat.

    python scripts/trace_cost_ab.py --before-rev 68294c9 --events 100000,400000
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from _trees import ROOT, run_against, tree_at

SCRIPT = ROOT / "scripts" / "trace_cost.py"


def run_case(tree: Path, events: int, every: int) -> dict:
    return json.loads(run_against(tree, SCRIPT, ["--events", str(events), "--every", str(every), "--json"]).splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before-rev", required=True, help="git revision of the old collector, extracted into OUT/before-tree")
    parser.add_argument("--events", default="100000,400000", help="run lengths in span events, comma-separated")
    parser.add_argument("--every", type=int, default=20_000, help="events between two live writes")
    parser.add_argument("--out", type=Path, default=Path("runs/trace_cost_ab"))
    args = parser.parse_args()
    before = tree_at(args.before_rev, args.out / "before-tree")
    cases = []
    print(f"{'events':>8} {'tree':>6} {'CPU s/M':>8} {'longest s':>12} {'peak RSS MB':>11}", file=sys.stderr)
    for events in [int(x) for x in args.events.split(",") if x]:
        case = {"events": events}
        for name, tree in (("before", before), ("after", ROOT)):
            r = case[name] = run_case(tree, events, args.every)
            print(
                f"{events:>8} {name:>6} {r['cpu_s_per_million']:>8} {r['longest_call_s']:>12} {r['peak_rss_growth_mb']:>11}",
                file=sys.stderr,
                flush=True,
            )
        cases.append(case)
    print(json.dumps({"before_rev": args.before_rev, "every": args.every, "cases": cases}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
