"""How a process host died, in words a user can act on: an exit code, a signal, or the
kernel's out-of-memory killer.

A host killed by SIGKILL (exit code -9) was killed either by the kernel for lack of
memory or by someone's ``kill -9``. The kernel's record of its OOM kills is readable
where ``dmesg`` usually is not: the ``oom_kill`` count of the memory cgroup, in
cgroup v2's ``memory.events`` and cgroup v1's ``memory.oom_control``. The hosts run in
the driver's cgroup (or below it: the count includes the cgroups below), so the
supervisor reads that count at each look while its hosts are alive (``OomCount.read``)
and again once it finds one dead: a count that grew in between names the death as an
OOM kill, with the run's memory estimate for the host (the preflight's) and what to change.

Invariants: ``death_words`` never raises; a count that cannot be read says so (it
cannot tell), never guesses.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncflow.config.run import RunConfig

_GIB = 1 << 30

OOM_FILES = ("memory.events", "memory.oom_control")
"""cgroup v2's file, then v1's: each has an ``oom_kill N`` line."""

FIX_BY_ROLE = {
    "trainer": "a smaller train.engine.micro_batch_size, a smaller model, or bfloat16 weights",
    "trainer_rank": "a smaller train.engine.micro_batch_size, a smaller model, or bfloat16 weights",
    "rollout": "fewer rollout.num_replicas, a smaller rollout.engine.kv_cache_bytes, or a smaller model",
    "reward_model": "fewer reward_model.num_replicas, or a smaller reward model",
}
FIX_OTHERWISE = "fewer replicas (rollout.num_replicas), a smaller batch (train.engine.micro_batch_size), or a smaller model"


def cgroup_oom_file(proc_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> Path | None:
    """The file holding the ``oom_kill`` count of the memory cgroup that ``proc_cgroup`` (the
    text of ``/proc/PID/cgroup``) names, or None when there is none to read. cgroup v1's
    ``memory`` hierarchy first (``N:memory:/path``), else the v2 one (``0::/path``, at the
    root or under ``unified/`` in a hybrid layout)."""
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            v1 = path
        elif hier == "0" and controllers == "":
            v2 = path
    candidates = []
    if v1 is not None:
        candidates.append(root / "memory" / v1.lstrip("/") / "memory.oom_control")
    if v2 is not None:
        candidates += [root / v2.lstrip("/") / "memory.events", root / "unified" / v2.lstrip("/") / "memory.events"]
    return next((p for p in candidates if p.is_file()), None)


def oom_kills(path: Path) -> int | None:
    """The ``oom_kill`` count in a ``memory.events`` / ``memory.oom_control`` file; None when
    it cannot be read (no such file, or a kernel too old to count)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


class OomCount:
    """The ``oom_kill`` count of one cgroup, read at each look (``read``) so that a death
    is compared with the count of the look before it (``grew``)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.last = oom_kills(path) if path is not None else None

    @classmethod
    def of_this_process(cls) -> OomCount:
        try:
            text = Path("/proc/self/cgroup").read_text()
        except OSError:
            return cls(None)
        return cls(cgroup_oom_file(text))

    def read(self) -> int | None:
        """The count now; the last look's count is kept for ``grew``."""
        return oom_kills(self.path) if self.path is not None else None

    def advance(self, now: int | None) -> None:
        """The look is done: ``now`` is the count that the next deaths are compared with."""
        self.last = now


def death_words(
    returncode: int | None,
    oom_before: int | None,
    oom_after: int | None,
    role: str | None = None,
    estimate_bytes: float | None = None,
) -> str:
    """How a host ended, as the rest of a sentence that starts with its name: ``exited with
    code 3``; for a signal, which one; for SIGKILL, whether the kernel's OOM count grew
    between ``oom_before`` (a look while the host was alive) and ``oom_after`` (after its
    death), with the run's estimate for the host (``role``: its role's name, for the fix)."""
    words = f"exited with code {returncode}"
    if returncode is None or returncode >= 0:
        return words
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number != signal.SIGKILL:
        return f"{words}: killed by signal {number} ({name})"
    if oom_before is None or oom_after is None:
        return f"{words}: killed by signal 9 (SIGKILL: an out-of-memory kill or a kill -9)"
    if oom_after <= oom_before:
        return f"{words}: killed by signal 9 (SIGKILL: a kill -9; the kernel's out-of-memory kill count did not change)"
    estimate = f"; the run's estimate for it: about {estimate_bytes / _GIB:.2f} GiB" if estimate_bytes else ""
    fix = FIX_BY_ROLE.get(role or "", FIX_OTHERWISE)
    return f"{words}: killed by the kernel for lack of memory (out-of-memory{estimate}); to fit, use {fix}"


def host_estimate(estimates: Mapping[str, float], host: str, workers: list[str]) -> float | None:
    """The preflight's estimate (bytes) for a host: its workers' (a pack holds several
    replicas), else the host's own name's; None when the preflight has none for it."""
    found = [estimates[w] for w in workers if w in estimates]
    if found:
        return sum(found)
    return estimates.get(host)


def run_memory_estimates(cfg: RunConfig, model_dir: str, reward_model_dir: str, prompt_tokens: float | None) -> dict[str, float]:
    """The preflight's estimate of each role instance's memory (bytes), as its ``memory:`` line
    printed it; on cpu only, where it is the host memory the kernel runs out of (on
    accelerators it is each device's, which an OOM kill is not about)."""
    if cfg.cluster.device != "cpu":
        return {}
    from asyncflow.actors.driver.preflight import estimate, working_bytes

    per_role = estimate(cfg, model_dir, reward_model_dir)
    if prompt_tokens is not None:
        for role, extra in working_bytes(cfg, model_dir, prompt_tokens).items():
            per_role[role] = per_role.get(role, 0.0) + extra
    return per_role
