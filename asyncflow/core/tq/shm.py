"""Same-host shared-memory arenas for the bulk data path (like Ray's plasma store).

A shard owns arenas: sparse files under ``/dev/shm`` (memory is used only where
written). A producer on the same host reserves an extent in one (one small round
trip), writes the tensor bytes straight into it through its own mapping, and sends
the shard only offsets. A reader maps the arena and builds arrays over it: no byte
crosses a socket. Mappings are made once per process and kept, because in a VM the
page faults of a fresh mapping cost more than the copy itself.

Extents are reused after their rows are freed, so an array over an arena is only
valid until its batch is acked: ``TQClient.get_batch`` copies unless told
``zero_copy=True``. Arenas are plain files (not ``multiprocessing.shared_memory``,
whose resource tracker would unlink them when a producer exits); a shard unlinks
its arenas when it stops.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
from collections import OrderedDict

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "asyncflow-tq-"
ALIGN_BYTES = 64
EXTENT_ALIGN_BYTES = 4096


def available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def path_of(name: str) -> str:
    if not name.startswith(PREFIX) or "/" in name:
        raise ValueError(f"not a TransferQueue arena name: {name!r}")
    return os.path.join(SHM_DIR, name)


def align(num_bytes: int, to: int = ALIGN_BYTES) -> int:
    return (num_bytes + to - 1) // to * to


class Arena:
    """A shard's arena: a sparse /dev/shm file and a first-fit allocator over it."""

    def __init__(self, name: str, num_bytes: int):
        self.name = name
        self.num_bytes = num_bytes
        fd = os.open(path_of(name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, num_bytes)
        finally:
            os.close(fd)
        self._free_starts = [0]  # sorted starts of free ranges
        self._free_sizes = {0: num_bytes}
        self.used_bytes = 0
        self.top_bytes = 0  # high-water mark of the highest byte ever handed out (memory touched)

    def alloc(self, num_bytes: int) -> int | None:
        size = align(max(num_bytes, 1), EXTENT_ALIGN_BYTES)
        for k, start in enumerate(self._free_starts):
            free = self._free_sizes[start]
            if free >= size:
                del self._free_sizes[start]
                if free > size:
                    self._free_starts[k] = start + size
                    self._free_sizes[start + size] = free - size
                else:
                    del self._free_starts[k]
                self.used_bytes += size
                self.top_bytes = max(self.top_bytes, start + size)
                return start
        return None

    def free(self, offset: int, num_bytes: int) -> None:
        size = align(max(num_bytes, 1), EXTENT_ALIGN_BYTES)
        self.used_bytes -= size
        k = bisect.bisect_left(self._free_starts, offset)
        # merge with the next free range
        if k < len(self._free_starts) and self._free_starts[k] == offset + size:
            size += self._free_sizes.pop(self._free_starts[k])
            del self._free_starts[k]
        # merge with the previous free range
        if k > 0:
            prev = self._free_starts[k - 1]
            if prev + self._free_sizes[prev] == offset:
                self._free_sizes[prev] += size
                return
        self._free_starts.insert(k, offset)
        self._free_sizes[offset] = size

    def unlink(self) -> None:
        try:
            os.unlink(path_of(self.name))
        except FileNotFoundError:
            pass


class Mappings:
    """This process's mappings of arenas, made once and kept (at most ``max_arenas``)."""

    def __init__(self, max_arenas: int = 16):
        self._maps: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_arenas

    def get(self, name: str) -> np.ndarray:
        """The whole arena as a writable uint8 array over a shared mapping."""
        with self._lock:
            arr = self._maps.get(name)
            if arr is not None:
                self._maps.move_to_end(name)
                return arr
            fd = os.open(path_of(name), os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            arr = self._maps[name] = np.frombuffer(mapped, dtype=np.uint8)
            while len(self._maps) > self._max:
                self._maps.popitem(last=False)  # unmapped once no array uses it
            return arr

    def forget(self, name: str) -> None:
        with self._lock:
            self._maps.pop(name, None)


MAPPINGS = Mappings()


def reap_orphans() -> list[str]:
    """Unlink arenas whose owning shard process is gone (it crashed before it could);
    returns their names. An arena is named ``<PREFIX><shard>-<pid>-<n>``."""
    reaped: list[str] = []
    if not os.path.isdir(SHM_DIR):
        return reaped
    for name in os.listdir(SHM_DIR):
        if not name.startswith(PREFIX):
            continue
        parts = name.rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                reaped.append(name)
            except FileNotFoundError:
                pass
        except PermissionError:
            pass  # alive, someone else's
    return reaped
