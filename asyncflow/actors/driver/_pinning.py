"""Whether ``[cluster] pin_trainer_cores`` applies to this run.

Pinning gives the async trainer (the critical path of a step) cores of its own and
every other process the rest (``supervisor.pinned_cores``). On a machine the run has
to itself that keeps the trainer from ever waiting for a core; where other jobs load
the machine it hurts, because the trainer is then held to cores someone else keeps
busy. With ``cluster.pin_only_when_idle`` (the default) the driver looks first: it
pins only if the cores it may use were nearly idle as the run started (``cores_busy``
below ``IDLE_BUSY_MAX`` over ``SAMPLE_S``, read from ``/proc/stat``). The decision is
taken once, before any host starts, and kept for the run's restarts; the run prints
it and records it in summary.json (``pinned_trainer_cores``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from asyncflow.actors.driver.supervisor import pinned_cores
from asyncflow.config.run import RunConfig

IDLE_BUSY_MAX = 0.2
"""Mean busy fraction of the driver's cores above which the machine counts as loaded."""
SAMPLE_S = 0.3
"""How long the driver watches the cores before it decides."""


def read_proc_stat() -> dict[int, tuple[int, int]]:
    """core -> (busy, total) jiffies since boot, from ``/proc/stat``."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            values = [int(v) for v in fields]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            out[int(name[3:])] = (sum(values[:8]) - idle, sum(values[:8]))
    return out


def cores_busy(
    cores: set[int],
    sample_s: float = SAMPLE_S,
    read: Callable[[], dict[int, tuple[int, int]]] = read_proc_stat,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Mean busy fraction of ``cores`` over ``sample_s``."""
    before = read()
    sleep(sample_s)
    after = read()
    busy = sum(after[c][0] - before[c][0] for c in cores if c in before and c in after)
    total = sum(after[c][1] - before[c][1] for c in cores if c in before and c in after)
    return busy / total if total > 0 else 0.0


def pinning(cfg: RunConfig, busy: Callable[[set[int]], float] = cores_busy) -> tuple[int, str]:
    """(cores to pin for the trainer, a line saying so) for this run; (0, "") where
    pinning is off or does not apply (sync mode)."""
    n = cfg.cluster.pin_trainer_cores
    if n == 0 or cfg.workflow.mode != "async":
        return 0, ""
    pinned_cores(cfg, True)  # refuses more cores than the machine can give, whatever the load
    cores = set(os.sched_getaffinity(0))
    if cfg.cluster.pin_only_when_idle:
        load = busy(cores)
        if load > IDLE_BUSY_MAX:
            return 0, (
                f"cores not pinned: other jobs kept this machine's {len(cores)} cores {load:.0%} busy as the run started "
                f"(cluster.pin_trainer_cores = {n} applies only on an idle machine: cluster.pin_only_when_idle; "
                "set it to false to pin anyway)"
            )
    return n, f"cores pinned: the trainer has {n} of the {len(cores)} cores to itself (cluster.pin_trainer_cores)"
