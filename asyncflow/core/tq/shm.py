"""Same-host shared-memory segments for the bulk data path (like Ray's plasma store).

A producer writes tensor bytes once into a fresh segment in ``/dev/shm`` and hands
its *name* to the shard, which owns it from then on: the shard unlinks it once every
row in it is freed (or when the shard stops). A reader on the same host maps the
segment and gets numpy arrays over it: no byte crosses a socket. A mapping stays
valid after the unlink; the memory goes back when the last array over it dies.

Segments are plain files under ``/dev/shm`` (not ``multiprocessing.shared_memory``,
whose resource tracker would unlink them when the producer exits).
"""

from __future__ import annotations

import mmap
import os
import uuid

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "asyncflow-tq-"
ALIGN_BYTES = 64


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def _path(name: str) -> str:
    if not name.startswith(PREFIX) or "/" in name:
        raise ValueError(f"not a TransferQueue segment name: {name!r}")
    return os.path.join(SHM_DIR, name)


def align(num_bytes: int) -> int:
    return (num_bytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


class Writer:
    """A new segment of ``num_bytes``, mapped for writing."""

    def __init__(self, num_bytes: int):
        self.name = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.num_bytes = max(num_bytes, 1)
        fd = os.open(_path(self.name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.num_bytes)
            self._map = mmap.mmap(fd, self.num_bytes)
        finally:
            os.close(fd)
        self.view = np.frombuffer(self._map, dtype=np.uint8)

    def write(self, offset: int, data) -> None:
        src = np.frombuffer(data, dtype=np.uint8)
        self.view[offset : offset + src.size] = src

    def close(self) -> None:
        """Unmap (the segment stays, for its new owner)."""
        del self.view
        self._map.close()

    def abort(self) -> None:
        self.close()
        unlink(self.name)


def map_readonly(name: str) -> memoryview:
    """Map a segment; the view keeps the mapping alive. Private copy-on-write pages, so
    arrays over it are writable (torch can wrap them) without touching the segment."""
    fd = os.open(_path(name), os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return memoryview(mapped)


def unlink(name: str) -> None:
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass
