"""The collector's trace cost: CPU and peak memory for 200,000 span events with a live write every 20,000
(issue 31, item 3). Run against a tree: PYTHONPATH=<tree> python -P scripts/trace_cost.py"""

import os
import resource
import tempfile
import time

from asyncflow.actors import messages
from asyncflow.actors.collector import CollectorActor
from asyncflow.core.actor import ActorContext
from asyncflow.core.transport import TransportConfig

d = tempfile.mkdtemp()
c = CollectorActor(ActorContext("collector", TransportConfig(scheme="inproc")), run_dir=d, num_steps=2, progress=False)
N, B, EVERY = 200_000, 500, 20_000  # events, per Spans, a live write every 20k events (~30 s at scale)
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
write_s = 0.0
n = 0
while n < N:
    msg = messages.Spans(
        role=f"rollout.{n % 7}",
        pid=1,
        names=["generate"] * B,
        starts_s=[1000 + 1e-3 * (n + i) for i in range(B)],
        durations_s=[1e-4] * B,
        versions=[0] * B,
        counters={"version": 0},
    )
    t = time.process_time()
    c.handle(msg, None)
    write_s += time.process_time() - t
    n += B
    if n % EVERY == 0:
        t = time.process_time()
        c.write_trace(os.path.join(d, "trace.json"))
        write_s += time.process_time() - t
rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(
    f"{N} events: collector CPU (spans in + writes) {write_s:.2f} s ({write_s / N * 1e6:.1f} s per million); "
    f"peak RSS growth {(rss1 - rss0) / 1024:.0f} MB ({(rss1 - rss0) / 1024 / N * 1e6:.0f} MB per million)"
)
