"""The collective weight transport (``workflow.weight_transport = "collective"``).

The tensor bytes of a weight version travel over a two-member torch.distributed
group per replica: the ``weights`` actor (in the trainer's process) is rank 0, the
replica rank 1. Control stays on nng: ``WeightsReady`` announces a version, the
replica's fetch thread asks ``StreamWeights`` and gets the layout of the chunks
(names, dtypes, shapes, offsets) in the reply, then receives one broadcast per
chunk into a buffer on its own device (gloo: host memory; nccl/hccl: the replica's
accelerator, the sender copying each host-staged chunk to its device first).

Why one group per replica and not the default process group: the trainer's default
group belongs to its FSDP ranks, and a pairwise group means a dead or restarted
replica never breaks the others. Each group has its own TCPStore, hosted by the
sender and found through the directory (``core/rendezvous.py``, entry
``dist.weights.<replica>.<incarnation>``); a replica whose stream failed starts a
new incarnation, so a broken group is never reused.

Invariants:
- A stream that fails on either side (peer died, timeout) raises within
  ``timeout_s`` on that side and closes the group; the replica retries at the next
  announcement with a fresh group, like a failed nng fetch.
- Where a side has no such collective (e.g. nccl asked of a trainer without CUDA)
  the sender answers ``refused`` and the replica uses nng from then on (one log
  line): the collective sender is also an nng sender.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import uuid
from typing import Any

import torch
import torch.distributed as dist

from asyncflow.actors.runtime import messages
from asyncflow.actors.weights._base import NamedTensors, WeightReceiver, tensor_views
from asyncflow.actors.weights.nng import NngReceiver, NngSender
from asyncflow.core.rendezvous import entry_name, host_store, join_store, node_host

log = logging.getLogger(__name__)

ALIGN = 64  # bytes: every tensor's offset in a chunk, so a view of any dtype is aligned
TIMEOUT_S = 120.0  # one broadcast (or building the group) may take this long before the stream fails
GROUP_PREFIX = "weights."


class Refused(RuntimeError):
    """The sender cannot use this collective; fetch over nng instead."""


def group_name(replica: str, incarnation: str) -> str:
    return f"{GROUP_PREFIX}{replica}.{incarnation}"


# -- layout: tensors packed into one flat byte buffer per chunk ----------------------


def layout(named_tensors: list, chunk_bytes: int) -> list[messages.StreamChunk]:
    """Chunks of at most ``chunk_bytes`` (a larger tensor travels alone), each tensor
    at an ``ALIGN``-aligned offset."""
    from asyncflow.engines.base import chunk_by_bytes

    chunks = []
    for chunk in chunk_by_bytes(named_tensors, chunk_bytes):
        offsets, end = [], 0
        for _, t in chunk:
            offsets.append(end)
            end += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
        chunks.append(
            messages.StreamChunk(
                num_bytes=end,
                names=[n for n, _ in chunk],
                dtypes=[str(t.dtype).removeprefix("torch.") for _, t in chunk],
                shapes=[tuple(t.shape) for _, t in chunk],
                offsets=offsets,
            )
        )
    return chunks


def pack(tensors: list[torch.Tensor], chunk: messages.StreamChunk, out: torch.Tensor) -> torch.Tensor:
    """Copy ``tensors`` (the chunk's, in order) into ``out`` (uint8, >= num_bytes, any device)."""
    for t, off in zip(tensors, chunk.offsets):
        n = t.numel() * t.element_size()
        if n:
            out[off : off + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return out[: chunk.num_bytes]


def unpack(flat: torch.Tensor, chunk: messages.StreamChunk) -> list[tuple[str, torch.Tensor]]:
    """Views of the chunk's tensors in ``flat`` (no copy)."""
    return tensor_views(flat, chunk.names, chunk.dtypes, chunk.shapes, chunk.offsets)


# -- the two-member group ------------------------------------------------------------


def device_for(backend: str) -> torch.device:
    """This process's device for ``backend`` (the one its torch has current)."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    if backend == "hccl":
        return torch.device("npu", torch.npu.current_device())  # type: ignore[attr-defined]
    return torch.device("cpu")


def unavailable(backend: str) -> str:
    """Why this process cannot take part in a ``backend`` group ('' when it can)."""
    if backend == "gloo":
        return "" if dist.is_gloo_available() else "this torch has no gloo"
    if backend == "nccl":
        if not dist.is_nccl_available():
            return "this torch has no nccl"
        return "" if torch.cuda.is_available() else "no CUDA device in this process"
    if backend == "hccl":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            return "torch_npu is not installed"
        return "" if torch.npu.is_available() else "no NPU in this process"  # type: ignore[attr-defined]
    return f"unknown backend {backend!r}"


class PairGroup:
    """A standalone two-member group (not the default process group) on its own store.
    Rank 0 broadcasts, rank 1 receives; every operation fails after ``timeout_s``."""

    def __init__(self, store, rank: int, backend: str, device: torch.device, timeout_s: float, host: str):
        self.backend, self.device, self.timeout_s = backend, device, timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        # a torch Backend of gloo, nccl or hccl: torch's stubs declare no broadcast on Backend (it has one at run
        # time) and hccl's class is untyped, so no stub type fits all three
        self.pg: Any
        if backend == "gloo":
            # torch's stub declares only Options; _Options (with _timeout, _devices) is the run-time class the constructor takes
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
            opts._timeout = timeout
            # the node's advertised address (the peer may be on another node), or the
            # interface GLOO_SOCKET_IFNAME names, as torch.distributed does
            ifname = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
            opts._devices = [
                dist.ProcessGroupGloo.create_device(interface=ifname)
                if ifname
                else dist.ProcessGroupGloo.create_device(hostname=host)
            ]
            self.pg = dist.ProcessGroupGloo(store, rank, 2, opts)
        elif backend == "nccl":
            torch.cuda.set_device(device)
            opts = dist.ProcessGroupNCCL.Options()
            # the watchdog's limit is above ours: a stuck broadcast is aborted by us
            # (wait with a timeout, then abort), never by the watchdog tearing the process down
            opts._timeout = timeout * 2
            self.pg = dist.ProcessGroupNCCL(store, rank, 2, opts)
        elif backend == "hccl":
            from torch_npu._C._distributed_c10d import ProcessGroupHCCL

            torch.npu.set_device(device)  # type: ignore[attr-defined]
            opts = ProcessGroupHCCL.Options()
            opts._timeout = timeout * 2
            self.pg = ProcessGroupHCCL(store, rank, 2, opts)
        else:
            raise ValueError(f"unknown backend {backend!r}")
        self._closed = False

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's ``tensor`` into rank 1's; returns when this side is done."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # per thread
        elif self.device.type == "npu":
            torch.npu.set_device(self.device)  # type: ignore[attr-defined]
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = datetime.timedelta(seconds=self.timeout_s)
        work = self.pg.broadcast([tensor], opts)
        # blocks this thread (not just a stream) until done, or raises after the timeout
        work.wait(datetime.timedelta(seconds=self.timeout_s))
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.pg.abort()  # wakes a broadcast blocked on a dead peer where the backend supports it
        except Exception as exc:  # noqa: BLE001 - best effort: the group is dropped anyway
            log.debug("abort of a %s weight group: %s", self.backend, exc)


# -- sender: the weights actor's side ----------------------------------------------------


class CollectiveSender(NngSender):
    """Streams the staged snapshot to each replica that asks ``StreamWeights``, in a
    thread per replica so the weights actor keeps answering; serves nng chunks too
    (a replica whose side refused the collective falls back to them)."""

    def __init__(self, directory, transport, chunk_bytes: int, timeout_s: float = TIMEOUT_S):
        super().__init__(chunk_bytes)
        self.directory, self.transport, self.timeout_s = directory, transport, timeout_s
        self._layouts: dict[int, list[messages.StreamChunk]] = {}  # made on a version's first stream
        self._streams: dict[str, ReplicaStream] = {}

    def _forget(self, version: int) -> None:
        super()._forget(version)
        self._layouts.pop(version, None)

    def serve(self, msg: messages.WeightRequest) -> messages.WeightChunk | messages.WeightStream:
        if not isinstance(msg, messages.StreamWeights):
            return super().serve(msg)
        return self._stream(msg)

    def _stream(self, msg: messages.StreamWeights) -> messages.WeightStream:
        """Answer with the newest version's layout and start broadcasting it over the
        replica's group (made now if ``msg.group`` is new)."""
        why = unavailable(msg.backend)
        if why:
            return messages.WeightStream(version=-1, refused=f"{msg.backend} on the trainer's side: {why}")
        if self._latest < 0:
            raise KeyError("no weights published yet")
        stream = self._streams.get(msg.replica)
        if stream is not None and (stream.group != msg.group or stream.failed):
            stream.close()  # the replica gave up on that group (or restarted): a fresh one
            stream = None
        if stream is None:
            stream = ReplicaStream(self.directory, self.transport, msg.replica, msg.group, msg.backend, timeout_s=self.timeout_s)
            self._streams[msg.replica] = stream
        version = self._latest
        if version not in self._layouts:
            self._layouts[version] = layout(self._named[version], self.chunk_bytes)
        chunks = self._layouts[version]
        stream.start(version, self._named[version], chunks)
        return messages.WeightStream(version=version, chunks=chunks)

    def drop_replica(self, replica: str) -> None:
        if replica in self._streams:
            self._streams.pop(replica).close()

    def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()


class ReplicaStream:
    """Rank 0 of one replica's group. The store is hosted when the sender is made (so
    the replica finds it as soon as StreamWeights is answered); the group is built in
    the first stream's thread (it waits for the replica to join)."""

    def __init__(self, directory, transport, replica: str, group: str, backend: str, timeout_s: float = TIMEOUT_S):
        self.directory, self.replica, self.group, self.backend = directory, replica, group, backend
        self.timeout_s = timeout_s
        self.host = node_host(transport)
        self.store: dist.TCPStore | None = host_store(directory, group, transport, 2, timeout_s)  # None once closed
        self.device = device_for(backend)
        self.pg: PairGroup | None = None
        self.failed = False  # a stream failed: the replica will come back with a new group
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, version: int, named_tensors: list, chunks: list[messages.StreamChunk]) -> None:
        """Send ``named_tensors`` (the staged snapshot of ``version``) in a background
        thread, after the previous stream's thread (the replica may have received the
        last bytes and asked again before that thread returned)."""
        self._thread = threading.Thread(
            target=self._send,
            args=(self._thread, version, named_tensors, chunks),
            name=f"weights-stream-{self.replica}",
            daemon=True,
        )
        self._thread.start()

    def _send(self, previous, version: int, named_tensors: list, chunks: list[messages.StreamChunk]) -> None:
        if previous is not None:
            previous.join()
        if self.failed:
            return
        try:
            if self.pg is None:
                self.pg = PairGroup(self.store, 0, self.backend, self.device, self.timeout_s, self.host)
            buf = torch.empty(max((c.num_bytes for c in chunks), default=0), dtype=torch.uint8, device=self.device)
            start = 0
            for chunk in chunks:
                tensors = [t for _, t in named_tensors[start : start + len(chunk.names)]]
                start += len(chunk.names)
                self.pg.broadcast(pack(tensors, chunk, buf))
        except Exception as exc:  # the replica sees its side fail too and comes back with a new group
            log.warning("streaming weights v%d to %s over %s failed: %s", version, self.replica, self.backend, exc)
            self.failed = True
            self.close()

    def close(self) -> None:
        with self._lock:
            if self.pg is not None:
                self.pg.close()
            store, self.store = self.store, None
        if store is not None:
            try:
                self.directory.unregister(entry_name(self.group), timeout_s=2.0)
            except Exception as exc:  # noqa: BLE001 - the directory may be gone at shutdown
                log.debug("could not unregister %s: %s", entry_name(self.group), exc)


# -- receiver: the replica's side -----------------------------------------------------


class CollectiveReceiver(WeightReceiver):
    """Rank 1 of this replica's group: ``fetch`` asks the weights actor for the newest
    version and receives it into buffers on ``device``; once the trainer's side has
    refused this backend, it fetches over nng instead."""

    def __init__(self, directory, transport, replica: str, device: torch.device, timeout_s: float = TIMEOUT_S):
        from asyncflow.engines.device import dist_backend

        self.directory, self.transport, self.replica = directory, transport, replica
        self.device = device
        self.backend = dist_backend(device.type)
        self.timeout_s = timeout_s
        self._token = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._incarnation = 0
        self.group: str | None = None
        self._pg: PairGroup | None = None
        self._store: dist.TCPStore | None = None
        self.num_streams = 0
        self.num_bytes = 0
        self.fallback: NngReceiver | None = None  # set when the trainer's side refused the collective

    def fetch(self, weights, on_chunk=None, announced: messages.WeightsReady | None = None) -> tuple[int, NamedTensors]:
        """Receive the newest staged version: ``(version, [(name, tensor on device)])``.
        Where the sender cannot use this backend, this and every later fetch go over
        nng; any other error closes the group (the next fetch builds a new one)."""
        if self.fallback is None:
            try:
                return self._receive(weights, on_chunk)
            except Refused as exc:
                log.warning("%s: weight transport 'collective' unavailable (%s); using nng", self.replica, exc)
                self.fallback = NngReceiver(self.timeout_s)
        return self.fallback.fetch(weights, on_chunk, announced)

    def _receive(self, weights, on_chunk) -> tuple[int, NamedTensors]:
        if self.group is None:
            self._incarnation += 1
            self.group = group_name(self.replica, f"{self._token}-{self._incarnation}")
        reply = weights.ask(messages.StreamWeights(replica=self.replica, group=self.group, backend=self.backend), timeout_s=30)
        if reply.refused:
            self.close()
            raise Refused(reply.refused)
        try:
            if self._pg is None:
                self._store = join_store(self.directory, self.group, 2, self.timeout_s)
                self._pg = PairGroup(self._store, 1, self.backend, self.device, self.timeout_s, node_host(self.transport))
            tensors: list[tuple[str, torch.Tensor]] = []
            for i, chunk in enumerate(reply.chunks):
                flat = torch.empty(chunk.num_bytes, dtype=torch.uint8, device=self.device)
                self._pg.broadcast(flat)
                tensors.extend(unpack(flat, chunk))
                self.num_bytes += chunk.num_bytes
                if on_chunk is not None:
                    on_chunk(i)
        except BaseException:
            self.close()
            raise
        if self.num_streams == 0:
            log.info("%s: receiving weights over %s (group %s, %s)", self.replica, self.backend, self.group, self.device)
        self.num_streams += 1
        return reply.version, tensors

    def close(self) -> None:
        if self._pg is not None:
            self._pg.close()
        self._pg, self._store, self.group = None, None, None
