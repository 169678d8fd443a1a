"""The local weight transport (``workflow.weight_transport = "local"``): a replica on
the trainer's host maps the version the trainer published instead of pulling chunks.

The sender writes each version once into a file in shared memory (``/dev/shm``):
``<prefix>-v<version>``, with ``<prefix>`` = ``asyncflow-weights-<run>-<pid>`` (the run
directory's hash, the trainer's pid). The file holds a header (msgpack: the version,
the digest of its tensors, each tensor's name, dtype, shape and offset) and then the
tensor bytes, each at a 64-byte aligned offset. A replica opens it read-only, maps it
read-only (``MAP_SHARED | MAP_POPULATE``, ``PROT_READ``: the file's own pages, mapped
in the fetch thread, so the swap takes no page fault) and returns views of the mapping: the engine's ``load_weights`` is the one copy,
from the trainer's bytes into the replica's parameters.

On CUDA (``cluster.device = "cuda"`` and a trainer with a GPU) the file holds the
header only, with a CUDA IPC handle (``torch.multiprocessing.reductions.reduce_tensor``)
of one device buffer per version the sender packs the published tensors into; a
replica on the same GPU (same device uuid) rebuilds it and returns views of it, so its
``load_weights`` copies device to device. The snapshot the trainer publishes is a host
copy today (``export_weights``): the sender moves it to the GPU once per version,
whatever the number of replicas.

Where a replica is not on the trainer's host (the directory entry ``weights.local``
names another node), not on its GPU (another device uuid), or cannot open the file
(another /dev/shm), it fetches over nng, saying why once: the local sender is also an
nng sender.

Invariants:
- A file appears under its final name only whole (written under ``.tmp``, then
  renamed) and never changes after; the two newest versions are kept, older ones
  removed when superseded, every one at ``close``.
- Nothing is left in /dev/shm after a run, even when the trainer is killed: a
  watchdog (``sh``, its own session so a kill of the trainer's process group spares
  it) waits for the trainer's end of a pipe to close and removes ``<prefix>-*``.
  A sender also removes, when it starts, the files of any earlier sender whose
  process is gone (should a watchdog have been killed too).
- What a replica loads is checked twice: the receiver compares the digest of what
  it mapped with the header's (a short or overwritten file is refetched over nng,
  logged with the cause), and the replica checks its engine's digest after the swap
  against the published one (``actors/rollout/inbox.py``), as for every transport.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import mmap
import os
import pickle
import struct
import subprocess
import warnings
from collections.abc import Callable

import msgspec
import torch

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights._base import NamedTensors, WeightReceiver, tensor_views
from asyncflow.actors.weights.nng import NngReceiver, NngSender
from asyncflow.core import protocol
from asyncflow.core.errors import RemoteError
from asyncflow.engines.digest import weights_digest

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
FILE_PREFIX = "asyncflow-weights-"
ENTRY = "weights.local"
"""The directory entry naming the sender's node, its file prefix and its device."""
ENTRY_KIND = "asyncflow.weights.local"
LOOKUP_WAIT_S = 10.0
"""How long a replica waits for the sender's entry (registered before its first version)."""
MAGIC = b"AFWLOC01"
ALIGN = 64
_HEAD = struct.Struct("<8sQ")  # magic, header length


class Header(msgspec.Struct, kw_only=True):
    version: int
    digest: int  # weights_digest of the tensors as they are in the file (their own dtypes)
    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    offsets: list[int]  # from the start of the data (cpu) or of the device buffer (cuda)
    num_bytes: int
    device: str = "cpu"  # "cuda": the bytes are in a device buffer, ``cuda_handle`` shares it
    device_uuid: str = ""
    cuda_handle: bytes = b""  # pickle of reduce_tensor(buffer): (rebuild function, its arguments)


class Unreachable(RuntimeError):
    """This replica cannot map the trainer's versions: fetch over nng."""


def device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _layout(named_tensors: NamedTensors) -> tuple[list[int], int]:
    offsets, end = [], 0
    for _, t in named_tensors:
        offsets.append(end)
        end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    return offsets, end


def _views(flat: torch.Tensor, header: Header) -> NamedTensors:
    return tensor_views(flat, header.names, header.dtypes, header.shapes, header.offsets)


def _pack(named_tensors: NamedTensors, offsets: list[int], out: torch.Tensor) -> None:
    for (_, t), off in zip(named_tensors, offsets):
        n = t.numel() * t.element_size()
        if n:
            out[off : off + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))


def run_tag(run_dir: str) -> str:
    """The part of a file's name that names its run."""
    return hashlib.blake2b(os.path.realpath(run_dir).encode(), digest_size=4).hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans(shm_dir: str) -> list[str]:
    """Remove the files of senders whose process is gone; the paths removed."""
    removed = []
    for path in glob.glob(os.path.join(shm_dir, FILE_PREFIX + "*")):
        parts = os.path.basename(path).removeprefix(FILE_PREFIX).split("-")
        if len(parts) >= 3 and parts[1].isdigit() and not _pid_alive(int(parts[1])):
            try:
                os.unlink(path)
                removed.append(path)
            except (FileNotFoundError, PermissionError):  # gone meanwhile; another user's
                pass
    return removed


class LocalSender(NngSender):
    """Writes each version to ``<prefix>-v<version>`` (and serves nng chunks to the
    replicas that cannot map it)."""

    def __init__(self, directory, chunk_bytes: int, run_dir: str, device: torch.device | None = None, shm_dir: str | None = None):
        super().__init__(chunk_bytes)
        shm_dir = shm_dir or SHM_DIR
        self.directory = directory
        self.device = device or torch.device("cpu")
        self.prefix = os.path.join(shm_dir, f"{FILE_PREFIX}{run_tag(run_dir)}-{os.getpid()}")
        self._buffers: dict[int, torch.Tensor] = {}  # cuda: the device buffer of each kept version
        self._uuid = device_uuid(self.device) if self.device.type == "cuda" else ""
        for path in sweep_orphans(shm_dir):
            log.info("removed %s, left by a trainer that is gone", path)
        # the watchdog: removes our files once our end of its stdin closes (this process ended, however)
        self._watchdog = subprocess.Popen(
            ["sh", "-c", 'cat >/dev/null; rm -f -- "$0"-v*', self.prefix],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        self._closed = False
        self._write_failed = False  # warned once that a version could not be written
        self.address = f"shm://{self.prefix}|{self.device.type}|{self._uuid}"
        if directory is not None:
            directory.register(
                protocol.ActorEntry(
                    name=ENTRY,
                    address=self.address,
                    host=os.uname().nodename,
                    pid=os.getpid(),
                    kind=ENTRY_KIND,
                )
            )

    def path(self, version: int) -> str:
        return f"{self.prefix}-v{version}"

    def publish(self, version: int, named_tensors: NamedTensors, digest: int) -> messages.WeightsReady:
        named_tensors = list(named_tensors)
        ready = super().publish(version, named_tensors, digest)  # nng chunks (views): for replicas elsewhere
        offsets, num_bytes = _layout(named_tensors)
        header = Header(
            version=version,
            digest=weights_digest(named_tensors),
            names=[n for n, _ in named_tensors],
            dtypes=[str(t.dtype).removeprefix("torch.") for _, t in named_tensors],
            shapes=[tuple(t.shape) for _, t in named_tensors],
            offsets=offsets,
            num_bytes=num_bytes,
        )
        if self.device.type == "cuda":
            from torch.multiprocessing.reductions import reduce_tensor

            buf = torch.empty(max(num_bytes, 1), dtype=torch.uint8, device=self.device)
            _pack(named_tensors, offsets, buf)
            torch.cuda.current_stream(self.device).synchronize()
            self._buffers[version] = buf
            header.device, header.device_uuid = "cuda", self._uuid
            header.cuda_handle = pickle.dumps(reduce_tensor(buf))
            data = None
        else:
            data = (named_tensors, offsets, num_bytes)
        try:
            self._write(version, msgspec.msgpack.encode(header), data)
        except OSError as exc:  # e.g. /dev/shm full (a container's default is 64 MB): the replicas use nng
            if not self._write_failed:
                log.warning(
                    "could not write weights v%d (%d bytes) to %s (%s): replicas fetch it over nng. Give /dev/shm room "
                    "for two versions (docker: --shm-size) or set workflow.weight_transport = 'nng'",
                    version,
                    num_bytes,
                    os.path.dirname(self.prefix),
                    exc,
                )
            self._write_failed = True
        return ready

    def _write(self, version: int, head: bytes, data: tuple | None) -> None:
        start = -(-(_HEAD.size + len(head)) // ALIGN) * ALIGN
        total = start + (data[2] if data is not None else 0)
        tmp = self.path(version) + ".tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(total, 1))  # ENOSPC here, not SIGBUS when the mapping is written
            with mmap.mmap(fd, max(total, 1)) as mm:
                mm[: _HEAD.size + len(head)] = _HEAD.pack(MAGIC, len(head)) + head
                if data is not None and data[2]:
                    named, offsets, num_bytes = data
                    _pack(named, offsets, torch.frombuffer(mm, dtype=torch.uint8, count=num_bytes, offset=start))
        except BaseException:
            os.unlink(tmp)
            raise
        finally:
            os.close(fd)
        os.rename(tmp, self.path(version))

    def _forget(self, version: int) -> None:
        super()._forget(version)
        self._buffers.pop(version, None)
        for path in (self.path(version), self.path(version) + ".tmp"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for version in sorted(self._chunks):
            self._forget(version)
        if self._watchdog.stdin is not None:
            self._watchdog.stdin.close()  # it removes what may be left and exits
        self._watchdog.wait(timeout=10)
        if self.directory is not None:
            try:
                self.directory.unregister(ENTRY, address=self.address, timeout_s=2.0)
            except Exception as exc:  # noqa: BLE001 - the directory may be gone at shutdown
                log.debug("could not unregister %s: %s", ENTRY, exc)


class LocalReceiver(WeightReceiver):
    """Maps the version the trainer wrote (``LocalSender``); where this replica cannot
    (another node, another GPU, another /dev/shm) it says why once and fetches over nng."""

    def __init__(self, directory, replica: str, device: torch.device | None = None, timeout_s: float = 120.0):
        self.directory, self.replica = directory, replica
        self.device = device or torch.device("cpu")
        self.timeout_s = timeout_s
        self.nng = NngReceiver(timeout_s)
        self.fallback_why = ""  # set once this replica fetches over nng for good
        self._prefix = ""
        self.num_mapped = 0
        self.num_refetched = 0
        self.num_bytes = 0

    def counters(self) -> dict[str, float]:
        return {"weights/local_mapped": self.num_mapped, "weights/local_refetched": self.num_refetched}

    def fetch(
        self, weights, on_chunk: Callable[[int], None] | None = None, announced: messages.WeightsReady | None = None
    ) -> tuple[int, NamedTensors]:
        if not self.fallback_why:
            try:
                return self._fetch(weights, announced)
            except Unreachable as exc:
                self.fallback_why = str(exc)
                log.warning("%s: weight transport 'local' unavailable (%s); using nng", self.replica, exc)
        return self.nng.fetch(weights, on_chunk, announced)

    def _locate(self) -> str:
        """The sender's file prefix, once it is known to be reachable from here."""
        if self._prefix:
            return self._prefix
        try:
            entry = self.directory.lookup(ENTRY, wait_s=min(self.timeout_s, LOOKUP_WAIT_S))
        except LookupError:
            raise Unreachable(
                f"no {ENTRY!r} in the directory: the trainer's side does not write local versions "
                "(both sides must use workflow.weight_transport = 'local')"
            ) from None
        prefix, kind, uuid = entry.address.removeprefix("shm://").split("|")
        if entry.host != os.uname().nodename:
            raise Unreachable(f"the trainer is on host {entry.host}, this replica on {os.uname().nodename}")
        if kind == "cuda":
            if self.device.type != "cuda":
                raise Unreachable(f"the trainer publishes on its GPU, this replica runs on {self.device}")
            if device_uuid(self.device) != uuid:
                raise Unreachable(f"the trainer's GPU ({uuid}) is not this replica's {self.device}")
        self._prefix = prefix
        return prefix

    def _fetch(self, weights, announced: messages.WeightsReady | None) -> tuple[int, NamedTensors]:
        prefix = self._locate()
        if announced is None or announced.num_chunks <= 0:
            announced = weights.ask(messages.GetLatestWeights(), timeout_s=30)
        version = announced.version
        try:
            tensors = self._map(f"{prefix}-v{version}", version)
        except FileNotFoundError:  # superseded twice since announced, or the trainer restarted: the newest, afresh
            self._prefix = ""
            prefix = self._locate()
            latest = weights.ask(messages.GetLatestWeights(), timeout_s=30)
            version = latest.version
            try:
                tensors = self._map(f"{prefix}-v{version}", version)
            except FileNotFoundError:
                raise Unreachable(
                    f"{prefix}-v{version}, the newest version, is not in this replica's {SHM_DIR} "
                    "(not the trainer's /dev/shm: another container? Or the trainer could not write it: its log says why)"
                ) from None
        except ValueError as exc:  # short, overwritten or not ours: this version over nng
            log.warning("%s: %s; fetching v%d over nng instead", self.replica, exc, version)
            self.num_refetched += 1
            try:
                return self.nng.fetch(weights, None, announced)
            except RemoteError:
                return self.nng.fetch(weights, None, None)
        if self.num_mapped == 0:
            log.info("%s: mapping weights from %s-v* (local, %s)", self.replica, prefix, self.device)
        self.num_mapped += 1
        return version, tensors

    def _map(self, path: str, version: int) -> NamedTensors:
        """Views of the version in ``path``; ValueError when the file is not whole."""
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < _HEAD.size:
                raise ValueError(f"{path} is short ({size} bytes, not even a header)")
            # shared and read-only: the file's own pages (no copy), all mapped now, in the fetch thread, so
            # the swap's copy into the parameters takes no page fault
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        magic, head_len = _HEAD.unpack(mm[: _HEAD.size])
        if magic != MAGIC or _HEAD.size + head_len > size:
            raise ValueError(f"{path} is not a whole weights file (magic {magic!r}, {size} bytes)")
        try:
            header = msgspec.msgpack.decode(mm[_HEAD.size : _HEAD.size + head_len], type=Header)
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path} has a damaged header ({exc})") from None
        if header.version != version:
            raise ValueError(f"{path} holds v{header.version}, not v{version}")
        if header.device == "cuda":
            rebuild, args = pickle.loads(header.cuda_handle)
            flat = rebuild(*args)
            if flat.device != self.device:
                flat = flat.to(self.device)
            tensors = _views(flat, header)
        else:
            start = -(-(_HEAD.size + head_len) // ALIGN) * ALIGN
            if start + header.num_bytes > size:
                raise ValueError(f"{path} is short: {size - start} of its {header.num_bytes} bytes of tensors")
            flat = torch.empty(0, dtype=torch.uint8)
            if header.num_bytes:
                with warnings.catch_warnings():  # read-only on purpose: the engine copies from it, never into it
                    warnings.filterwarnings("ignore", message="The given buffer is not writable")
                    flat = torch.frombuffer(mm, dtype=torch.uint8, count=header.num_bytes, offset=start)
            tensors = _views(flat, header)
        got = weights_digest(tensors)
        if got != header.digest:
            raise ValueError(
                f"{path} does not hold the bytes the trainer wrote (digest {got:x}, written {header.digest:x}): "
                "something else wrote into it"
            )
        self.num_bytes += header.num_bytes
        return tensors

    def close(self) -> None:
        pass
