"""The unit mode of a rollout replica (the default; ``stream.py`` is partial
rollout): one ``work_once`` is one unit.

1. swap in staged weights (``inbox.swap_staged``); stop once the held version is the
   last step's;
2. take up to ``prompts_per_call`` whole prompt groups whose planned step s
   satisfies ``s <= target + k``, where ``target`` is the newest version announced
   (the request waits in the queue until a group is admissible, and the next
   announcement wakes it to ask again with the new bound: no polling):
   the rows are asked for while that version's weights still travel (the queue's
   round trip overlaps the fetch), and generated only once they are swapped in
   (``inbox.swap_to``);
3. generate the groups' ``group_size`` responses in one call (or, with an
   environment, drive one multi-turn trajectory per row: ``multiturn.py``), all from
   the weights the unit started with;
4. pack (``pack.py``), score when ``reward.placement = "rollout"``, put, and ack with
   the next request.

Invariant: every row a unit took is put before the next unit starts, and acked
inside the next unit's first request (or at Pause/Stop). A generate call during
which the engine's version or weights changed fails the unit instead of mislabelling
its rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncflow.actors.rollout import pack
from asyncflow.config.names import TASK_ROLLOUT

if TYPE_CHECKING:
    from asyncflow.actors.rollout.replica import Replica
    from asyncflow.core.tq.client import Batch


class UnitRollout:
    def __init__(self, replica: Replica):
        self.replica = replica

    def close(self) -> None:
        """Nothing held between units."""

    def work_once(self) -> bool:
        a = self.replica
        cfg = a.run.config
        a.inbox.swap_staged()
        if a.engine.version >= cfg.train.num_steps:
            return False
        G = cfg.algorithm.group_size
        wakes = a.tq.wakes(TASK_ROLLOUT)  # read before the target: an announcement after it wakes this get
        target = a.inbox.target()
        with a.activity("wait_data"):
            # waits in the queue until a whole group is admissible (s <= target + k), or until
            # the next announcement (or a Pause) wakes it with no rows: no polling
            batch = a.tq.get_batch(
                TASK_ROLLOUT,
                ["prompt_ids", "answer"] if a.multiturn or a.scorer else ["prompt_ids"],
                cfg.rollout.prompts_per_call * G,
                policy="group",
                partial=True,
                min_rows=G,
                timeout_s=a.queue_wait_s,
                wakes=wakes,
                max_step=target + a.k,
                ack=a.acks.take(TASK_ROLLOUT),
            )
        if len(batch) == 0:
            # woken (a newer version was announced: ask again with the new bound; or Pause,
            # Stop) or nothing within the wait; with weights on the way, let them arrive
            if a.inbox.wanted > a.engine.version and a.inbox.wanted == target:
                a.inbox.wait_fetched()
            return True
        if target > a.engine.version:
            a.inbox.swap_to(target)
        if a.multiturn is not None:
            self._multiturn(batch)
        else:
            self._generate(batch)
        a.acks.add(batch)  # acked inside the next request
        a.num_items += len(batch)
        return True

    def _generate(self, batch: Batch) -> None:
        a = self.replica
        G = a.run.config.algorithm.group_size
        groups: dict[int, list[int]] = {}  # group id -> positions in the batch
        for pos, meta in enumerate(batch.metas):
            groups.setdefault(meta.group_id, []).append(pos)
        version, digest = a.engine.version, a.inbox.digest
        with a.activity("generate"):
            prompts = [batch.columns["prompt_ids"][positions[0]].tolist() for positions in groups.values()]
            with a.engine_lock:
                completions = a.engine.generate(prompts, a.params)  # ordered (prompt, sample)
        a.count_decode(getattr(a.engine, "stats", None))
        with a.activity("pack"):
            self._check_unchanged(version, digest, completions)
            rows, metas, indices = [], [], []
            for g, positions in enumerate(groups.values()):
                for j, pos in enumerate(positions):
                    c = completions[g * G + j]
                    rows.append(pack.completion_row(c))
                    metas.append(pack.stamped(batch.metas[pos], c.version, len(c.response_ids), digest))
                    indices.append(batch.indices[pos])
        columns = pack.columns(rows)
        if a.scorer is not None:
            with a.activity("score"):
                order = [pos for positions in groups.values() for pos in positions]
                columns["reward"] = a.scorer.reward_column(
                    [batch.columns["prompt_ids"][pos] for pos in order],
                    [batch.columns["answer"][pos] for pos in order],
                    columns,
                    indices,
                )
        with a.activity("put"):
            a.tq.put(indices, columns, metas)

    def _multiturn(self, batch: Batch) -> None:
        """With an environment: one trajectory per row, driven to its end."""
        from asyncflow.envs.base import Sample

        a = self.replica
        assert a.multiturn is not None  # set when [env] path is
        version, digest = a.engine.version, a.inbox.digest
        tokenizer = a.multiturn.tokenizer
        samples = []
        for prompt_ids, answer in zip(batch.columns["prompt_ids"], batch.columns["answer"]):
            ids = prompt_ids.tolist()
            samples.append(
                Sample(prompt=tokenizer.decode(ids, skip_special_tokens=True), prompt_ids=ids, answer=bytes(answer).decode())
            )
        with a.activity("generate"):
            trajs = a.multiturn.run(a.engine, a.params, samples, lock=a.engine_lock, count=a.count_decode)
        with a.activity("pack"):
            self._check_unchanged(version, digest, [t for t in trajs if t.turns])  # every turn of this version
            rows = [t.columns() for t in trajs]
            metas = [pack.stamped(meta, version, len(t.ids), digest) for meta, t in zip(batch.metas, trajs)]
        with a.activity("put"):
            a.tq.put(batch.indices, pack.columns(rows), metas)

    def _check_unchanged(self, version: int, digest: int, completions) -> None:
        """The weights a generate call started with are the ones it ended with, and
        every completion carries that version: a swap in the middle of a unit (weights
        loaded from another thread) fails the unit instead of mislabelling its rows."""
        a = self.replica
        tags = {c.version for c in completions}
        if a.engine.version != version or tags - {version}:
            raise RuntimeError(
                f"{a.ctx.name}: the engine's version changed during a generate call (v{version} -> "
                f"v{a.engine.version}, completions tagged {sorted(tags)}): weights must only swap "
                "between units"
            )
        if a.inbox.verify and digest:
            held = a.engine.weights_digest()
            if held is not None and held != digest:
                raise RuntimeError(
                    f"{a.ctx.name}: the engine's weights changed during a generate call at v{version} "
                    f"(digest {digest:x} -> {held:x}): weights must only swap between units"
                )
