"""RewardActor: scores responses with rule-based or custom reward functions.

Each unit: take rows of the ``reward`` task with ``response_ids``, ``answer`` and
``finish`` produced (async: whatever is ready, up to ``reward.batch_size``, or once
none is, the rows of the next put; sync: the whole global batch at once), decode
them, call the configured functions and put ``reward`` (float32 [1]) per row; the
rows are acked with the next request (``runtime/acks.py``).

With an environment (``[env] path``), the rows also carry ``env_reward`` and
``env_error``: ``env.reward = "add"`` puts the functions' sum plus env_reward,
``"replace"`` env_reward alone (the functions are not called); a row whose
environment failed gets 0 either way.

Takes: LoopActor messages. Sends: TQ reads and writes.
Invariant: every row gets exactly one reward (rows are consumed exactly once).
"""

from __future__ import annotations

import numpy as np

from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.acks import DeferredAcks
from asyncflow.actors.runtime.loop import LoopActor
from asyncflow.actors.runtime.run_dir import Run
from asyncflow.actors.runtime.scoring import Scorer
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.core.tq.client import Batch, TQClient
from asyncflow.core.tq.errors import BatchTimeout


def joined(a: Batch, b: Batch) -> Batch:
    """One batch of the rows of ``a`` then ``b`` (same task and columns)."""
    if len(b) == 0:
        return a
    meta = protocol.BatchMeta(task=a.task, indices=[*a.indices, *b.indices], metas=[*a.metas, *b.metas], shards=[])
    return Batch(a.task, meta, {name: [*col, *b.columns[name]] for name, col in a.columns.items()})


class RewardActor(LoopActor):
    acks: DeferredAcks  # made in __init__ (the base class allows None)
    COLUMNS = list(Scorer.COLUMNS)

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        self.run = Run(run_dir)
        cfg = self.run.config
        self.scorer = Scorer(cfg, self.run.tokenizer())
        self.columns = self.scorer.columns
        self.sync = cfg.workflow.mode == "sync"
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.acks = DeferredAcks(self.tq)
        self._remaining = cfg.rows_per_step * (cfg.train.num_steps - self.run.launch.start_step)

    def work_once(self) -> bool:
        cfg = self.run.config
        with self.activity("wait_data"):
            try:
                if self.sync:  # the baseline: score the whole batch once it is generated
                    batch = self.tq.get_batch(
                        names.TASK_REWARD,
                        self.columns,
                        cfg.rows_per_step,
                        policy="group",
                        timeout_s=0.5,
                        ack=self.acks.take(names.TASK_REWARD),
                    )
                else:
                    batch = self.tq.get_batch(
                        names.TASK_REWARD,
                        self.columns,
                        cfg.reward.batch_size,
                        partial=True,
                        ack=self.acks.take(names.TASK_REWARD),
                    )
                    if len(batch) == 0:
                        # wait for the next put, then take every row it made ready (a rollout puts a
                        # whole generate call's rows at once): one score and one put for all of them
                        first = self.tq.get_batch(names.TASK_REWARD, self.columns, 1, timeout_s=0.5)
                        if cfg.reward.batch_size > 1:
                            rest = self.tq.get_batch(names.TASK_REWARD, self.columns, cfg.reward.batch_size - 1, partial=True)
                            first = joined(first, rest)
                        batch = first
            except BatchTimeout:
                return True
        with self.activity("score"):
            rewards = self.scorer.score(batch.columns, batch.indices)
        with self.activity("put"):
            self.tq.put(batch.indices, {"reward": [np.asarray([r], dtype=np.float32) for r in rewards]})
        self.acks.add(batch)  # acked inside the next request
        self.num_items += len(batch)
        return True


# -- the role, as the driver sees it (actors/driver/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.REWARD,
    actor=RewardActor,
    instances=roles.numbered(
        names.REWARD,  # none when sessions come from the gateway: their rewards come by its reward route
        lambda cfg: cfg.reward.num_workers if cfg.reward.placement == "role" and not cfg.data_from_gateway else 0,
    ),
    task=names.TASK_REWARD,
    outputs=("reward",),
    restartable=True,
)
