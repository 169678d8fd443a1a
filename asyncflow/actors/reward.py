"""RewardActor: scores responses with rule-based or custom reward functions.

Each unit: take rows of the ``reward`` task with ``response_ids``, ``answer`` and
``finish`` produced (async: whatever is ready, up to ``reward.batch_size``, or once
none is, the rows of the next put; sync: the whole global batch at once), decode
them, call the configured functions and put ``reward`` (float32 [1]) per row; the
rows are acked with the next request (``_acks.py``).

With an environment (``[env] path``), the rows also carry ``env_reward`` and
``env_error``: ``env.reward = "add"`` puts the functions' sum plus env_reward,
``"replace"`` env_reward alone (the functions are not called); a row whose
environment failed gets 0 either way.

Takes: LoopActor messages. Sends: TQ reads and writes.
Invariant: every row gets exactly one reward (rows are consumed exactly once).
"""

from __future__ import annotations

import numpy as np

from asyncflow.actors import names, roles
from asyncflow.actors._acks import DeferredAcks
from asyncflow.actors._loop import LoopActor
from asyncflow.actors._run import Run
from asyncflow.core import protocol
from asyncflow.core.phases import phase
from asyncflow.core.tq.client import Batch, TQClient
from asyncflow.core.tq.errors import BatchTimeout


def joined(a: Batch, b: Batch) -> Batch:
    """One batch of the rows of ``a`` then ``b`` (same task and columns)."""
    if len(b) == 0:
        return a
    meta = protocol.BatchMeta(task=a.task, indices=[*a.indices, *b.indices], metas=[*a.metas, *b.metas], shards=[])
    return Batch(a.task, meta, {name: [*col, *b.columns[name]] for name, col in a.columns.items()})


def with_env_rewards(rewards: list[float], env_reward: list, env_error: list) -> list[float]:
    """Each row's reward plus its environment's (``rewards`` are zeros with
    ``env.reward = "replace"``); 0 for a row whose environment failed."""
    return [0.0 if int(e[0]) else r + float(er[0]) for r, er, e in zip(rewards, env_reward, env_error)]


def build_reward_fn(functions: list[str], weights: list[float]):
    from asyncflow.algorithms.rewards import load_reward_fn, weighted_sum

    weights = weights or [1.0] * len(functions)
    return weighted_sum(*[(w, load_reward_fn(name)) for w, name in zip(weights, functions)])


class RewardActor(LoopActor):
    acks: DeferredAcks  # made in __init__ (the base class allows None)
    COLUMNS = ["prompt_ids", "response_ids", "answer", "finish"]

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        self.run = Run(run_dir)
        cfg = self.run.config
        self.tokenizer = self.run.tokenizer()
        self.env_reward = cfg.env.reward if cfg.env.path else ""  # "", "add" or "replace"
        self.fn = None if self.env_reward == "replace" else build_reward_fn(cfg.reward.functions, cfg.reward.weights)
        self.columns = self.COLUMNS + (["env_reward", "env_error"] if self.env_reward else [])
        self.sync = cfg.workflow.mode == "sync"
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.acks = DeferredAcks(self.tq)
        self._remaining = cfg.rows_per_step * (cfg.train.num_steps - self.run.launch.start_step)

    def work_once(self) -> bool:
        from asyncflow.algorithms.rewards import call_reward

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
            decode = lambda ids: self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)  # noqa: E731
            with phase("detokenize"):
                prompts = [decode(a) for a in batch.columns["prompt_ids"]]
                responses = [decode(a) for a in batch.columns["response_ids"]]
                answers = [bytes(a).decode() for a in batch.columns["answer"]]
                finish = ["stop" if int(f[0]) else "length" for f in batch.columns["finish"]]
            with phase("reward_fn"):
                if self.fn is not None:
                    rewards = call_reward(self.fn, prompts, responses, answers, finish, row_ids=list(batch.indices))
                else:
                    rewards = [0.0] * len(batch)
            if self.env_reward:  # see the module docstring
                rewards = with_env_rewards(rewards, batch.columns["env_reward"], batch.columns["env_error"])
        with self.activity("put"):
            self.tq.put(batch.indices, {"reward": [np.asarray([r], dtype=np.float32) for r in rewards]})
        self.acks.add(batch)  # acked inside the next request
        self.num_items += len(batch)
        return True


# -- the role, as the driver sees it (actors/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.REWARD,
    actor=RewardActor,
    section="reward",
    instances=roles.numbered(names.REWARD, lambda cfg: cfg.reward.num_workers),
    task=names.TASK_REWARD,
    inputs=tuple(RewardActor.COLUMNS),
    outputs=("reward",),
    restartable=True,
)
