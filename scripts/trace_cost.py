"""The collector's trace cost (issue 31, item 3): CPU and peak memory for N span events, with a live
write of trace.json every K events (about every ``logging.trace_every_s`` at scale), per million events.
Runs against the tree on PYTHONPATH, so that an older collector can be measured the same way:

    python -P scripts/trace_cost.py --events 200000 --json                 # this tree
    PYTHONPATH=<old tree> python -P scripts/trace_cost.py --events 200000  # another one

Each measurement is one process: the peak RSS is the process's own. ``scripts/trace_cost_ab.py`` runs
both trees at several run lengths, side by side."""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from asyncflow.actors.driver.collector import CollectorActor
from asyncflow.actors.runtime import messages
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig

BATCH = 500  # events per Spans message, as a busy role sends them


def measure(events: int, every: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix="af-trace-cost-")
    ctx = ActorContext("collector", TransportConfig(scheme="inproc"))
    collector = CollectorActor(ctx, run_dir=run_dir, num_steps=2, progress=False)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu_s = longest_s = 0.0  # longest_s: the longest the actor was busy with one message or write
    n = 0
    while n < events:
        msg = messages.Spans(
            role=f"rollout.{n % 7}",
            pid=1,
            names=["generate"] * BATCH,
            starts_s=[1000 + 1e-3 * (n + i) for i in range(BATCH)],
            durations_s=[1e-4] * BATCH,
            versions=[0] * BATCH,
            counters={"version": 0},
        )
        t = time.process_time()
        collector.handle(msg, None)  # the bounded collector appends a full chunk to trace.json here
        took = time.process_time() - t
        cpu_s += took
        longest_s = max(longest_s, took)
        n += BATCH
        if n % every == 0:
            t = time.process_time()
            collector.write_trace(os.path.join(run_dir, "trace.json"))
            took = time.process_time() - t
            cpu_s += took
            longest_s = max(longest_s, took)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "events": events,
        "write_every": every,
        "cpu_s": round(cpu_s, 3),
        "cpu_s_per_million": round(cpu_s / events * 1e6, 2),
        "longest_call_s": round(longest_s, 4),
        "peak_rss_growth_mb": round((rss1 - rss0) / 1024, 1),
        "trace_mb": round(os.path.getsize(os.path.join(run_dir, "trace.json")) / 2**20, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="span events in the run")
    parser.add_argument("--every", type=int, default=20_000, help="events between two live writes of trace.json")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    if args.events % BATCH or args.every % BATCH:
        parser.error(f"--events and --every must be multiples of {BATCH} (the events of one Spans message)")
    r = measure(args.events, args.every)
    print(
        f"{r['events']} events: collector CPU (spans in + writes) {r['cpu_s']:.2f} s ({r['cpu_s_per_million']:.1f} s per "
        f"million); the longest call {r['longest_call_s']:.3f} s; peak RSS growth {r['peak_rss_growth_mb']:.0f} MB"
    )
    if args.json:
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
