"""RolloutActor: one rollout replica, the thin actor. It sets up the engine, the
weight inbox, the gateway, the scorer and the environment driver, and hands each
``work_once`` to its mode:

- ``unit.py`` (default): one generate call per unit of ``prompts_per_call`` whole
  prompt groups, admitted under the staleness bound (``s <= version + k``); with an
  environment (``[env] path``) one multi-turn trajectory per row (``multiturn.py``,
  docs/environments.md);
- ``stream.py`` (``[workflow] partial_rollout``): one continuous generation stream
  that groups join and leave, with weights swapped in between two decode steps; each
  token records its version (``token_versions``); with an environment the stream
  decodes the trajectories' turns (``multiturn.TurnStream``);
- ``serve.py`` (``[rollout.gateway] train``): no queue rows, only weight swaps; the
  gateway's rewarded sessions are the run's data (docs/gateway.md).

Every mode packs its rows with ``pack.py`` (``response_ids`` int64, ``rollout_logp``
float32, ``finish`` uint8, stamped with the version and the weights digest).

Delayed parameter update (``WeightInbox``, ``inbox.py``): ``WeightsReady`` starts a
background fetch of the new weights into a host buffer while generation goes on with
the old ones; the swap onto the device happens between units (``AcquireSwap`` first:
with sub-step updates, replicas swap one at a time). How the bytes travel is the
business of a ``WeightReceiver`` (``actors/weights/``), chosen once from
``[workflow] weight_transport``: nng chunks, a per-replica torch.distributed group, or the
trainer's version mapped from shared memory (or a CUDA IPC handle) on its host.

Version integrity (``workflow.verify_weights``): every row is stamped with the
weights digest (``engines/digest.py``) of the weights that generated it: the
engine's own, read back after each swap and checked against the digest of the
tensors it was sent, or, for an engine that cannot read its weights back, the
digest of those tensors. A generate call during which the engine's version or
weights changed fails the unit. The trainer checks each row's digest against the
version the row is tagged with.

With ``reward.placement = "rollout"`` the replica scores its own rows with the
reward functions (``actors/runtime/scoring.py``, activity "score") and puts ``reward`` with
the responses: there is no reward role.

Takes: LoopActor messages + WeightsReady. Sends: GetLatestWeights, AcquireSwap,
ReleaseSwap and its receiver's requests (to ``weights``); TQ reads and writes.
Invariant (each mode's docstring says how): every row a unit took is put before the
next unit starts, and acked inside the next unit's first request (or at Pause/Stop).
If the process dies, the launcher acks the rows whose outputs are in and requeues the
others: a response is never generated twice for one row.
"""

from __future__ import annotations

import logging
import threading

import msgspec

from asyncflow.actors.rollout.inbox import FETCH_SPAN, WeightInbox
from asyncflow.actors.rollout.serve import ServeOnly
from asyncflow.actors.rollout.stream import PartialRollout
from asyncflow.actors.rollout.unit import UnitRollout
from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.acks import DeferredAcks
from asyncflow.actors.runtime.loop import LoopActor
from asyncflow.actors.runtime.run_dir import Run, set_threads
from asyncflow.actors.runtime.scoring import Scorer
from asyncflow.actors.weights import build_receiver
from asyncflow.config import names
from asyncflow.config.names import WEIGHTS
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient
from asyncflow.engines.config import VLLM_TYPES
from asyncflow.engines.device import torch_dtype
from asyncflow.gateway.replica import serve_for_replica
from asyncflow.planner import memory
from asyncflow.planner.models import Lora

log = logging.getLogger(__name__)

ANNOUNCE_WAIT_S = 0.05
"""How long a partial-rollout replica (``stream.py``) held back by the staleness gate
waits before it looks at the queue again; the planner's predictions take it as
``poll_s`` (cli/predict.py passes it). A unit-mode replica does not poll: its GetBatch
waits in the queue (``QUEUE_WAIT_S``) and is woken by the next announcement."""

QUEUE_WAIT_S = 30.0
"""How long a unit-mode replica's GetBatch waits in the queue for admissible rows; it
comes back at once on a new version's announcement, a Pause or a Stop (``TQClient.wake``),
so this bounds only how often an idle replica asks (a short wait would have hundreds of
idle replicas keep the queue host busy answering them)."""


class RolloutActor(LoopActor):
    Urgent = LoopActor.Urgent + (messages.WeightsReady,)  # start fetching at once, even mid-generation
    Heralded = (messages.Pause, protocol.Stop)  # cut short a GetBatch waiting in the queue
    announce_wait_s = ANNOUNCE_WAIT_S  # read by the modes (unit.py, stream.py)
    queue_wait_s = QUEUE_WAIT_S
    acks: DeferredAcks  # not None: set in __init__ (this role acks with its next request)

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        from asyncflow.engines.factory import build_rollout_engine

        self.run = Run(run_dir)
        cfg = self.run.config
        set_threads(cfg)
        self.engine = build_rollout_engine(cfg.rollout.engine, self.run.launch.model_dir, version=self.run.launch.start_step)
        tokenizer = self.run.hf_tokenizer()
        stop = cfg.rollout.sampling.stop_token_ids or (tokenizer.eos_token_id,)
        self.params = msgspec.structs.replace(cfg.rollout.sampling, n=cfg.algorithm.group_size, stop_token_ids=tuple(stop))
        self.k = cfg.staleness
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.acks = DeferredAcks(self.tq)
        receiver = build_receiver(
            cfg.workflow.weight_transport,
            ctx,
            cfg.workflow.weight_timeout_s,
            device=cfg.cluster.device,
            engine=self.engine,
            fanout=cfg.workflow.weight_fanout,  # tree: a relay for this replica's children beside it (weights/_relay.py)
            link_mb_s=cfg.workflow.weight_link_mb_s,  # emulation only: the relay's uplink
        )
        # held around every generate call and weight swap: the gateway (docs/gateway.md) shares the engine
        self.engine_lock = threading.Lock()
        # announced -> fetched -> swapped in (actors/rollout/inbox.py)
        self.inbox = WeightInbox(
            ctx.name,
            self.engine,
            self.engine_lock,
            receiver,
            lambda: ctx.ref(WEIGHTS),
            staleness=self.k,
            verify=cfg.workflow.verify_weights != "off",
            dtype=torch_dtype(cfg.rollout.engine.dtype),
            timeout_s=cfg.workflow.weight_timeout_s,
            activity=self.activity,
        )
        self.inbox.on_fetched = self._fetched_span
        self.gateway = serve_for_replica(
            cfg.rollout.gateway,
            roles.index_of(ctx.name),
            run_dir,
            self.engine,
            tokenizer,
            self.params,
            self.engine_lock,
            ctx.transport.secret_bytes(),
            digest=lambda: self.inbox.digest,
            # its own client, with no spare rows: a killed replica leaves no allocated row unwritten
            queue=TQClient(ctx.directory, consumer=f"{ctx.name}.gateway", reserve_rows=0) if cfg.rollout.gateway.train else None,
            group_size=cfg.algorithm.group_size,
            streamed=cfg.rollout_streams,  # its requests join the partial-rollout stream (stream.py)
            context_tokens=self.run.context_tokens(),
            per_step=cfg.samples_per_step,  # new sessions paced to what the trainer takes (gateway/pacing.py)
            staleness=cfg.staleness,
            num_replicas=cfg.rollout.num_replicas,
            launch=self.run.launch,  # a resume writes again what the checkpoint's queue lacks (gateway/resume.py)
            saved=self.run.role_state(ctx.name),
        )
        self._decode_steps = self._decode_rows = 0  # counters(): decode forwards, sequences decoded
        # reward.placement = "rollout": the reward functions score each unit's rows here, put with the responses
        self.scorer = Scorer(cfg, tokenizer) if cfg.reward.placement == "rollout" else None
        self.multiturn: MultiTurnDriver | None = None  # [env] path: trajectories of turns and environment steps
        if cfg.env.path:
            from asyncflow.actors.rollout.multiturn import MultiTurnDriver

            self.multiturn = MultiTurnDriver(cfg.env, tokenizer, context_tokens=self.run.context_tokens())
        # how units are generated: one call per unit (unit.py), or one continuous stream whose
        # weights swap between decode steps ([workflow] partial_rollout: stream.py)
        self.mode: UnitRollout | PartialRollout | ServeOnly = (
            PartialRollout(self)  # with [rollout.gateway] train, a stream of the gateway's requests alone
            if cfg.rollout_streams
            else ServeOnly(self)  # [rollout.gateway] train: the gateway's sessions are the data (serve.py)
            if cfg.rollout.gateway.train and cfg.rollout.gateway.enabled
            else UnitRollout(self)
        )

    @property
    def version(self) -> int:
        return self.engine.version

    # -- weights -----------------------------------------------------------------
    def handle_urgent(self, msg: messages.WeightsReady):
        """On the listener thread: start the background fetch now."""
        if not isinstance(msg, messages.WeightsReady):
            return super().handle_urgent(msg)
        self.inbox.announce(msg)
        self._wake_get_batch()  # a GetBatch waiting under the old staleness bound asks again
        return protocol.Ok()

    def resumable_state(self) -> bytes:
        """With ``[rollout.gateway] train``: the sessions the gateway wrote to the queue,
        its writes held until ``on_resume`` (the checkpoint saves the queue meanwhile)."""
        if self.gateway is None or self.gateway.feed is None:
            return b""
        from asyncflow.gateway.resume import encode_state

        return encode_state(self.gateway.hold_writes())

    def on_resume(self) -> None:
        if self.gateway is not None and self.gateway.feed is not None:
            self.gateway.release_writes()

    def on_arrival(self, msg) -> None:
        """Pause or Stop: a GetBatch waiting in the queue comes back now, so the unit ends."""
        self._wake_get_batch()

    def _wake_get_batch(self) -> None:
        """Wake this replica's waiting GetBatch of the rollout task; a replica whose data is
        the gateway's sessions ([rollout.gateway] train) has no such task and nothing waits."""
        if not self.run.config.data_from_gateway:
            self.tq.wake(names.TASK_ROLLOUT)

    def _fetched_span(self, start: float, seconds: float) -> None:
        """A weight fetch staged (the fetch thread): a span of the trace (inbox.FETCH_SPAN)."""
        tracer = self.clock.tracer
        if tracer is not None:
            tracer.span(self.ctx.name, FETCH_SPAN, start, seconds)

    def count_decode(self, stats) -> None:
        """Add a native engine's decode figures (``SchedulerStats``) of one generate call."""
        if stats is not None and hasattr(stats, "decode_rows"):
            self._decode_steps += stats.num_steps
            self._decode_rows += stats.decode_rows

    def counters(self) -> dict[str, float]:
        """Decode forwards and sequences decoded so far (their ratio: the mean decode batch)."""
        steps, rows = self._decode_steps, self._decode_rows
        stream_stats = getattr(self.mode.stream, "stats", None) if isinstance(self.mode, PartialRollout) else None
        if stream_stats is not None:
            steps, rows = steps + stream_stats.num_steps, rows + stream_stats.decode_rows
        out = {"decode_steps": float(steps), "decode_rows": float(rows)} if steps else {}
        if self.gateway is not None:
            out.update(self.gateway.counters())  # gateway/sessions_*: queued, dropped unrewarded or group incomplete
        out.update(self.inbox.receiver.counters())  # weights/*: the relay tree's bytes (weight_fanout = "tree")
        return out

    def on_start(self) -> None:
        # a (re)started replica catches up with the newest published weights first; no weights actor
        # yet (the trainer starts later): nothing newer than the model dir. One that does not answer
        # is asked again in the background: the replica starts anyway (inbox.py, catch_up)
        self.inbox.catch_up(
            lambda: self.ctx.ref(WEIGHTS, wait_s=0.2).ask(messages.GetLatestWeights(), timeout_s=10),
            on_news=self._wake_get_batch,
        )

    def work_once(self) -> bool:
        return self.mode.work_once()

    def on_stop(self) -> None:
        # each part closes even if another fails to (a failing close is logged, not raised)
        parts = (
            ("rollout mode", self.mode),
            ("environment driver", self.multiturn),
            ("gateway", self.gateway),
            ("weight receiver", self.inbox),
        )
        for name, part in parts:
            if part is None:
                continue
            try:
                part.close()
            except Exception:
                log.exception("%s: closing the %s failed", self.ctx.name, name)
        super().on_stop()

    def on_failure(self, *exc_info) -> None:
        if self.gateway is not None:  # stop serving with an engine whose replica is gone
            self.gateway.close()
        super().on_failure(*exc_info)


def replica_memory(cfg, facts: memory.MemoryFacts) -> float:
    """A replica's weights, its KV budget, the staged next version, and with LoRA on the
    native or hf engine the base of each adapted weight it keeps beside the merged one. An
    emulated replica holds no model: a few small tensors, counted as nothing."""
    if cfg.rollout.engine.type == "emulated":
        return 0.0
    shape, b = facts.shape, memory.DTYPE_BYTES[cfg.rollout.engine.dtype]
    eng = cfg.rollout.engine
    kv = eng.kv_cache_bytes or (memory.DEFAULT_KV_BYTES if eng.kv_cache_fraction is None else 0)
    base_copies = memory.adapted_weight_params(shape, Lora.of(cfg.train.engine.lora)) if eng.type not in VLLM_TYPES else 0
    # the relay tree: the received chunks of the two newest versions stay for the replica's children
    relayed = 2 * memory.synced_params(cfg, shape) * 4 if cfg.workflow.weight_fanout == "tree" else 0
    return shape.num_params * b + kv + memory.synced_params(cfg, shape) * 4 + base_copies * b + relayed


# -- the role, as the driver sees it (actors/driver/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.ROLLOUT,
    actor=RolloutActor,
    instances=roles.numbered(names.ROLLOUT, lambda cfg: cfg.rollout.num_replicas),
    task=names.TASK_ROLLOUT,
    takes_task=lambda cfg: not cfg.data_from_gateway,  # serve.py: the gateway's sessions are the data
    outputs=("response_ids", "rollout_logp", "finish"),
    restartable=True,
    device=roles.Devices.ONE,
    devices_used=lambda cfg: [("rollout.engine.device", cfg.rollout.engine.device)],
    memory=replica_memory,
    # a process's runtime, shared by the replicas packed into it (cluster.actors_per_process)
    working_memory=lambda cfg, facts: float(memory.PROCESS_BYTES) / cfg.cluster.actors_per_process,
    step_work=lambda cfg, cores: roles.StepWork(
        what="generation",
        flops_per_param_token=2,
        units=roles.compute_units(
            cfg, cores, cfg.rollout.num_replicas, cfg.rollout.engine.num_threads, cfg.rollout.engine.tensor_parallel_size
        ),
        efficiency="prefill",
        bfloat16=cfg.rollout.engine.dtype == "bfloat16",
    ),
)
