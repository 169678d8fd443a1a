"""PromptLoaderActor: feeds prompt groups into the queue, one trainer step at a time.

Each unit allocates ``prompts_per_step`` groups of ``group_size`` rows for step s
(waiting while the queue is full: backpressure) and puts ``prompt_ids`` (int64)
and ``answer`` (utf-8 bytes as uint8) into every row of a group. With
``algorithm.dynamic_sampling`` it over-samples: ``RunConfig.groups_per_step`` groups
per step, of which the trainer keeps the informative ones (actors/trainer/sources/dynamic.py).
With ``algorithm.dynamic_sampling_max_rounds > 0`` (refill) the trainer may tell it
``RefillGroups(step, round)``: another ``groups_per_step`` groups for that (past) step,
served before any new step. A new step is then allocated only while
``RunConfig.refill_headroom_rows`` stay free after it, and without the queue client's
spare groups, so a refill round always fits once the trainer has acked the rows it
drops: it never waits behind the steps the loader runs ahead with.

Takes: the LoopActor messages, RefillGroups. Sends: Allocate/PutRows via TQClient.
Invariants:
- The prompt of (step s, group g) is a pure function of (seed, s, g) (``PromptOrder``),
  so a resumed run continues with exactly the prompts it would have had; that of
  refill round r of step s, group g, one of (seed, s, r, g) (its own stream of
  positions, ``s * max_rounds + r - 1`` rounds in).
- A refill is asked only inside a trainer step and waited for by it, and checkpoints
  are taken between steps: a checkpoint never holds a refill asked and not served,
  so the loader's resumable state stays its next step.
- With ``[eval] every_steps > 0`` only the training part of ``split_prompts`` is ever
  loaded: a held-out prompt is never trained on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec
import numpy as np

from asyncflow.actors.runtime import messages
from asyncflow.actors.runtime import spec as roles
from asyncflow.actors.runtime.loop import LoopActor
from asyncflow.actors.runtime.run_dir import PromptOrder, Run, encode_prompt, read_prompts, split_prompts
from asyncflow.config import names
from asyncflow.core import protocol
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import QueueFull

REFILL_POLL_S = 0.1
"""With refill, how long a new step's allocation waits for room before the loader
looks at its messages again: the most a RefillGroups waits behind it."""


class PromptLoaderActor(LoopActor):
    Inbox = messages.LoaderIn

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
        self.headroom_rows = cfg.refill_headroom_rows
        # with refill, no spare groups: they would be live rows outside the headroom's accounting
        self.tq = TQClient(ctx.directory, consumer=ctx.name, reserve_rows=0 if self.headroom_rows else None)
        self.order = PromptOrder(len(rows), cfg.groups_per_step, cfg.data.shuffle, cfg.data.shuffle_seed)
        refills = max(cfg.refill_rounds, 1) * cfg.groups_per_step  # positions per step in the refill stream
        self.refill_order = PromptOrder(len(rows), refills, cfg.data.shuffle, cfg.data.shuffle_seed, stream=1)
        self._refills: deque[messages.RefillGroups] = deque()  # asked by the trainer, not yet loaded

    def resumable_state(self) -> bytes:
        return msgspec.msgpack.encode(self.next_step)

    def handle(self, msg, pending):
        if not isinstance(msg, messages.RefillGroups):
            return super().handle(msg, pending)
        if not self.headroom_rows:
            raise ValueError(
                f"{self.ctx.name}: RefillGroups(step={msg.step}) but algorithm.dynamic_sampling_max_rounds is 0 in this run"
            )
        self._refills.append(msg)
        if self._finished:  # every step loaded already: the loop runs again for the refill
            self._finished = False
            self.clock.state = "idle"
            self._schedule()
        return protocol.Ok()

    def work_once(self) -> bool:
        cfg = self.run.config
        if self._refills:  # before any new step: the trainer waits for it
            refill = self._refills[0]
            first = (refill.step * cfg.refill_rounds + refill.round - 1) * cfg.groups_per_step
            if not self._load(refill.step, lambda g: self.refill_order.index(refill.step, first + g), headroom=0):
                return True
            self._refills.popleft()
            return True
        if self.next_step >= cfg.train.num_steps:
            return False
        if not self._load(self.next_step, lambda g: self.order.index(self.next_step, g), self.headroom_rows):
            return True  # try again after other messages (Pause, RefillGroups) had their turn
        self.next_step += 1
        return True

    def _load(self, step: int, prompt_of: Callable[[int], int], headroom: int) -> bool:
        """Allocate ``groups_per_step`` groups for ``step`` and put the prompt
        ``prompt_of(g)`` into every row of group g; False if the queue stays full."""
        cfg = self.run.config
        G = cfg.algorithm.group_size
        # with refill a new step waits briefly: a RefillGroups must not wait behind it for long
        timeout_s = REFILL_POLL_S if self.headroom_rows else 1.0
        with self.activity("wait_capacity"):
            try:
                metas = self.tq.allocate(cfg.groups_per_step, G, step=step, timeout_s=timeout_s, headroom_rows=headroom)
            except QueueFull:
                return False
        with self.activity("load"):
            ids, answers = [], []
            for pos, meta in enumerate(metas):  # rows come group by group
                k = prompt_of(pos // G)
                ids.append(self.prompt_ids[k])
                answers.append(self.answers[k])
                meta.prompt_len = len(self.prompt_ids[k])
            self.tq.put([m.index for m in metas], {"prompt_ids": ids, "answer": answers}, metas)
        self.num_items += len(metas)
        return True


# -- the role, as the driver sees it (actors/driver/topology.py) ---------------------------------

ROLE = roles.RoleSpec(
    name=names.LOADER,
    actor=PromptLoaderActor,
    instances=lambda cfg: [] if cfg.data_from_gateway else [names.LOADER],  # sessions come from the gateway
    outputs=("prompt_ids", "answer"),
)
