"""Whether a failed write failed for lack of space, and the words for it.

A full disk reaches Python as ``OSError(ENOSPC)`` from a plain write, but as a
``RuntimeError`` from torch's checkpoint writer ("unexpected pos ...", "iostream
error"), which names neither the cause nor the file. So a failed write is also looked
at from the filesystem's side: one that has (almost) no space left when the write
failed is full, whatever the exception says (a failed write fills what it can first).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from asyncflow.core.errors import AsyncflowError

NEARLY_FULL_BYTES = 16 << 20
"""Free space below which a filesystem counts as full when a write to it failed (or
below a twentieth of a smaller filesystem)."""


class DiskFull(AsyncflowError):
    """A write failed for lack of space; the message names the path, the free space and the fix."""


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _usage(path: Path):
    """``shutil.disk_usage`` of the filesystem of ``path``, or of its nearest existing parent."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate)
        except OSError:
            continue
    return None


def no_space_left(exc: BaseException, path: str | Path) -> str | None:
    """``no space left on device: PATH (N free)`` when ``exc``, raised by a write to ``path``
    (a file or the directory written into), failed for lack of space; None otherwise. An
    OSError names its own file when it has one."""
    named = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    where = Path(named or path)
    usage = _usage(where)
    said_full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
    if not said_full:
        if not isinstance(exc, (OSError, RuntimeError)) or usage is None:
            return None
        if usage.free >= min(NEARLY_FULL_BYTES, usage.total // 20):
            return None
    free = f"{human_bytes(usage.free)} free" if usage is not None else "free space unknown"
    return f"no space left on device: {where} ({free})"
