"""Every wire message of asyncflow, in one module.

Rules (ARCHITECTURE.md: every wire message is a Struct here):
- Messages are frozen, ``kw_only``, tagged msgspec Structs. Each actor accepts one
  union (``DirectoryIn``, ``ShardIn``...), decoded by a ``Decoder`` built once.
- Schema evolution: new fields get defaults and are appended; types never change.
- Tensors travel as :class:`Tensor` (dtype + shape + raw bytes), never as lists. A
  received ``Tensor.data`` is a ``memoryview`` into the received frame: no copy is
  made when decoding.

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
from typing import Any, ClassVar, Generic, TypeVar, Union

import msgspec


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Base of every tagged wire message (the tag is the class name)."""


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
    timeout_s: float = 0.0  # the caller's deadline, for the server's logs


class ReplyHeader(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Header of a reply frame; the body follows when ``ok``."""

    ok: bool
    error_type: str = ""  # "remote" (handler raised), "rejected" (bad frame), "auth", "unknown_actor"
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
    wait_s: float = 0.0


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
    delay_s: float = 0.0  # when > 0, the echo actor answers after this delay (deferred)


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
    for, the policy version that produced it, and its lengths in tokens."""

    index: int
    group_id: int = -1
    group_size: int = 1
    step: int = -1
    version: int = -1
    prompt_len: int = -1
    response_len: int = -1
    weights_digest: int = 0  # of the weights that generated the row (engines/digest.py); 0: unknown


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
    at once with whatever is ready, possibly nothing)."""

    consumer: str
    columns: list[str]
    batch_size: int
    policy: str = "fifo"  # "fifo" or "group" (whole prompt groups, never split)
    timeout_s: float = 30.0
    partial: bool = False
    filters: list[RowFilter] = []
    dp_size: int = 1  # > 1: split into dp_size parts of balanced total length
    ack: list[int] = []  # rows this consumer is done with, acked first (saves an Ack round trip)
    # the asking TQClient's id (fresh per client); after a Requeue of ``consumer`` its
    # earlier incarnations are refused. "" (an older client): not checked
    incarnation: str = ""


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
    timeout_s: float = 60.0
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


# --------------------------------------------------------------------------------
# Workflow (owned by actors/)
# --------------------------------------------------------------------------------

# Worker roles (prompt loader, rollout, reference, reward, trainer, custom roles)
# are loop actors: StartWork starts their loop; Pause answers once the current
# unit of work is done and every row it took is acked (checkpoints use it).


class StartWork(Request["Ok"]):
    pass


class Pause(Request["Paused"]):
    pass


class Resume(Request["Ok"]):
    pass


class Paused(_Msg):
    """Reply to Pause; ``state`` is the role's own resumable state (msgpack)."""

    role: str
    state: bytes = b""


class GetRoleStats(Request["RoleStats"]):
    pass


class RoleStats(_Msg):
    """Time a role spent per activity since it started (seconds), and its gauges."""

    role: str
    busy_s: float
    wait_s: dict[str, float] = {}  # "data", "weights", "capacity"...
    version: int = -1  # policy version held (rollout) or produced (trainer)
    num_items: int = 0  # rows produced / consumed
    state: str = ""  # what it is doing now
    pid: int = 0
    counters: dict[str, float] = {}  # role-specific running totals (rollout: decode_steps, decode_rows)


# -- weights: trainer -> weight sync -> rollout replicas ---------------------------


class WeightsReady(Request["Ok"]):
    """Tell (weight sync -> rollout): version ``version`` can be fetched in ``num_chunks`` chunks."""

    version: int
    num_chunks: int
    num_bytes: int
    digest: int = 0  # weights_digest of the version (engines/digest.py); 0: unknown
    replicas: int = 0  # how many replicas this version was announced to; 0: unknown (a reply to GetLatestWeights)


class GetLatestWeights(Request["WeightsReady"]):
    pass


class GetWeightChunk(Request["WeightChunk"]):
    version: int
    index: int


class WeightChunk(_Msg):
    """Chunk ``index`` of weights ``version``: named tensors, in order. A tensor larger
    than a chunk comes as consecutive pieces under one name, cut along its first
    dimension (``actors/weights/_nng.py``)."""

    version: int
    index: int
    names: list[str]
    tensors: list[Tensor]


class AcquireSwap(Request["Ok"]):
    """Ask (rollout -> weight sync): may this replica swap weights now? Answered when
    no other replica is swapping (sub-step updates keep generation capacity > 0)."""

    replica: str
    version: int


class ReleaseSwap(Request["Ok"]):
    replica: str
    version: int


class StreamWeights(Request["WeightStream"]):
    """Ask (rollout -> weight sync; ``workflow.weight_transport = "collective"``): send
    the newest staged version over the two-member torch.distributed group ``group``
    (weight sync is rank 0 and hosts its store as ``dist.<group>``; the replica is
    rank 1). A group name not seen before for this replica replaces its old group.
    Answered at once with the layout; the bytes follow over the group, one
    broadcast per chunk."""

    replica: str
    group: str
    backend: str  # gloo, nccl or hccl: what the replica's device takes


class StreamChunk(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One broadcast of a weight stream: ``num_bytes`` bytes holding each tensor at its
    offset (aligned), C order."""

    num_bytes: int
    names: list[str]
    dtypes: list[str]  # torch names: float32, bfloat16, ...
    shapes: list[tuple[int, ...]]
    offsets: list[int]


class WeightStream(_Msg):
    """Reply to StreamWeights: the version being sent and its chunks' layout, or
    ``refused`` (why this side has no such collective: the replica uses nng)."""

    version: int
    chunks: list[StreamChunk] = []
    refused: str = ""


WeightRequest = Union[GetWeightChunk, StreamWeights]
"""What a replica's weight receiver asks for bytes: one message per transport, served by
the weights actor's sender (``actors/weights/``)."""


class GetReplicas(Request["Replicas"]):
    """Ask (trainer -> weight sync): the rollout replicas new weights are announced to
    now (the online planner may have added or removed some)."""


class Replicas(_Msg):
    names: list[str]


# -- metrics: roles -> collector (in the driver) ----------------------------------


class StepMetrics(Request["Ok"]):
    """Tell (trainer -> collector): one object per trainer step for metrics.jsonl."""

    step: int
    values: dict[str, float]


class Spans(Request["Ok"]):
    """Tell (any role -> collector): what the role did, as spans (wall-clock seconds).
    Sent in batches every half second, never through the data plane."""

    role: str
    pid: int
    names: list[str]
    starts_s: list[float]
    durations_s: list[float]
    counters: dict[str, float] = {}  # e.g. "version": the rollout's policy version
    versions: list[int] = []  # the role's policy version when each span began (-1: unknown)


class RunFinished(Request["Ok"]):
    """Tell (trainer -> collector): the last step is done and checkpointed."""

    last_step: int
    checkpoint: str


class RoleFailed(Request["Ok"]):
    """Tell (any role -> collector): the role's loop raised; the run cannot go on."""

    role: str
    error: str


# -- the online planner: moving workers between rollout and training ----------------


class SetThreads(Request["Ok"]):
    """Ask (planner -> a loop role): use ``num_threads`` torch intra-op threads from
    the next unit on (answered between units)."""

    num_threads: int


class RegisterReplica(Request["Ok"]):
    """Ask (driver -> weight sync): announce new weights to ``replica`` from now on."""

    replica: str


class UnregisterReplica(Request["Ok"]):
    """Ask (driver -> weight sync): ``replica`` is being stopped; stop telling it."""

    replica: str


class MoveApplied(Request["Ok"]):
    """Tell (driver -> planner): a move the planner asked for has been carried out
    (``ok``), or could not be (``error`` says why); the split is now as given."""

    ok: bool
    rollout_replicas: list[str]
    train_threads: int
    error: str = ""


class TrainPart(Request["Ok"]):
    """Tell (trainer rank 0 -> trainer rank r > 0): train step ``step`` on your part of
    the global batch: rows ``indices`` (read them from the shards yourself), of prompt
    groups ``group_ids`` (one per row). Every rank then runs the same collectives
    (gradients, figures, weight gather), so rank 0 tells every rank before its own part."""

    step: int
    indices: list[int]
    group_ids: list[int]
    columns: list[str]


class SaveRankCheckpoint(Request["Ok"]):
    """Tell (trainer rank 0 -> trainer rank r > 0): join the collective save of the
    model (and critic) into ``path`` (rank 0 writes the files)."""

    path: str


class RefillGroups(Request["Ok"]):
    """Tell (trainer rank 0 -> loader): dynamic sampling's step ``step`` has fewer
    informative prompt groups than it trains; load refill round ``round`` (1, 2, ...) of
    that step: another ``RunConfig.groups_per_step`` groups tagged with step ``step``, at
    the prompt positions of (step, round) (``actors/_dynamic_sampling.py``)."""

    step: int
    round: int


LoopIn = Union[StartWork, Pause, Resume, GetRoleStats, WeightsReady, SetThreads, Ping, Stop]
LoaderIn = Union[StartWork, Pause, Resume, GetRoleStats, SetThreads, RefillGroups, Ping, Stop]
TrainerRankIn = Union[StartWork, GetRoleStats, TrainPart, SaveRankCheckpoint, Ping, Stop]
WeightSyncIn = Union[
    GetLatestWeights,
    GetWeightChunk,
    StreamWeights,
    AcquireSwap,
    ReleaseSwap,
    RegisterReplica,
    UnregisterReplica,
    GetReplicas,
    Ping,
    Stop,
]
PlannerIn = Union[StepMetrics, MoveApplied, Ping, Stop]


# -- the driver -> its collector: what the driver's loop asks and tells ------------


class SetBusy(_Msg):
    """Tell (driver -> collector): every role's latest busy fraction, added to each
    following StepMetrics (``busy/<role>``) and to the progress line."""

    fractions: dict[str, float]


class WriteTrace(_Msg):
    """Ask (driver -> collector): write the trace to ``path`` now (at the end of a run).
    Answered with Ok once it is written."""

    path: str


class GetRunState(_Msg):
    """Ask (driver -> collector): how the run stands. Answered with RunState."""


class RunState(_Msg):
    """Reply to GetRunState."""

    finished: RunFinished | None
    """The trainer's RunFinished, once told."""
    failures: list[RoleFailed]
    """Every RoleFailed told so far, oldest first."""
    since_step_s: float
    """Seconds since the last StepMetrics (or since the collector started)."""
    last_spans: dict[str, tuple[str, float]]
    """Role -> (name, wall-clock end in s) of its last finished activity span."""
    slowest_step_s: float = 0.0
    """The longest step so far: the time between two StepMetrics (for the first step,
    its own ``step_time_s``); 0 before the first. The driver's stall timeout scales with it."""


CollectorIn = Union[StepMetrics, Spans, RunFinished, RoleFailed, SetBusy, WriteTrace, GetRunState, Ping, Stop]
