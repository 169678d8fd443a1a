"""Files only their owner may read: the cluster secret, TLS keys (mode 0600)."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` at mode 0600, created so from the start (never
    readable by others, not even for a moment); an existing file is truncated and
    set back to 0600."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb", closefd=False) as out:
            out.write(data)
    finally:
        os.close(fd)
    return path
