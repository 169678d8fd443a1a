"""PromptLoaderActor: feeds prompt groups into the queue, one trainer step at a time.

Each unit allocates ``prompts_per_step`` groups of ``group_size`` rows for step s
(waiting while the queue is full: backpressure) and puts ``prompt_ids`` (int64)
and ``answer`` (utf-8 bytes as uint8) into every row of a group.

Takes: the LoopActor messages. Sends: Allocate/PutRows via TQClient.
Invariant: the prompt of (step s, group g) is a pure function of (seed, s, g), so
a resumed run continues with exactly the prompts it would have had.
"""

from __future__ import annotations

import random

import msgspec
import numpy as np

from asyncflow.actors._loop import LoopActor
from asyncflow.actors._run import Run, read_prompts
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import QueueFull


class PromptLoaderActor(LoopActor):

    def __init__(self, ctx, run_dir: str):
        super().__init__(ctx)
        self.run = Run(run_dir)
        cfg = self.run.config
        tokenizer = self.run.tokenizer()
        rows = read_prompts(self.run.launch.data_path)
        self.prompt_ids = [self._encode(tokenizer, r["prompt"], cfg.data.chat_template) for r in rows]
        self.answers = [np.frombuffer(str(r["answer"]).encode(), dtype=np.uint8) for r in rows]
        state = self.run.role_state(ctx.name)
        self.next_step = msgspec.msgpack.decode(state) if state else self.run.launch.start_step
        self.tq = TQClient(ctx.directory, consumer=ctx.name)
        self._orders: dict[int, list[int]] = {}

    @staticmethod
    def _encode(tokenizer, prompt: str, chat: bool) -> np.ndarray:
        from asyncflow.engines.tiny import encode_chat_prompt

        ids = encode_chat_prompt(tokenizer, prompt) if chat else tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int64)

    def _prompt_index(self, step: int, group: int) -> int:
        cfg = self.run.config
        flat = step * cfg.train.prompts_per_step + group
        epoch, pos = divmod(flat, len(self.prompt_ids))
        if not cfg.data.shuffle:
            return pos
        if epoch not in self._orders:  # one permutation per epoch, drawn once
            order = list(range(len(self.prompt_ids)))
            random.Random(cfg.data.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}
        return self._orders[epoch][pos]

    def resumable_state(self) -> bytes:
        return msgspec.msgpack.encode(self.next_step)

    def work_once(self) -> bool:
        cfg = self.run.config
        if self.next_step >= cfg.train.num_steps:
            return False
        G = cfg.algorithm.group_size
        with self.activity("wait_capacity"):
            try:
                metas = self.tq.allocate(cfg.train.prompts_per_step, G, step=self.next_step, timeout_s=1.0)
            except QueueFull:
                return True  # try again after other messages (Pause) had their turn
        with self.activity("load"):
            ids, answers = [], []
            for pos, meta in enumerate(metas):  # rows come group by group
                k = self._prompt_index(self.next_step, pos // G)
                ids.append(self.prompt_ids[k])
                answers.append(self.answers[k])
                meta.prompt_len = len(self.prompt_ids[k])
            self.tq.put([m.index for m in metas], {"prompt_ids": ids, "answer": answers}, metas)
        self.num_items += len(metas)
        self.next_step += 1
        return True
