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

Delayed parameter update (``WeightInbox``, actors/weight_inbox.py): ``WeightsReady``
starts a background fetch of the new weights into a host buffer while generation
goes on with the old ones; the swap onto the device happens between units
(``AcquireSwap`` first: with sub-step updates, replicas swap one at a time). How the bytes travel is the business of a
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
from asyncflow.actors.weight_inbox import WeightInbox
from asyncflow.actors.weights import build_receiver
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient
from asyncflow.engines.device import torch_dtype
from asyncflow.gateway.replica import serve_for_replica

log = logging.getLogger(__name__)

ANNOUNCE_WAIT_S = 0.05
"""How long a replica held back by the staleness gate waits for the trainer's next
announcement (which wakes it at once) before it looks at the queue again; the
planner's predictions take it as ``poll_s`` (cli/predict.py passes it)."""


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
        receiver = build_receiver(
            cfg.workflow.weight_transport, ctx, cfg.workflow.weight_timeout_s, device=cfg.cluster.device, engine=self.engine
        )
        # held around every generate call and weight swap: the gateway (docs/gateway.md) shares the engine
        self.engine_lock = threading.Lock()
        # announced -> fetched -> swapped in (actors/weight_inbox.py)
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
        self.inbox.announce(msg)
        return protocol.Ok()

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
            self.inbox.want(latest.version)

    # -- work --------------------------------------------------------------------
    def work_once(self) -> bool:
        if self._partial is not None:
            return self._partial.work_once()
        cfg = self.run.config
        self.inbox.swap_staged()
        if self.engine.version >= cfg.train.num_steps:
            return False
        G = cfg.algorithm.group_size
        # The unit runs on the newest version announced: its rows may be of steps up to that
        # version + k, asked for while its weights are still being fetched (the queue's round
        # trip overlaps the fetch) and generated only once they are swapped in (inbox.swap_to).
        target = self.inbox.target()
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
            # Nothing admissible: the staleness gate holds and the trainer has not announced
            # the next version (the usual case: the loader keeps rows of later steps queued),
            # or no prompts yet. Wait for the weights on the way, or for the announcement,
            # which wakes this at once (a blocking get would sit through it), or 50 ms.
            self.inbox.wait_for_news(ANNOUNCE_WAIT_S)
            return True
        if target > self.engine.version:
            self.inbox.swap_to(target)
        groups: dict[int, list[int]] = {}  # group id -> positions in the batch
        for pos, meta in enumerate(batch.metas):
            groups.setdefault(meta.group_id, []).append(pos)
        version, digest = self.engine.version, self.inbox.digest
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
        parts = (
            ("partial-rollout stream", self._partial),
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
        if self.inbox.verify and digest:
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
