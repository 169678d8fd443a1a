"""The RL roles' wire messages: the worker loop (start, pause, stats), weight sync
(trainer -> weight sync -> rollout replicas), metrics to the driver's collector, the
online planner's moves, the trainer's ranks and each actor's inbox union. The
runtime's and the queue's messages are in ``core/protocol.py``, which knows no RL;
these follow its rules (frozen, ``kw_only``, tagged msgspec Structs; new fields get
defaults and are appended) and subclass its ``Request`` so that a reply's type is
checked the same way.
"""

from __future__ import annotations

from typing import Union

import msgspec

from asyncflow.core.protocol import Message, Ok, Ping, Request, Stop, Tensor  # noqa: F401  (Ok: the replies' forward references)

# --------------------------------------------------------------------------------
# Workflow
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


class Paused(Message):
    """Reply to Pause; ``state`` is the role's own resumable state (msgpack)."""

    role: str
    state: bytes = b""


class GetRoleStats(Request["RoleStats"]):
    pass


class RoleStats(Message):
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
    sources: list[str] = []
    """``weight_fanout = "tree"``: the relays (``relay.<replica>``, ``actors/weights/_relay.py``) this replica
    fetches the version from, its parent first, then each ancestor up the tree; the ``weights`` actor is the
    last source of all. Empty: fetch from ``weights`` (direct fan-out, or a child of the root)."""


class GetLatestWeights(Request["WeightsReady"]):
    pass


class GetWeightChunk(Request["WeightChunk"]):
    version: int
    index: int


class WeightChunk(Message):
    """Chunk ``index`` of weights ``version``: named tensors, in order. A tensor larger
    than a chunk comes as consecutive pieces under one name, cut along its first
    dimension (``actors/weights/nng.py``)."""

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


class WeightStream(Message):
    """Reply to StreamWeights: the version being sent and its chunks' layout, or
    ``refused`` (why this side has no such collective: the replica uses nng)."""

    version: int
    chunks: list[StreamChunk] = []
    refused: str = ""


class RelayChunk(Request["WeightChunk | RelayWait"]):
    """Ask (replica -> the relay of its parent in the fan-out tree, ``weight_fanout = "tree"``):
    chunk ``index`` of weights ``version``. The relay answers as soon as it holds the chunk,
    or after holding the request for about a second with ``RelayWait``."""

    version: int
    index: int


class RelayWait(Message):
    """Reply to RelayChunk: the relay does not hold the chunk yet. ``coming``: the relay is
    fetching ``version`` or was told of it (ask it again); false: it will not have it (ask
    the next source up the tree)."""

    version: int
    index: int
    coming: bool


class GetWeightSyncStats(Request["WeightSyncStats"]):
    """Ask (bench, tests -> weights): what the trainer's side has served so far."""


class WeightSyncStats(Message):
    num_bytes_served: int  # tensor bytes of the chunks served (GetWeightChunk)
    num_chunks_served: int


class GetFanoutRecord(Request["FanoutRecord"]):
    """Ask (bench, tests -> a light replica of ``bench/fanout.py``): what it received;
    answered once it holds ``version`` or newer (-1: at once)."""

    version: int = -1


class FanoutRecord(Message):
    """A light replica's weights so far: per version swapped in, the wall-clock time it
    was (``time.time()``) and the crc32 of its bytes (0: not checked); its receiver's and
    relay's byte counts (``weights/_relay.py``)."""

    name: str
    version: int
    swapped_at_s: dict[int, float]
    crc32: dict[int, int]
    num_bytes_from_root: int = 0
    num_bytes_relayed: int = 0
    num_relay_bytes_served: int = 0
    num_fallbacks: int = 0
    errors: list[str] = []


WeightRequest = Union[GetWeightChunk, StreamWeights]
"""What a replica's weight receiver asks for bytes: one message per transport, served by
the weights actor's sender (``actors/weights/``)."""


class GetReplicas(Request["Replicas"]):
    """Ask (weight sync, trainer -> roster, in the driver): the rollout replicas the run
    has now (the online planner may have added or removed some; the Supervisor's record
    is the one list of them)."""


class Replicas(Message):
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
    ended: str = ""  # why the run ended before its last step (the agents stopped sending); "" at the last step


class RoleFailed(Request["Ok"]):
    """Tell (any role -> collector): the role's loop raised; the run cannot go on."""

    role: str
    error: str


# -- the online planner: moving workers between rollout and training ----------------


class SetThreads(Request["Ok"]):
    """Ask (planner -> a loop role): use ``num_threads`` torch intra-op threads from
    the next unit on (answered between units)."""

    num_threads: int


class ReplicaRemoved(Request["Ok"]):
    """Ask (driver -> weight sync): the online planner is stopping ``replica`` (it has left
    the roster): release what the weight sync holds for it, its swap grant (a replica
    stopped between AcquireSwap and ReleaseSwap would hold the others' swaps) and its
    channel (a collective group). ``dead`` (told, by the Supervisor as it handles the
    death of a replica's process, which it restarts under the same name): only its swap
    grant and its AcquireSwap waiting in line are dropped; it stays a replica."""

    replica: str
    dead: bool = False


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
    versions: list[int] = []
    """The policy version that generated each row (losses that read staleness)."""


class SaveRankCheckpoint(Request["Ok"]):
    """Tell (trainer rank 0 -> trainer rank r > 0): join the collective save of the
    model (and critic) into ``path`` (rank 0 writes the files)."""

    path: str


class RefillGroups(Request["Ok"]):
    """Tell (trainer rank 0 -> loader): dynamic sampling's step ``step`` has fewer
    informative prompt groups than it trains; load refill round ``round`` (1, 2, ...) of
    that step: another ``RunConfig.groups_per_step`` groups tagged with step ``step``, at
    the prompt positions of (step, round) (``actors/trainer/sources/dynamic.py``)."""

    step: int
    round: int


# -- evaluation in a process of its own: trainer <-> evaluator (actors/evaluation/) -------


class Evaluate(Request["Ok"]):
    """Tell (trainer -> evaluator): evaluate the policy version ``version`` (0 with
    ``start``: the weights the run starts from, which the evaluator's engine is built
    with), or the newest staged after it; its figures belong to metrics record ``step``.
    ``last``: the run's last evaluation, which the trainer waits for (the evaluator takes
    the trainer's threads for it: training is over)."""

    step: int
    version: int
    start: bool = False
    last: bool = False


class Evaluated(Request["Ok"]):
    """Tell (evaluator -> trainer): the figures (``val/*``) of one ``Evaluate``: of
    ``version``, the version it evaluated (the one asked for, or newer when the weights
    actor had moved on), for metrics record ``step``; ``error``: why there are none. No
    values and no error: skipped, a newer version had been evaluated already."""

    step: int
    version: int
    start: bool = False
    values: dict[str, float] = {}
    error: str = ""


LoopIn = Union[StartWork, Pause, Resume, GetRoleStats, WeightsReady, SetThreads, Ping, Stop]
TrainerIn = Union[StartWork, Pause, Resume, GetRoleStats, SetThreads, Evaluated, Ping, Stop]
EvaluatorIn = Union[StartWork, Pause, Resume, GetRoleStats, SetThreads, Evaluate, Ping, Stop]
LoaderIn = Union[StartWork, Pause, Resume, GetRoleStats, SetThreads, RefillGroups, Ping, Stop]
TrainerRankIn = Union[StartWork, GetRoleStats, TrainPart, SaveRankCheckpoint, Ping, Stop]
WeightSyncIn = Union[
    GetLatestWeights,
    GetWeightChunk,
    StreamWeights,
    AcquireSwap,
    ReleaseSwap,
    ReplicaRemoved,
    GetWeightSyncStats,
    Ping,
    Stop,
]
RelayIn = Union[RelayChunk, Ping, Stop]
FanoutReplicaIn = Union[WeightsReady, GetFanoutRecord, Ping, Stop]
RosterIn = Union[GetReplicas, Ping, Stop]
PlannerIn = Union[StepMetrics, MoveApplied, Ping, Stop]


# -- the driver -> its collector: what the driver's loop asks and tells ------------


class SetBusy(Message):
    """Tell (driver -> collector): every role's latest busy fraction, added to each
    following StepMetrics (``busy/<role>``) and to the progress line."""

    fractions: dict[str, float]


class WriteTrace(Message):
    """Ask (driver -> collector): write the trace to ``path`` now (at the end of a run).
    Answered with Ok once it is written."""

    path: str


class GetRunState(Message):
    """Ask (driver -> collector): how the run stands. Answered with RunState."""


class RunState(Message):
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
    num_steps: int = 0
    """StepMetrics taken so far (the driver polls the roles' busy time once per new step)."""


CollectorIn = Union[StepMetrics, Spans, RunFinished, RoleFailed, SetBusy, WriteTrace, GetRunState, Ping, Stop]
