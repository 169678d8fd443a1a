"""PromptLoaderActor: feeds prompt groups into the queue, one trainer step at a time.

Each unit allocates ``prompts_per_step`` groups of ``group_size`` rows for step s
(waiting while the queue is full: backpressure) and puts ``prompt_ids`` (int64)
and ``answer`` (utf-8 bytes as uint8) into every row of a group. With
``algorithm.dynamic_sampling`` it over-samples: ``RunConfig.groups_per_step`` groups
per step, of which the trainer keeps the informative ones (actors/_dynamic_sampling.py).

Takes: the LoopActor messages. Sends: Allocate/PutRows via TQClient.
Invariants:
- The prompt of (step s, group g) is a pure function of (seed, s, g) (``PromptOrder``),
  so a resumed run continues with exactly the prompts it would have had.
- With ``[eval] every_steps > 0`` only the training part of ``split_prompts`` is ever
  loaded: a held-out prompt is never trained on.
"""

from __future__ import annotations

import msgspec
import numpy as np

from asyncflow.actors import names, roles
from asyncflow.actors._loop import LoopActor
from asyncflow.actors._run import PromptOrder, Run, encode_prompt, read_prompts, split_prompts
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import QueueFull


class PromptLoaderActor(LoopActor):
    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        self.run = Run(run_dir)
        cfg = self.run.config
        tokenizer = self.run.tokenizer()
        rows = read_prompts(self.run.launch.data_path)
        heldout = cfg.eval.num_prompts if cfg.eval.every_steps else 0
        train, _ = split_prompts([str(r["prompt"]) for r in rows], heldout, cfg.data.seed)
        rows = [rows[i] for i in train]
        self.prompt_ids = [encode_prompt(tokenizer, r["prompt"], cfg.data.chat_template) for r in rows]
        self.answers = [np.frombuffer(str(r["answer"]).encode(), dtype=np.uint8) for r in rows]
        state = self.run.role_state(ctx.name)
        self.next_step = msgspec.msgpack.decode(state) if state else self.run.launch.start_step
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self.order = PromptOrder(len(rows), cfg.groups_per_step, cfg.data.shuffle, cfg.data.seed)

    def resumable_state(self) -> bytes:
        return msgspec.msgpack.encode(self.next_step)

    def work_once(self) -> bool:
        cfg = self.run.config
        if self.next_step >= cfg.train.num_steps:
            return False
        G = cfg.algorithm.group_size
        with self.activity("wait_capacity"):
            try:
                metas = self.tq.allocate(cfg.groups_per_step, G, step=self.next_step, timeout_s=1.0)
            except QueueFull:
                return True  # try again after other messages (Pause) had their turn
        with self.activity("load"):
            ids, answers = [], []
            for pos, meta in enumerate(metas):  # rows come group by group
                k = self.order.index(self.next_step, pos // G)
                ids.append(self.prompt_ids[k])
                answers.append(self.answers[k])
                meta.prompt_len = len(self.prompt_ids[k])
            self.tq.put([m.index for m in metas], {"prompt_ids": ids, "answer": answers}, metas)
        self.num_items += len(metas)
        self.next_step += 1
        return True


# -- the role, as the driver sees it (actors/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.LOADER,
    actor=PromptLoaderActor,
    section="data",
    instances=roles.one(names.LOADER),
    outputs=("prompt_ids", "answer"),
)
