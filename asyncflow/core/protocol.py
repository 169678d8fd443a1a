"""The wire messages of the actor runtime and the queue (the RL roles' are in
``actors/runtime/messages.py``, on the same base, ``Message``: core knows no RL).

Rules (ARCHITECTURE.md: every wire message is a Struct here or there):
- Messages are frozen, ``kw_only``, tagged msgspec Structs. Each actor accepts one
  union (``DirectoryIn``, ``ShardIn``...), decoded by a ``Decoder`` built once.
- Schema evolution: new fields get defaults and are appended; types never change.
- Tensors travel as :class:`Tensor` (dtype + shape + raw bytes), never as lists. A
  received ``Tensor.data`` is a ``memoryview`` into the received frame: no copy is
  made when decoding.
- A field that sets a wait, timeout or delay (a timer in the receiving process) is a
  ``Wait``: 0 to ``MAX_WAIT_S``, checked as it is decoded, so a message carrying any
  other value is refused (``rejected``, naming the field and the range) before it
  reaches a timer.

Frame layout on every nng socket (see ``core/frames.py``)::

    [u32 little-endian header length][Header (msgpack)][body (msgpack)]

The header names the target actor and carries the cluster secret on tcp; the body
is one message of the target's union, encoded directly after the header into the
same buffer so a large payload is copied once on the way out.
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Annotated, Any, ClassVar, Generic, TypeVar, Union

import msgspec

MAX_WAIT_S = 1e6
"""The longest wait, timeout or delay a message or a config key may set: about 11.6 days,
longer than any wait of a run. Every timer of a process runs on one thread
(``core/actor.py``), which cannot be told to wait past ``threading.TIMEOUT_MAX`` (about
9.2e9 s), and nng takes a timeout of at most 2**31 ms (about 2.1e6 s): a value past this
bound would stop them, so the schema refuses it."""

Wait = Annotated[float, msgspec.Meta(ge=0, le=MAX_WAIT_S)]
"""Seconds that start a timer where the message is received: 0 to ``MAX_WAIT_S``."""


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Base of every tagged wire message (the tag is the class name). Each subclass
    defined moves ``generation()`` on: the decoder of any message (a reply) is rebuilt
    when message classes of another module (the RL roles', ``actors/runtime/messages.py``) come
    after it was first built."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        global _GENERATION
        _GENERATION += 1


_GENERATION = 0

Message = _Msg
"""The base for the wire messages of a module above core (``actors/runtime/messages.py``)."""


def generation() -> int:
    """How many message classes are defined so far (the any-message decoder's cache key)."""
    return _GENERATION


R = TypeVar("R")


class Request(_Msg, Generic[R]):
    """A message that is asked, tied to its reply type ``R``: ``class Lookup(Request[Found])``.
    ``ActorRef.ask(msg: Request[R]) -> R`` is typed from it, and a reply of another type
    raises ``WrongReply`` naming the request, the expected and the received type. The
    tie is a class attribute: nothing of it travels on the wire."""

    __reply__: ClassVar[Any] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(base) is Request:
                cls.__reply__ = typing.get_args(base)[0]


_reply_types: dict[type, tuple[type, ...]] = {}


def reply_types(cls: type) -> tuple[type, ...]:
    """The types an ask of request class ``cls`` may be answered with (() for a message
    that is not a Request: any reply); resolved once per class."""
    got = _reply_types.get(cls)
    if got is None:
        hint = getattr(cls, "__reply__", None)
        if hint is None:
            got = ()
        else:
            if isinstance(hint, typing.ForwardRef):  # a reply class defined further down
                hint = eval(hint.__forward_arg__, vars(sys.modules[cls.__module__]))  # noqa: S307 - our own class names
            members = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
            got = tuple(type(None) if m is None else m for m in members)
        _reply_types[cls] = got
    return got


# --------------------------------------------------------------------------------
# Envelope
# --------------------------------------------------------------------------------

ASK = 0
TELL = 1


class Header(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Routing header of a request frame."""

    target: str  # the actor's name
    kind: int  # ASK or TELL
    secret: bytes = b""  # the cluster secret; required on tcp listeners
    # the caller's deadline, for the server's logs: a message's own wait plus one attempt's (core/retry.py)
    timeout_s: Annotated[float, msgspec.Meta(ge=0, le=2 * MAX_WAIT_S)] = 0.0
    # a resendable request's id (core/retry.py): the sending thread's id and its request number;
    # every attempt of one request carries the same, and the actor serves it once (core/replay.py)
    sender: str = ""
    seq: int = 0


class ReplyHeader(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Header of a reply frame; the body follows when ``ok``."""

    ok: bool
    error_type: str = ""  # "remote" (handler raised), "rejected" (bad frame), "auth", "unknown_actor", "stale" (core/replay.py)
    error: str = ""  # message with the actor's name and the message type


# --------------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------------


class Tensor(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A dense array: dtype name (numpy or torch spelling, e.g. ``int64``,
    ``float32``, ``bfloat16``), shape, and the raw C-order bytes."""

    dtype: str
    shape: tuple[int, ...]
    data: memoryview  # bytes-like when encoding; a view into the frame when decoded


# --------------------------------------------------------------------------------
# Common messages (every actor answers these)
# --------------------------------------------------------------------------------


class Ping(Request["Pong"]):
    pass


class Pong(_Msg):
    name: str
    pid: int
    host: str
    num_rejected_frames: int = 0


class Stop(Request["Ok"]):
    """Ask an actor (or a process host) to stop cleanly."""


class Ok(_Msg):
    """Generic acknowledgement."""


# --------------------------------------------------------------------------------
# Directory: name -> address
# --------------------------------------------------------------------------------


class ActorEntry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    address: str
    host: str = ""
    pid: int = 0
    kind: str = ""  # the actor's class, for `afctl status`


class Register(Request["Ok"]):
    entry: ActorEntry


class Unregister(Request["Ok"]):
    name: str
    address: str = ""
    """When set, the entry is removed only while it still has this address: a stale
    process (its node cut off, then back) never removes its successor's entry."""


class Lookup(Request["Found"]):
    """Resolve a name; waits up to ``wait_s`` for it to be registered."""

    name: str
    wait_s: Wait = 0.0


class Found(_Msg):
    entry: ActorEntry


class ListActors(Request["ActorList"]):
    prefix: str = ""


class ActorList(_Msg):
    entries: list[ActorEntry]


# --------------------------------------------------------------------------------
# Process host: starts named actors from specs
# --------------------------------------------------------------------------------


class ActorSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a process host starts: ``cls`` is a dotted path ``module:Class``;
    ``kwargs`` are msgpack-encoded keyword arguments of its constructor."""

    name: str
    cls: str
    kwargs: bytes = b"\x80"  # msgpack of {} by default


class StartActors(Request["Started"]):
    specs: list[ActorSpec]


class Started(_Msg):
    entries: list[ActorEntry]


class StopActor(Request["Ok"]):
    name: str


class Echo(Request["Echo"]):
    """Answered with itself (transport benchmark, health checks, tests)."""

    payload: memoryview = b""  # type: ignore[assignment]  # bytes-like
    fail: str = ""  # when set, the echo actor raises ValueError(fail) instead
    delay_s: Wait = 0.0  # when > 0, the echo actor answers after this delay (deferred)


DirectoryIn = Union[Register, Unregister, Lookup, ListActors, Ping, Stop]
EchoIn = Union[Echo, Ping, Stop]
HostIn = Union[StartActors, StopActor, Ping, Stop]


# --------------------------------------------------------------------------------
# TransferQueue (owned by core/tq/)
# --------------------------------------------------------------------------------

# Actor names: ``tq.manager``, ``tq.shard.<i>``, ``tq.controller.<task>`` (see
# ``core/tq/names.py``). Row ``i`` lives on shard ``(i // stripe_rows) % num_shards``.
# Integer metadata fields use -1 for "unknown"; a later write merges known fields.


class RowMeta(msgspec.Struct, kw_only=True, array_like=True):
    """Metadata of one row (sample): its global index, the prompt group it belongs
    to (all ``group_size`` responses of one prompt), the train step it was planned
    for, the policy version that produced it, its lengths in tokens, and the name its
    producer gave it (``key``: a gateway session's id; "": none), which its consumers
    see and a saved queue keeps (row indices are reused, names are not)."""

    index: int
    group_id: int = -1
    group_size: int = 1
    step: int = -1
    version: int = -1
    prompt_len: int = -1
    response_len: int = -1
    weights_digest: int = 0  # of the weights that generated the row (engines/digest.py); 0: unknown
    key: str = ""  # the producer's name for the row; "": none (never a filter field)


class RowFilter(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Keep only rows whose integer metadata ``field`` lies in ``[lo, hi]``."""

    field: str  # a RowMeta field: "step", "version", "group_id", ...
    lo: int = -(2**62)
    hi: int = 2**62


class ShmColumn(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One column of several rows whose bytes sit in same-host shared-memory arenas
    (``/dev/shm/<name>``): row ``k`` is ``shapes[k]`` of ``dtype`` at ``offsets[k]``
    in arena ``segments[k]`` (an index into the message's segment table)."""

    dtype: str
    shapes: list[tuple[int, ...]]
    segments: list[int]
    offsets: list[int]


# -- data plane: client -> shard ---------------------------------------------------


class PutRows(Request["Ok"]):
    """Store columns of rows. ``columns[name][k]`` is column ``name`` of row
    ``indices[k]``; ``metas`` (optional, same order) merge into the rows' metadata."""

    indices: list[int]
    columns: dict[str, list[Tensor]]
    metas: list[RowMeta] = []


class ReserveShm(Request["ShmReserved"]):
    """Ask a shard for ``num_bytes`` in one of its shared-memory arenas; the producer
    writes the bytes there, then sends PutRowsShm for the extent."""

    num_bytes: int


class ShmReserved(_Msg):
    segment: str  # arena name under /dev/shm
    offset: int
    num_bytes: int


class PutRowsShm(Request["Ok"]):
    """As :class:`PutRows`, with the tensor bytes already written by the producer
    into an extent reserved with ReserveShm; the extent is the shard's again once
    every row in it is freed."""

    indices: list[int]
    segment: str
    extent_offset: int
    extent_bytes: int
    columns: dict[str, ShmColumn]  # ShmColumn.segments are all 0 (this segment)
    metas: list[RowMeta] = []


class GetRows(Request["Rows"]):
    indices: list[int]
    columns: list[str]
    shm: bool = False  # the reader shares this host: answer with arena offsets where possible


class Rows(_Msg):
    """Reply to GetRows: ``columns[name][k]`` is column ``name`` of ``indices[k]``;
    columns in ``shm_columns`` are read from the arenas named in ``shm_segments``."""

    indices: list[int]
    columns: dict[str, list[Tensor]]
    shm_columns: dict[str, ShmColumn] = {}
    shm_segments: list[str] = []


class FreeRows(Request["Ok"]):
    indices: list[int]


class SaveShard(Request["ShardSaved"]):
    path: str


class LoadShard(Request["ShardSaved"]):
    """Load rows saved by SaveShard, then notify every controller of them."""

    path: str


class ShardSaved(_Msg):
    num_rows: int
    num_bytes: int
    indices: list[int] = []  # after LoadShard: the rows now held


class GetShardStats(Request["ShardStats"]):
    pass


class ShardStats(_Msg):
    name: str
    num_rows: int
    num_bytes: int  # tensor bytes held now
    peak_bytes: int  # most tensor bytes held at once
    rss_bytes: int  # resident memory of the process now
    peak_rss_bytes: int  # resident memory high-water mark of the process
    shm_bytes: int = 0  # bytes of shared-memory segments owned
    peak_shm_bytes: int = 0  # most bytes of shared-memory segments owned at once


# -- control plane: shard -> controller, client -> controller -------------------


class RowsWritten(Request["Ok"]):
    """Tell: shard ``shard`` stored ``columns`` of ``indices`` (one message per put).
    ``inline``: the put's cells too, when the put is small (``tq/inline.py``)."""

    shard: int
    indices: list[int]
    columns: list[str]
    metas: list[RowMeta] = []
    inline: dict[str, list[Tensor]] = {}


class GetBatch(Request["BatchMeta"]):
    """Ask a task's controller for ``batch_size`` rows whose ``columns`` are all
    produced and not yet consumed by the task; they are marked consumed by
    ``consumer`` at once. Waits up to ``timeout_s`` unless ``partial`` (then answers
    at once with whatever is ready, possibly nothing). A ``partial`` request with
    ``min_rows`` waits in the controller until at least that many rows can be handed
    out, then takes up to ``batch_size``; at ``timeout_s``, or when its client sent a
    ``Wake`` after it (``wakes``: the client's count of Wake sent before it), it is
    answered with no rows."""

    consumer: str
    columns: list[str]
    batch_size: int
    policy: str = "fifo"  # "fifo" or "group" (whole prompt groups, never split)
    timeout_s: Wait = 30.0
    partial: bool = False
    filters: list[RowFilter] = []
    dp_size: int = 1  # > 1: split into dp_size parts of balanced total length
    ack: list[int] = []  # rows this consumer is done with, acked first (saves an Ack round trip)
    # the asking TQClient's id (fresh per client); after a Requeue of ``consumer`` its
    # earlier incarnations are refused. "" (an older client): not checked
    incarnation: str = ""
    min_rows: int = 0  # with partial: wait for at least this many rows (0: answer at once)
    wakes: int = 0  # Wake messages this incarnation had sent for the task when it sent this


class Wake(Request["Ok"]):
    """Answer the waiting GetBatch requests of client ``incarnation`` that it sent
    before its ``wakes``-th Wake with no rows now (its staleness bound moved: a new
    version was announced; or it must stop waiting: Pause, Stop). One that arrives
    after this Wake is answered at once, so the order of the two never matters."""

    consumer: str
    incarnation: str
    wakes: int


class BatchMeta(_Msg):
    """Metadata of a batch; ``parts`` lists positions into ``indices`` per dp rank.
    ``columns``: the requested columns themselves (``columns[name][k]`` of
    ``indices[k]``) when the rows are small and the controller holds them all; empty
    otherwise (read them from the shards)."""

    task: str
    indices: list[int]
    metas: list[RowMeta]
    shards: list[int]  # shard number of each row
    parts: list[list[int]] = []
    columns: dict[str, list[Tensor]] = {}


class Ack(Request["Ok"]):
    """A consumer finished ``indices``; they are never handed out again."""

    consumer: str
    indices: list[int]
    incarnation: str = ""  # as in GetBatch


class Requeue(Request["Requeued"]):
    """Return a (dead) consumer's handed-out, un-acked rows to the task's pool. Rows
    that already have every column of ``done_columns`` (the consumer's outputs: it
    died after putting them, before acking) are acked instead: redoing them would
    overwrite outputs that later roles may already have used. In the same step the
    consumer's waiting GetBatch requests are dropped and its incarnations seen so far
    are retired (their later requests are refused): a row written after the requeue
    goes to the restarted consumer (same name, new incarnation), never the dead one."""

    consumer: str
    done_columns: list[str] = []


class Requeued(_Msg):
    num_rows: int
    num_done: int = 0  # rows acked instead (their outputs were in)


class Discard(Request["Discarded"]):
    """Mark every known, unconsumed row that matches all ``filters`` as consumed and
    acked without handing it out (e.g. samples too stale to train on)."""

    filters: list[RowFilter]


class Discarded(_Msg):
    indices: list[int]
    keys: list[str] = []  # the rows' ``RowMeta.key``, in ``indices``' order


class ForgetRows(Request["Ok"]):
    """Tell from the manager: these rows are freed on the shards."""

    indices: list[int]


class FlushNotices(Request["Ok"]):
    """Ask a queue controller or the manager to deliver every notice it has queued
    (acks to the manager; frees to the shards and controllers) before it answers: the
    driver's stop asks the controllers, then the manager, so the queue's bookkeeping is
    settled before its processes stop (a notice to a stopped actor would wait out its
    timeout)."""


class SaveController(Request["Ok"]):
    path: str


class LoadController(Request["Ok"]):
    path: str


class GetTaskStatus(Request["TaskStatus"]):
    pass


class TaskStatus(_Msg):
    task: str
    num_rows: int  # rows known (written at least once, not freed)
    num_pending: dict[str, int]  # consumer -> rows handed out, not acked
    num_acked: int
    num_waiting: int  # GetBatch requests waiting
    acked: list[int] = []
    num_discarded: int = 0  # rows ever acked untrained by a Discard (since the controller started)


# -- manager --------------------------------------------------------------------------


class GetQueueInfo(Request["QueueInfo"]):
    pass


class QueueInfo(_Msg):
    shards: list[str]
    controllers: dict[str, str]  # task -> controller actor name
    stripe_rows: int
    capacity_rows: int


class Allocate(Request["Allocated"]):
    """Reserve indices for ``num_groups`` groups of ``group_size`` rows; waits
    (backpressure) while the queue holds ``capacity_rows`` live rows."""

    num_groups: int
    group_size: int = 1
    step: int = -1
    timeout_s: Wait = 60.0
    extra_groups: int = 0  # also reserve up to this many more groups if they fit now (never waits for them)
    headroom_rows: int = 0  # fit only while this many rows stay free after it (room kept for other allocations)


class Allocated(_Msg):
    metas: list[RowMeta]
    extra: list[RowMeta] = []  # the extra groups reserved, kept by the client for its next allocations


class RowsAcked(Request["Ok"]):
    """Tell from a controller: ``task`` is done with ``indices``."""

    task: str
    indices: list[int]


class Release(Request["Ok"]):
    """A producer gives back allocated rows it will not write; they are freed."""

    indices: list[int]


class SaveQueue(Request["QueueSaved"]):
    path: str


class LoadQueue(Request["QueueSaved"]):
    path: str


class QueueSaved(_Msg):
    num_rows: int
    num_bytes: int


class GetQueueStatus(Request["QueueStatus"]):
    pass


class QueueStatus(_Msg):
    num_live_rows: int
    capacity_rows: int
    num_waiting_allocations: int
    next_index: int
    num_freed_rows: int


ShardIn = Union[PutRows, ReserveShm, PutRowsShm, GetRows, FreeRows, SaveShard, LoadShard, GetShardStats, Ping, Stop]
ControllerIn = Union[
    RowsWritten,
    GetBatch,
    Wake,
    Ack,
    Requeue,
    Discard,
    ForgetRows,
    SaveController,
    LoadController,
    GetTaskStatus,
    FlushNotices,
    Ping,
    Stop,
]
ManagerIn = Union[GetQueueInfo, Allocate, RowsAcked, Release, SaveQueue, LoadQueue, GetQueueStatus, FlushNotices, Ping, Stop]
