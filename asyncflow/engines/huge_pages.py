"""Transparent huge pages for torch's CPU allocations (``cluster.huge_pages``, off by default).

A step of a real model allocates its activations and logits anew (SmolLM2's logits
of one micro-batch: 16 x 40 tokens x 49,152 float32, 126 MB). glibc hands blocks
over 32 MB straight to mmap and back to the kernel when freed, so every step
faults each 4 KB page of them in again. torch's allocator asks for 2 MB pages
(``madvise(MADV_HUGEPAGE)``) on allocations of 2 MB or more when the environment
variable ``THP_MEM_ALLOC_ENABLE`` is 1; it reads it once, at a process's first
allocation, so it is set in the environment the driver starts each worker with
(``actors/launcher.worker_env``), and ``afctl bench peer`` gives TRL's process the same.

Measured on this 2-core machine (docs/real-model.md, 'Huge pages for torch's
tensors'; ``scripts/huge_pages_ab.py``): 3.4x fewer page faults over the same runs,
but no faster (the trainer 0.83-0.87x, the rollout 0.99x, a whole async run 1.00x):
the faults saved do not show in the step times. Hence off by default; a machine
where page faults are dear may differ, and the script measures it there.
It matters only where the kernel's mode is ``madvise``: with ``always`` every
process gets huge pages anyway, with ``never`` none can.
"""

from __future__ import annotations

from pathlib import Path

ENV = "THP_MEM_ALLOC_ENABLE"
"""The variable torch's CPU allocator (c10 ``alloc_cpu``) reads."""

MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_env(enabled: bool) -> dict[str, str]:
    """The variable to start a worker process with: ``{ENV: "1"}`` when enabled,
    else nothing (the environment's own value, or torch's default, off)."""
    return {ENV: "1"} if enabled else {}


def kernel_mode(path: Path = MODE_FILE) -> str:
    """The kernel's THP mode: "always", "madvise" or "never" (the bracketed word of
    ``path``); "unknown" where the file is missing (not Linux, or no THP)."""
    try:
        text = path.read_text()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else "unknown"
