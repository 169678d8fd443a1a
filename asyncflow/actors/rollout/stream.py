"""Partial rollout (``[workflow] partial_rollout``): the rollout replica's work as
one continuous generation stream instead of one generate call per unit.

Each ``work_once`` is one decode step of the stream (``RolloutStream``,
``engines/base.py``):
1. staged weights are swapped in now, between two decode steps (``inbox.swap_staged``);
   in-flight sequences keep their tokens and KV cache and go on with them;
2. the stream decodes at most ``prompts_per_call x group_size`` sequences (a
   unit's); while one of those rows is free and no sample waits, whole groups whose
   step s satisfies ``s <= version + k`` join it (the staleness gate, with the
   version now held: a sample that waits for a row starts with that version or a
   newer one);
3. one step: admitted prompts are prefilled, every running sequence gets a token;
4. each group whose ``group_size`` samples have all finished is put
   (``response_ids``, ``rollout_logp``, ``finish``, ``token_versions``) and acked
   with the next request.

Invariants:
- Versions: ``token_versions[i]`` is the version of the weights that sampled
  token i; a row's ``version`` is its first (oldest) token's, the version it was
  admitted under or a newer one, so ``step - version <= k`` bounds every token's
  staleness. The
  behaviour log-probs ``rollout_logp`` are per token, each under its own version.
- Integrity: every version a token carries was swapped in through ``inbox.swap_staged``
  (whose digest check stands); the row is stamped with the digest of its first
  token's version, which the trainer checks against that version. Before a group
  is put, the engine's weights must still be those of the last swap (digest), and
  each row's versions must be non-decreasing, start no earlier than its admission
  version and be versions this stream swapped in: anything else fails the unit.
- Exactly once: a group's rows stay handed to this replica until their outputs
  are put; if the process dies, the supervisor requeues exactly the rows whose
  outputs are not in. A Pause leaves in-flight rows handed (a checkpoint saves
  handed rows as free: they are generated again after a restart from it, never
  twice in one run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncflow.actors.rollout import pack
from asyncflow.config.names import TASK_ROLLOUT

if TYPE_CHECKING:
    from asyncflow.actors.rollout.replica import Replica
    from asyncflow.core.protocol import RowMeta
    from asyncflow.engines.base import Completion, RolloutStream


@dataclass
class _Group:
    indices: list[int]  # queue rows, by sample index
    metas: list[RowMeta]
    version: int  # the version it was admitted under (its rows' first tokens' or older)
    done: dict[int, Completion]  # sample index -> completion


class PartialRollout:
    """The partial-rollout unit of one ``RolloutActor`` (it owns the stream)."""

    def __init__(self, actor: Replica):
        self.actor = actor
        cfg = actor.run.config
        # at most a unit's sequences decode at once (prompts_per_call groups)
        self.max_running = cfg.rollout.prompts_per_call * cfg.algorithm.group_size
        self.stream: RolloutStream = actor.engine.open_stream(actor.params, self.max_running)
        self.groups: dict[int, _Group] = {}  # stream prompt index -> group in flight
        self.digests = {actor.engine.version: actor.inbox.digest}  # version swapped in -> its digest
        self._quiet_until = 0.0  # the queue had nothing admissible: ask again after this (or a change)
        self._quiet_version = -1

    def close(self) -> None:
        self.stream.close()

    def work_once(self) -> bool:
        a = self.actor
        cfg = a.run.config
        a.inbox.swap_staged()
        version = a.engine.version
        self.digests.setdefault(version, a.inbox.digest)
        if version >= cfg.train.num_steps:
            self.close()  # every step is trained: in-flight rows are no longer needed
            return False
        self._admit(version)
        if not self.groups:
            self._idle(version)
            return True
        with a.activity("generate"):
            finished = self.stream.step()
        if finished:
            self._collect(finished, version)
        return True

    # -- admission ---------------------------------------------------------------------
    def _admit(self, version: int) -> None:
        a = self.actor
        cfg = a.run.config
        G = cfg.algorithm.group_size
        # the stream decodes at most as many sequences as a unit; a whole group joins as soon
        # as one of those rows is free and nothing waits (its samples start as rows free up)
        room = -(-(self.max_running - self.stream.num_active) // G)
        if room <= 0 or (version == self._quiet_version and time.monotonic() < self._quiet_until):
            return
        with a.activity("get"):
            batch = a.tq.get_batch(
                TASK_ROLLOUT,
                ["prompt_ids"],
                room * G,
                policy="group",
                partial=True,
                max_step=version + a.k,
                ack=a.acks.take(TASK_ROLLOUT),
            )
        if len(batch) == 0:
            # nothing admissible now: the gate holds or no prompts yet; look again after a
            # short while, or at once when the version changes or a group leaves
            self._quiet_version, self._quiet_until = version, time.monotonic() + a.announce_wait_s
            return
        by_group: dict[int, list[int]] = {}
        for i, meta in enumerate(batch.metas):
            by_group.setdefault(meta.group_id, []).append(i)
        positions = list(by_group.values())
        prompts = [batch.columns["prompt_ids"][p[0]].tolist() for p in positions]
        for prompt_index, group in zip(self.stream.add(prompts), positions):
            self.groups[prompt_index] = _Group(
                indices=[batch.indices[i] for i in group], metas=[batch.metas[i] for i in group], version=version, done={}
            )

    def _idle(self, version: int) -> None:
        """Nothing in flight and nothing admissible: wait as the unit-by-unit path does."""
        a = self.actor
        gated = a.inbox.wanted > version  # new weights on the way: the quiet spell lasts until they are in
        a.inbox.wait_for_news(a.announce_wait_s)
        if not gated:
            self._quiet_until = 0.0

    # -- completion --------------------------------------------------------------------
    def _collect(self, finished: list[Completion], version: int) -> None:
        ready = []
        for c in finished:
            g = self.groups[c.prompt_index]
            g.done[c.sample_index] = c
            if len(g.done) == len(g.indices):
                ready.append(c.prompt_index)
        if not ready:
            return
        a = self.actor
        with a.activity("pack"):
            self._check_versions([self.groups[p] for p in ready], version)
            rows, metas, indices = [], [], []
            for prompt_index in ready:
                g = self.groups.pop(prompt_index)
                for j, (index, meta) in enumerate(zip(g.indices, g.metas)):
                    c = g.done[j]
                    rows.append(pack.completion_row(c, token_versions=True))
                    metas.append(pack.stamped(meta, c.version, len(c.response_ids), self.digests[c.version]))
                    indices.append(index)
        with a.activity("put"):
            a.tq.put(indices, pack.columns(rows), metas)
        a.acks.add_rows(TASK_ROLLOUT, indices)  # acked inside the next request
        a.num_items += len(indices)
        self._quiet_until = 0.0  # room for a group: ask the queue at the next step

    def _check_versions(self, groups: list[_Group], version: int) -> None:
        """The rows' versions are those this stream swapped in, in order, from the one
        each group was admitted under or a later one; the engine still holds the last swap's weights."""
        a = self.actor
        for g in groups:
            for c in g.done.values():
                tv = c.token_versions
                if (
                    tv is None
                    or len(tv) != len(c.response_ids)
                    or tv[0] < g.version
                    or c.version != tv[0]
                    or any(x > y for x, y in zip(tv, tv[1:]))
                    or tv[-1] > version
                    or not set(tv) <= self.digests.keys()
                ):
                    raise RuntimeError(
                        f"{a.ctx.name}: a partial rollout admitted at v{g.version} came back with token versions "
                        f"{sorted(set(tv or []))} (engine at v{version}, versions swapped in "
                        f"{sorted(self.digests)}): the engine's version changed outside a swap between decode steps"
                    )
        if a.inbox.verify and a.inbox.digest:
            held = a.engine.weights_digest()
            if held is not None and held != a.inbox.digest:
                raise RuntimeError(
                    f"{a.ctx.name}: the engine's weights changed outside a swap at v{version} (digest "
                    f"{a.inbox.digest:x} -> {held:x}): weights must only change through the rollout's swap"
                )
