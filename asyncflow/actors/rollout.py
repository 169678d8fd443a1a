"""RolloutActor: one rollout replica. Generates responses for prompt groups.

Each unit: take up to ``prompts_per_call`` whole prompt groups from the ``rollout``
task whose planned step s satisfies ``s <= version + k`` (the staleness bound:
rollout stops admitting prompts rather than run further ahead), generate the
group's ``group_size`` responses, put ``response_ids`` (int64), ``rollout_logp``
(float32) and ``finish`` (uint8, 1 = stop token) with the policy version, ack (with
the next request, ``_acks.py``).

With an environment (``[env] path``), a unit drives one multi-turn trajectory per
row instead (``_multiturn.py``, docs/environments.md) and puts ``loss_mask``,
``env_reward``, ``env_error`` and ``env_tool_calls`` too; every turn of a unit comes
from the weights the unit started with.

Delayed parameter update: ``WeightsReady`` starts a background fetch of the new
weights into a host buffer while generation goes on with the old ones; the swap
onto the device happens between units (``AcquireSwap`` first: with sub-step
updates, replicas swap one at a time). How the bytes travel is the business of a
``WeightReceiver`` (``actors/weights/``), chosen once from ``[workflow]
weight_transport``: nng chunks, or a per-replica torch.distributed group.

Version integrity (``workflow.verify_weights``): every row is stamped with the
weights digest (``engines/digest.py``) of the weights that generated it: the
engine's own, read back after each swap and checked against the digest of the
tensors it was sent, or, for an engine that cannot read its weights back, the
digest of those tensors. A generate call during which the engine's version or
weights changed fails the unit. The trainer checks each row's digest against the
version the row is tagged with.

Partial rollout (``[workflow] partial_rollout``, ``_partial.py``): the replica
generates as one stream that groups join and leave, and staged weights swap in
between two decode steps; each token records its version (``token_versions``) and
a row is tagged with its oldest token's version and that version's digest.

With ``reward.placement = "rollout"`` the replica scores its own rows with the
reward functions (``_scoring.py``, activity "score") and puts ``reward`` with the
responses: there is no reward role.

Takes: LoopActor messages + WeightsReady. Sends: GetLatestWeights, AcquireSwap,
ReleaseSwap and its receiver's requests (to ``weights``); TQ reads and writes.
Invariant (unit by unit; partial rollout: ``_partial.py``): every row a unit took is
put before the next unit starts, and acked inside the next unit's first request (or
at Pause/Stop). If the process dies, the launcher acks the rows whose outputs are in
and requeues the others: a response is never generated twice for one row.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import msgspec
import numpy as np

from asyncflow.actors import names, roles
from asyncflow.actors._acks import DeferredAcks
from asyncflow.actors._loop import LoopActor
from asyncflow.actors._partial import PartialRollout
from asyncflow.actors._run import Run, set_threads
from asyncflow.actors._scoring import Scorer
from asyncflow.actors.names import TASK_ROLLOUT, WEIGHTS
from asyncflow.actors.weights import build_receiver
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient
from asyncflow.engines.device import torch_dtype
from asyncflow.engines.digest import weights_digest
from asyncflow.gateway.replica import serve_for_replica

log = logging.getLogger(__name__)

ANNOUNCE_WAIT_S = 0.05
"""How long a replica held back by the staleness gate waits for the trainer's next
announcement (which wakes it at once) before it looks at the queue again; the
planner's predictions take it as ``poll_s`` (cli/predict.py passes it)."""


def swap_grant_needed(staleness: int, announcement: protocol.WeightsReady | None) -> bool:
    """Whether a replica asks for the swap grant (AcquireSwap, ReleaseSwap) before it swaps.
    The grant keeps the other replicas generating while one swaps (sub-step updates). In sync
    (k = 0) every replica is held back until it swaps, so there is nothing to keep going; a
    replica the newest version was announced to alone has no other replica to take turns with
    (one that registers meanwhile can swap alongside it once: a moment of lower capacity, never
    a wrong row). Unknown (no announcement, or ``replicas`` 0): ask."""
    if staleness == 0:
        return False
    return announcement is None or announcement.replicas != 1


class RolloutActor(LoopActor):
    Urgent = LoopActor.Urgent + (protocol.WeightsReady,)  # start fetching at once, even mid-generation
    announce_wait_s = ANNOUNCE_WAIT_S  # read by _partial.py
    acks: DeferredAcks  # not None: set in __init__ (this role acks with its next request)

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        from asyncflow.engines.factory import build_rollout_engine

        self.run = Run(run_dir)
        cfg = self.run.config
        set_threads(cfg)
        self.engine = build_rollout_engine(cfg.rollout.engine, self.run.launch.model_dir, version=self.run.launch.start_step)
        tokenizer = self.run.tokenizer()
        stop = cfg.rollout.sampling.stop_token_ids or (tokenizer.eos_token_id,)
        self.params = msgspec.structs.replace(cfg.rollout.sampling, n=cfg.algorithm.group_size, stop_token_ids=tuple(stop))
        self.k = cfg.staleness
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.acks = DeferredAcks(self.tq)
        self._lock = threading.Lock()
        self._wanted = -1  # newest version announced
        self._announcement: protocol.WeightsReady | None = None  # the newest WeightsReady (its chunks, its digest)
        self._staged: tuple[int, list, int] | None = None  # (version, tensors, digest) fetched, not yet swapped in
        self._verify = cfg.workflow.verify_weights != "off"
        self._dtype = torch_dtype(cfg.rollout.engine.dtype)
        self._digest = (self.engine.weights_digest() or 0) if self._verify else 0  # of the weights held
        self._fetching = False
        self._fetched = threading.Event()  # set when a fetch stages new weights
        self._announced = threading.Event()  # set when WeightsReady arrives: wakes a gated wait at once
        self.receiver = build_receiver(
            cfg.workflow.weight_transport, ctx, cfg.workflow.weight_timeout_s, device=cfg.cluster.device, engine=self.engine
        )
        # held around every generate call and weight swap: the gateway (docs/gateway.md) shares the engine
        self.engine_lock = threading.Lock()
        self.gateway = serve_for_replica(
            cfg.rollout.gateway,
            roles.index_of(ctx.name),
            run_dir,
            self.engine,
            tokenizer,
            self.params,
            self.engine_lock,
            ctx.transport.secret_bytes(),
        )
        self._decode_steps = self._decode_rows = 0  # counters(): decode forwards, sequences decoded
        # [workflow] partial_rollout: one continuous stream, weights swapped between decode steps (_partial.py)
        self._partial = PartialRollout(self) if cfg.workflow.partial_rollout else None
        # reward.placement = "rollout": the reward functions score each unit's rows here, put with the responses
        self.scorer = Scorer(cfg, tokenizer) if cfg.reward.placement == "rollout" else None
        self.multiturn = None  # [env] path set: trajectories of turns and environment steps (actors/_multiturn.py)
        if cfg.env.path:
            from asyncflow.actors._multiturn import MultiTurnDriver

            self.multiturn = MultiTurnDriver(cfg.env, tokenizer)

    @property
    def version(self) -> int:
        return self.engine.version

    # -- weights -----------------------------------------------------------------
    def handle_urgent(self, msg: protocol.WeightsReady):
        """On the listener thread: start the background fetch now."""
        if not isinstance(msg, protocol.WeightsReady):
            return super().handle_urgent(msg)
        if msg.version > self.engine.version:
            with self._lock:
                if self._announcement is None or msg.version > self._announcement.version:
                    self._announcement = msg
            self._want(msg.version)
            self._announced.set()
        return protocol.Ok()

    def _want(self, version: int) -> None:
        with self._lock:
            self._wanted = max(self._wanted, version)
            if self._fetching:
                return
            self._fetching = True
        threading.Thread(target=self._fetch_loop, name=f"{self.ctx.name}-weights", daemon=True).start()

    def _fetch_loop(self) -> None:
        """Background: fetch announced versions into host (or device) buffers until up to date."""
        weights = self.ctx.ref(WEIGHTS)
        while True:
            with self._lock:
                target = self._wanted
                have = self._staged[0] if self._staged else self.engine.version
                if target <= have:
                    self._fetching = False
                    return
                announced = self._announcement if self._announcement and self._announcement.version == target else None
            try:
                version, tensors = self.receiver.fetch(weights, announced=announced)
            except Exception as exc:  # a failed fetch is retried at the next announcement
                log.warning("%s: fetching weights failed: %s", self.ctx.name, exc)
                with self._lock:
                    self._fetching = False
                return
            # the digest the trainer published with the version (its snapshot, in the rollout's dtype); the
            # swap checks the engine's weights against it. Without one, that of the tensors received.
            if announced is not None and announced.version == version and announced.digest:
                digest = announced.digest
            else:
                digest = weights_digest(tensors, self._dtype) if self._verify else 0
            with self._lock:
                self._staged = (version, tensors, digest)
            self._fetched.set()

    def _wait_fetched(self) -> None:
        """Wait (at most 1 s, then look again) until the announced weights are staged."""
        with self.activity("wait_weights"):
            self._fetched.wait(timeout=1.0)
            self._fetched.clear()

    def _maybe_swap(self) -> None:
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is None or staged[0] <= self.engine.version:
            return
        version, tensors, digest = staged
        weights = self.ctx.ref(WEIGHTS)
        locked = swap_grant_needed(self.k, self._announcement)
        if locked:
            with self.activity("wait_swap"):
                weights.ask(protocol.AcquireSwap(replica=self.ctx.name, version=version), timeout_s=600)
        try:
            with self.activity("swap_weights"), self.engine_lock:
                self.engine.load_weights(tensors, version)
                held = self.engine.weights_digest() if self._verify else None
        finally:
            if locked:
                weights.ask(protocol.ReleaseSwap(replica=self.ctx.name, version=version), timeout_s=30)
        if held is not None and held != digest:
            raise RuntimeError(
                f"{self.ctx.name}: after loading weights v{version} the engine holds weights with digest "
                f"{held:x}, not the {digest:x} of the weights it was sent: its load_weights did not copy "
                "every tensor (a name it skips, a dtype it mangles?), or they changed on the way"
            )
        self._digest = held if held is not None else digest

    def _swap_to(self, target: int) -> None:
        """Swap in weights of at least version ``target`` (announced, maybe still being
        fetched) before generating rows admitted for it; a fetch that failed is started
        again. Raises after ``workflow.weight_timeout_s`` without them: the unit fails and
        its rows go back to the queue, never generated by older weights than they need."""
        deadline = time.monotonic() + self.run.config.workflow.weight_timeout_s
        while True:
            self._maybe_swap()
            if self.engine.version >= target:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.ctx.name}: weights v{target} were announced but not fetched within "
                    f"workflow.weight_timeout_s = {self.run.config.workflow.weight_timeout_s:g} s (the engine holds "
                    f"v{self.engine.version}); is the trainer's process alive? Otherwise raise weight_timeout_s"
                )
            self._want(target)  # no-op while a fetch runs; starts one again if the last failed
            self._wait_fetched()

    def _count_decode(self, stats) -> None:
        """Add a native engine's decode figures (``SchedulerStats``) of one generate call."""
        if stats is not None and hasattr(stats, "decode_rows"):
            self._decode_steps += stats.num_steps
            self._decode_rows += stats.decode_rows

    def counters(self) -> dict[str, float]:
        """Decode forwards and sequences decoded so far (their ratio: the mean decode batch)."""
        steps, rows = self._decode_steps, self._decode_rows
        stream_stats = getattr(self._partial.stream, "stats", None) if self._partial is not None else None
        if stream_stats is not None:
            steps, rows = steps + stream_stats.num_steps, rows + stream_stats.decode_rows
        return {"decode_steps": float(steps), "decode_rows": float(rows)} if steps else {}

    def on_start(self) -> None:
        # a (re)started replica catches up with the newest published weights first
        try:
            latest = self.ctx.ref(WEIGHTS, wait_s=0.2).ask(protocol.GetLatestWeights(), timeout_s=10)
        except LookupError:
            return  # the trainer has not started yet: nothing newer than the model dir
        if latest.version > self.engine.version:
            self._want(latest.version)

    # -- work --------------------------------------------------------------------
    def work_once(self) -> bool:
        if self._partial is not None:
            return self._partial.work_once()
        cfg = self.run.config
        self._maybe_swap()
        if self.engine.version >= cfg.train.num_steps:
            return False
        G = cfg.algorithm.group_size
        # The unit runs on the newest version announced: its rows may be of steps up to that
        # version + k, asked for while its weights are still being fetched (the queue's round
        # trip overlaps the fetch) and generated only once they are swapped in (_swap_to).
        self._announced.clear()  # any announcement so far is in _wanted
        target = max(self.engine.version, self._wanted)
        max_step = target + self.k
        with self.activity("get"):
            batch = self.tq.get_batch(
                TASK_ROLLOUT,
                ["prompt_ids", "answer"] if self.multiturn or self.scorer else ["prompt_ids"],
                cfg.rollout.prompts_per_call * G,
                policy="group",
                partial=True,
                max_step=max_step,
                ack=self.acks.take(TASK_ROLLOUT),
            )
        if len(batch) == 0:
            if self._wanted > self.engine.version:  # gated by staleness, new weights on the way
                self._wait_fetched()
                return True
            # Nothing admissible: the staleness gate holds and the trainer has not announced
            # the next version (the usual case: the loader keeps rows of later steps queued),
            # or no prompts yet. Wait for the announcement, which wakes this at once (a
            # blocking get would sit through it), or 50 ms, then look again.
            with self.activity("wait_data"):
                if self._announced.wait(timeout=ANNOUNCE_WAIT_S):
                    self._announced.clear()
                return True
        if target > self.engine.version:
            self._swap_to(target)
        groups: dict[int, list[int]] = {}  # group id -> positions in the batch
        for pos, meta in enumerate(batch.metas):
            groups.setdefault(meta.group_id, []).append(pos)
        version, digest = self.engine.version, self._digest
        if self.multiturn is not None:
            return self._work_multiturn(batch, version, digest)
        with self.activity("generate"):
            prompts = [batch.columns["prompt_ids"][positions[0]].tolist() for positions in groups.values()]
            with self.engine_lock:
                completions = self.engine.generate(prompts, self.params)  # ordered (prompt, sample)
        self._count_decode(getattr(self.engine, "stats", None))
        with self.activity("pack"):
            self._check_unchanged(version, digest, completions)
            responses, logps, finish, metas, indices = [], [], [], [], []
            for g, positions in enumerate(groups.values()):
                for j, pos in enumerate(positions):
                    c = completions[g * G + j]
                    responses.append(np.asarray(c.response_ids, dtype=np.int64))
                    logps.append(np.asarray(c.logprobs, dtype=np.float32))
                    finish.append(np.asarray([c.finish_reason == "stop"], dtype=np.uint8))
                    metas.append(
                        msgspec.structs.replace(
                            batch.metas[pos], version=c.version, response_len=len(c.response_ids), weights_digest=digest
                        )
                    )
                    indices.append(batch.indices[pos])
        columns: dict[str, Sequence] = {"response_ids": responses, "rollout_logp": logps, "finish": finish}
        if self.scorer is not None:
            with self.activity("score"):
                columns["reward"] = self._score(batch, groups, responses, finish, indices)
        with self.activity("put"):
            self.tq.put(indices, columns, metas)
        self.acks.add(batch)  # acked inside the next request
        self.num_items += len(batch)
        return True

    def _score(self, batch, groups: dict[int, list[int]], responses: list, finish: list, indices: list[int]) -> list:
        """``reward`` (float32 [1]) of each row, in the order of ``responses``: the rows of
        ``groups`` (positions in ``batch``), scored with their prompts and answers."""
        assert self.scorer is not None  # reward.placement = "rollout"
        order = [pos for positions in groups.values() for pos in positions]
        rows = {
            "prompt_ids": [batch.columns["prompt_ids"][pos] for pos in order],
            "answer": [batch.columns["answer"][pos] for pos in order],
            "response_ids": responses,
            "finish": finish,
        }
        return [np.asarray([r], dtype=np.float32) for r in self.scorer.score(rows, indices)]

    def _work_multiturn(self, batch, version: int, digest: int) -> bool:
        """The unit with an environment: one trajectory per row, driven to its end."""
        from asyncflow.envs.base import Sample

        assert self.multiturn is not None  # set when [env] path is
        tokenizer = self.multiturn.tokenizer
        samples = []
        for prompt_ids, answer in zip(batch.columns["prompt_ids"], batch.columns["answer"]):
            ids = prompt_ids.tolist()
            samples.append(
                Sample(prompt=tokenizer.decode(ids, skip_special_tokens=True), prompt_ids=ids, answer=bytes(answer).decode())
            )
        with self.activity("generate"):
            trajs = self.multiturn.run(self.engine, self.params, samples, lock=self.engine_lock)
        with self.activity("pack"):
            self._check_unchanged(version, digest, [t for t in trajs if t.turns])  # every turn of this version
            rows = [t.columns() for t in trajs]
            columns: dict[str, Sequence] = {name: [r[name] for r in rows] for name in rows[0]}
            metas = [
                msgspec.structs.replace(meta, version=version, response_len=len(t.ids), weights_digest=digest)
                for meta, t in zip(batch.metas, trajs)
            ]
        with self.activity("put"):
            self.tq.put(batch.indices, columns, metas)
        self.acks.add(batch)  # acked inside the next request
        self.num_items += len(batch)
        return True

    def on_stop(self) -> None:
        # each part closes even if another fails to (a failing close is logged, not raised)
        parts = (("partial-rollout stream", self._partial), ("environment driver", self.multiturn), ("gateway", self.gateway))
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

    def _check_unchanged(self, version: int, digest: int, completions) -> None:
        """The weights a generate call started with are the ones it ended with, and
        every completion carries that version: a swap in the middle of a unit (weights
        loaded from another thread) fails the unit instead of mislabelling its rows."""
        tags = {c.version for c in completions}
        if self.engine.version != version or tags - {version}:
            raise RuntimeError(
                f"{self.ctx.name}: the engine's version changed during a generate call (v{version} -> "
                f"v{self.engine.version}, completions tagged {sorted(tags)}): weights must only swap "
                "between units"
            )
        if self._verify and digest:
            held = self.engine.weights_digest()
            if held is not None and held != digest:
                raise RuntimeError(
                    f"{self.ctx.name}: the engine's weights changed during a generate call at v{version} "
                    f"(digest {digest:x} -> {held:x}): weights must only swap between units"
                )


# -- the role, as the driver sees it (actors/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.ROLLOUT,
    actor=RolloutActor,
    section="rollout",
    instances=roles.numbered(names.ROLLOUT, lambda cfg: cfg.rollout.num_replicas),
    task=names.TASK_ROLLOUT,
    inputs=("prompt_ids",),
    outputs=("response_ids", "rollout_logp", "finish"),
    restartable=True,
    device=roles.Devices.ONE,
    device_list="rollout_devices",
)
