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
   (``response_ids``, ``rollout_logp``, ``finish``, ``token_versions``, and ``reward``
   when ``reward.placement = "rollout"``: scored here first) and acked with the next
   request.

With the gateway on this replica (``[rollout.gateway]``) its requests join the same
stream (``gateway/batcher.StreamedRequests``): taken at every step, one sequence each
with its own ``max_new_tokens``, each reply handed back when it finishes; a reply may
span a swap, and records each token's version. Its requests count among the
``prompts_per_call x group_size`` sequences; with ``[rollout.gateway] train`` the stream
serves the gateway alone (no queue rows), up to ``rollout.gateway.max_batch`` at once.

With an environment (``[env] path``) each row is a multi-turn trajectory
(``multiturn.TurnStream``): a whole group's trajectories start together (their
``env.reset`` on the driver's pool) and count against the ``prompts_per_call x
group_size`` bound from admission to their end, whether a turn decodes or the
environment steps; each turn joins the stream (one sequence, its whole context as
the prompt) as soon as its observation is back, so a trajectory's turns may come
from several versions. A group is put when its last trajectory ends, with the
environment's columns and every token's version (observations take the version of
the model token before them).

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
- The gateway: every request taken gets exactly one result, its reply or, when the
  stream closes first (the run ends, the replica stops), a 503.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from asyncflow.actors.rollout import pack
from asyncflow.config.names import TASK_ROLLOUT

if TYPE_CHECKING:
    from asyncflow.actors.rollout.multiturn import Trajectory, TurnStream
    from asyncflow.actors.rollout.replica import Replica
    from asyncflow.core.protocol import RowMeta
    from asyncflow.core.tq.client import Batch
    from asyncflow.engines.base import Completion, RolloutStream
    from asyncflow.gateway.batcher import StreamedRequests


QUIET_MAX_S = 0.4
"""The longest a stream waits before it asks the queue again after a run of empty answers
at one version (the first wait is ``ANNOUNCE_WAIT_S``, doubled at each empty answer)."""


class QuietSpell:
    """When a stream asks the queue again after it had nothing admissible. Only two things
    make rows admissible: a new version (the staleness gate moves: ask at once) and the
    loader's new rows (no signal reaches the stream: ask again after ``first_s``, doubled at
    each empty answer at the same version up to ``max_s``). A group leaving frees rows but
    makes nothing admissible, so it does not end the spell. Before, a gated stream asked every
    ``first_s``: at 32 replicas the queue answered ~20 empty requests a second per replica."""

    def __init__(self, first_s: float, max_s: float = QUIET_MAX_S):
        self.first_s, self.max_s = first_s, max_s
        self.version = -1  # the version the empty answers came at
        self.empties = 0
        self.until = 0.0

    def empty(self, version: int, now: float) -> None:
        """The queue had nothing admissible at ``version``."""
        self.empties = self.empties + 1 if version == self.version else 1
        self.version = version
        self.until = now + min(self.first_s * 2 ** (self.empties - 1), self.max_s)

    def got(self) -> None:
        """The queue handed out rows: the next time there is room, ask at once."""
        self.version, self.empties, self.until = -1, 0, 0.0

    def asks(self, version: int, now: float) -> bool:
        """Whether to ask the queue now."""
        return version != self.version or now >= self.until


@dataclass
class _Group:
    indices: list[int]  # queue rows, by sample index
    metas: list[RowMeta]
    version: int  # the version it was admitted under (its rows' first tokens' or older)
    done: dict[int, Completion]  # sample index -> completion
    trajs: list[Trajectory] | None = None  # with an environment: one trajectory per row, by sample index
    scored: tuple[Any, list[Any]] | None = None  # reward.placement = "rollout": its prompt_ids and each row's answer


class PartialRollout:
    """The partial-rollout unit of one ``RolloutActor`` (it owns the stream)."""

    def __init__(self, actor: Replica):
        self.actor = actor
        cfg = actor.run.config
        self.serve_only = cfg.data_from_gateway  # [rollout.gateway] train: no queue rows, only the gateway's requests
        # at most a unit's sequences decode at once (prompts_per_call groups; the gateway's requests
        # count among them), or serving only the gateway as many as one of its batches (gateway.max_batch)
        self.max_running = (
            cfg.rollout.gateway.max_batch if self.serve_only else cfg.rollout.prompts_per_call * cfg.algorithm.group_size
        )
        # with an environment one sequence per turn (a group's prompt is not sampled n times)
        params = msgspec.structs.replace(actor.params, n=1) if actor.multiturn is not None else actor.params
        self.stream: RolloutStream = actor.engine.open_stream(params, self.max_running)
        self.turns: TurnStream | None = None  # [env] path: the trajectories whose turns the stream decodes
        if actor.multiturn is not None:
            from asyncflow.actors.rollout.multiturn import TurnStream

            self.turns = TurnStream(actor.multiturn, self.stream, params.max_new_tokens, lambda: actor.engine.version)
        self.groups: dict[int, _Group] = {}  # stream prompt index (a group id with an environment) -> group in flight
        self._num_groups = 0  # group ids given with an environment
        # the gateway on this replica: its requests join the stream (gateway/batcher.StreamedRequests)
        gateway = actor.gateway
        self.requests: StreamedRequests | None = gateway.batcher if gateway is not None and gateway.streamed else None
        self._served: dict[int, Any] = {}  # stream prompt index -> the gateway request it answers
        self.digests = {actor.engine.version: actor.inbox.digest}  # version swapped in -> its digest
        self.quiet = QuietSpell(actor.announce_wait_s)  # the queue had nothing admissible: when to ask again

    def close(self) -> None:
        if self.requests is not None:  # the stream ends: its replies in progress fail (503), new ones at once
            self.requests.abandon(list(self._served.values()), "its replica's generation stream closed")
            self._served = {}
            self.requests.close()
        if self.turns is not None:
            self.turns.close()
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
        if not self.serve_only:
            self._admit(version)
        if self.requests is not None:
            self.requests.record(version, self.digests[version])
            self._take_requests()
            if not self.groups and not self._served:
                self._idle(version)
                return True
            return self._shared_step(version)
        if not self.groups:
            self._idle(version)
            return True
        if self.turns is not None:
            with a.activity("generate"):
                ended = self.turns.step(a.announce_wait_s)
            if ended:
                self._collect_trajectories(ended, version)
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
        # as one of those rows is free and nothing waits (its samples start as rows free up).
        # With an environment the bound is on trajectories not ended, decoding or not.
        active = self.stream.num_active if self.turns is None else self.turns.num_live
        room = -(-(self.max_running - active) // G)
        if room <= 0 or not self.quiet.asks(version, time.monotonic()):
            return
        with a.activity("get"):
            batch = a.tq.get_batch(
                TASK_ROLLOUT,
                ["prompt_ids", "answer"] if self.turns is not None or a.scorer is not None else ["prompt_ids"],
                room * G,
                policy="group",
                partial=True,
                max_step=version + a.k,
                ack=a.acks.take(TASK_ROLLOUT),
            )
        if len(batch) == 0:
            # nothing admissible now: the gate holds or no prompts yet; look again at once when
            # the version changes, else after the quiet spell (QuietSpell)
            self.quiet.empty(version, time.monotonic())
            return
        self.quiet.got()
        by_group: dict[int, list[int]] = {}
        for i, meta in enumerate(batch.metas):
            by_group.setdefault(meta.group_id, []).append(i)
        positions = list(by_group.values())
        if self.turns is not None:
            self._start_trajectories(batch, positions, version)
            return
        prompts = [batch.columns["prompt_ids"][p[0]].tolist() for p in positions]
        for prompt_index, group in zip(self.stream.add(prompts), positions):
            self.groups[prompt_index] = _Group(
                indices=[batch.indices[i] for i in group],
                metas=[batch.metas[i] for i in group],
                version=version,
                done={},
                scored=(batch.columns["prompt_ids"][group[0]], [batch.columns["answer"][i] for i in group])
                if a.scorer is not None
                else None,
            )

    def _start_trajectories(self, batch: Batch, positions: list[list[int]], version: int) -> None:
        """With an environment: one trajectory per row of each admitted group."""
        from asyncflow.envs.base import Sample

        assert self.turns is not None  # set with [env] path
        tokenizer = self.turns.driver.tokenizer
        for group in positions:
            samples = []
            for i in group:
                ids = batch.columns["prompt_ids"][i].tolist()
                answer = bytes(batch.columns["answer"][i]).decode()
                samples.append(Sample(prompt=tokenizer.decode(ids, skip_special_tokens=True), prompt_ids=ids, answer=answer))
            self.groups[self._num_groups] = _Group(
                indices=[batch.indices[i] for i in group],
                metas=[batch.metas[i] for i in group],
                version=version,
                done={},
                trajs=self.turns.add(samples),
            )
            self._num_groups += 1

    def _idle(self, version: int) -> None:
        """Nothing in flight and nothing admissible: wait as the unit-by-unit path does
        (with the gateway, for its next request instead when no weights are on the way)."""
        a = self.actor
        gated = a.inbox.wanted > version  # new weights on the way: the quiet spell lasts until they are in
        if self.requests is not None and not gated:
            with a.activity("wait_data"):
                self.requests.arrived.wait(a.announce_wait_s)
        else:  # until the spell ends (the queue is asked again) or news comes
            a.inbox.wait_for_news(max(self.quiet.until - time.monotonic(), a.announce_wait_s))

    # -- the gateway's requests ----------------------------------------------------------
    def _take_requests(self) -> None:
        """The gateway's requests join the stream, one sequence each (its own max_new_tokens)."""
        assert self.requests is not None  # called with a streamed gateway
        for r in self.requests.take():
            try:
                (index,) = self.stream.add([r.ids], n=1, max_new_tokens=r.params.max_new_tokens)
            except ValueError as exc:  # too long for the model or its KV cache: this request fails alone (a 400)
                r.result.set_exception(exc)
                continue
            self._served[index] = r

    def _shared_step(self, version: int) -> bool:
        """One decode step of a stream the gateway's requests share: each completion goes to
        its request, its trajectory or its group."""
        a = self.actor
        assert self.requests is not None
        ended: list[Trajectory] = []
        mine: list[Completion] = []
        with a.activity("generate"):
            if self.turns is not None:
                self.turns.feed()
            decoding = self.stream.num_active > 0
            if decoding:
                with a.engine_lock:
                    finished = self.stream.step()
                for c in finished:
                    r = self._served.pop(c.prompt_index, None)
                    if r is not None:
                        self.requests.deliver(r, c)
                    else:
                        mine.append(c)
            if self.turns is not None:
                for c in mine:
                    self.turns.took(c)
                if not decoding:
                    self.turns.wait(a.announce_wait_s)
                ended = self.turns.ended()
        if ended:
            self._collect_trajectories(ended, version)
        elif mine and self.turns is None:
            self._collect(mine, version)
        return True

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
            self._check_versions(
                [
                    (g.version, c.token_versions, c.version, len(c.response_ids))
                    for g in (self.groups[p] for p in ready)
                    for c in g.done.values()
                ],
                version,
            )
            rows, metas, indices = [], [], []
            groups = [self.groups.pop(prompt_index) for prompt_index in ready]
            for g in groups:
                for j, (index, meta) in enumerate(zip(g.indices, g.metas)):
                    c = g.done[j]
                    rows.append(pack.completion_row(c, token_versions=True))
                    metas.append(pack.stamped(meta, c.version, len(c.response_ids), self.digests[c.version]))
                    indices.append(index)
            columns = pack.columns(rows)
        if a.scorer is not None:
            self._score(groups, columns, indices)
        self._put_columns(indices, columns, metas)

    def _score(self, groups: list[_Group], columns: dict[str, Any], indices: list[int]) -> None:
        """reward.placement = "rollout": the reward functions score the finished groups' rows
        here, and ``reward`` is put with their responses (as a unit does: ``unit.py``)."""
        a = self.actor
        assert a.scorer is not None  # called with reward.placement = "rollout"
        prompts, answers = [], []
        for g in groups:
            assert g.scored is not None  # kept at admission when this replica scores
            prompt_ids, group_answers = g.scored
            prompts += [prompt_ids] * len(g.indices)
            answers += group_answers
        with a.activity("score"):
            columns["reward"] = a.scorer.reward_column(prompts, answers, columns, indices)

    def _put(self, indices: list[int], rows: list, metas: list[RowMeta]) -> None:
        """Put finished groups' rows (acked inside the next request)."""
        self._put_columns(indices, pack.columns(rows), metas)

    def _put_columns(self, indices: list[int], columns: dict[str, Any], metas: list[RowMeta]) -> None:
        a = self.actor
        with a.activity("put"):
            a.tq.put(indices, columns, metas)
        a.acks.add_rows(TASK_ROLLOUT, indices)  # acked inside the next request
        a.num_items += len(indices)

    def _collect_trajectories(self, ended: list[Trajectory], version: int) -> None:
        """With an environment: put every group whose trajectories have all ended."""
        gone = {id(t) for t in ended}
        ready = []
        for key, g in self.groups.items():
            assert g.trajs is not None  # every group has trajectories with an environment
            if any(id(t) in gone for t in g.trajs) and all(t.done for t in g.trajs):
                ready.append(key)
        if not ready:
            return
        a = self.actor
        with a.activity("pack"):
            groups = [self.groups.pop(key) for key in ready]
            self._check_versions(
                [(g.version, t.versions, t.versions[0], len(t.ids)) for g in groups for t in g.trajs or ()], version
            )
            rows, metas, indices = [], [], []
            for g in groups:
                for t, index, meta in zip(g.trajs or (), g.indices, g.metas):
                    rows.append(t.columns(token_versions=True))
                    metas.append(pack.stamped(meta, t.versions[0], len(t.ids), self.digests[t.versions[0]]))
                    indices.append(index)
        self._put(indices, rows, metas)

    def _check_versions(self, rows: list[tuple[int, list[int] | None, int, int]], version: int) -> None:
        """Each row's versions (admitted under, its tokens', its tag, its length) are
        those this stream swapped in, in order, from the one its group was admitted under
        or a later one, tagged with the first; the engine still holds the last swap's weights."""
        a = self.actor
        for admitted, tv, tag, length in rows:
            if (
                tv is None
                or len(tv) != length
                or tv[0] < admitted
                or tag != tv[0]
                or any(x > y for x, y in zip(tv, tv[1:]))
                or tv[-1] > version
                or not set(tv) <= self.digests.keys()
            ):
                raise RuntimeError(
                    f"{a.ctx.name}: a partial rollout admitted at v{admitted} came back with token versions "
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
