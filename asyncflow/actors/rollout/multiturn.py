"""The multi-turn driver of a rollout replica (``[env] path`` set): many trajectories
at once, each alternating model turns and environment steps, until done.

Scheduling (continuous batching across turns): the engine's thread runs one
``generate`` call over every trajectory whose next turn is ready; each finished
turn's ``env.step`` goes to a thread pool (``env.num_threads``) at once, and the
next ``generate`` call takes whatever trajectories are ready by then. A slow
environment step holds back only its own trajectory: the engine waits only when no
trajectory at all is ready.

Token-in/token-out: a trajectory's ``response_ids`` are every token after the prompt,
as the model saw them: its own turns (``loss_mask`` 1, log-probs of the engine) and
the observations inserted between them (``loss_mask`` 0, log-prob 0). Nothing is
re-tokenised: the next turn's prompt is ``prompt_ids + response_ids`` as ids.

Errors: an ``env.reset``/``env.step`` that raises, or that takes longer than
``env.step_timeout_s``, ends its trajectory only: ``env_error`` 1, ``env_reward``
0, the error logged with the row. A hung step's thread cannot be killed (Python
threads cannot): it keeps its pool thread, so ``num_threads`` bounds how many hung
calls a replica survives before new steps queue behind them (and time out too). The
pool's threads are daemons, so a hung call never holds the process at exit.

Versions: each response token records the policy version that produced it
(``Trajectory.versions``): a model token the version that sampled it (the engine's
``token_versions``, or the call's version), an observation token the version of the
model token before it (an observation before the first turn: the first turn's first
token's), so the list never decreases and its first entry is the oldest model token's.
Unit mode does not write them (one version per unit, the row's); partial rollout
writes them as ``token_versions``.

Partial rollout (``[workflow] partial_rollout``, ``TurnStream``): the trajectories'
turns join a ``RolloutStream`` (``engines/base.py``) instead of one ``generate`` call
per round of ready turns: a turn joins the stream as soon as its environment step is
back, and weights may swap between any two decode steps, so one trajectory's turns
(and one turn's tokens) can come from several versions.

Sizes: a trajectory never passes its context: the model's (``context_tokens``, its
``max_position_embeddings``) or ``env.max_context_tokens`` if smaller. A turn that could
pass it is not started; an observation is cut in tokens to what the context has left
after it for one more turn (``max_new_tokens``), and ends with a marker the model reads
(``[observation cut to fit the context ...]``). Before it is tokenised, a text longer
than the room times the longest token of the vocabulary (in characters) is cut to that:
what it loses could not have fitted anyway, and a 50 MB result is never tokenised whole.
An observation with no room even for the marker ends its trajectory (finish 0). Each cut
is counted (``observations_cut``) and logged.

Invariant: ``run`` returns one result per trajectory, in the order given, whatever
happened to each; an engine error fails the whole call (the unit), as single-turn.
``TurnStream.step`` returns each trajectory once, when it ends.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from asyncflow.actors.rollout import pack
from asyncflow.engines.base import Completion, RolloutEngine, RolloutStream
from asyncflow.engines.config import SamplingParams
from asyncflow.engines.tokenizer import longest_token_chars
from asyncflow.envs.base import Action, Environment, Observation, Sample, Step, load_env_factory
from asyncflow.envs.render import observation_ids

log = logging.getLogger(__name__)


@dataclass
class Trajectory:
    """One trajectory's state and, once done, its row."""

    prompt_ids: list[int]
    env: Environment
    ids: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    reward: float = 0.0
    """Discounted sum of the step rewards so far."""
    versions: list[int] = field(default_factory=list)
    """The version of each token of ``ids`` (module docstring; -1 on an observation before
    the first turn until that turn is taken)."""
    turns: int = 0
    tool_calls: int = 0
    finished: bool = False
    """The environment said done (``finish`` 1); otherwise the turn limit, the context
    limit or an error ended it."""
    error: str = ""
    done: bool = False
    version: int = -1
    future: Future | None = None
    deadline: float = 0.0
    hung: bool = False  # a call timed out: the environment may still be inside it (never closed)
    max_new_tokens: int = 0
    """The longest turn (the run's ``max_new_tokens``): an observation leaves room for one."""

    def columns(self, token_versions: bool = False) -> dict[str, np.ndarray]:
        """The row's outputs (the shared trajectory format, docs/environments.md), with
        ``token_versions`` for partial rollout."""
        out = pack.row(
            response_ids=self.ids,
            rollout_logp=self.logp,
            finish=self.finished,
            loss_mask=self.mask,
            env_reward=0.0 if self.error else self.reward,
            env_error=bool(self.error),
            env_tool_calls=self.tool_calls,
        )
        if token_versions:
            out.update(pack.row(token_versions=self.versions))
        return out


ENV_COLUMNS = ("loss_mask", "env_reward", "env_error", "env_tool_calls")
"""What a multi-turn row adds to ``response_ids``, ``rollout_logp`` and ``finish``."""


@dataclass
class DriverStats:
    """Counters of one replica's driver (for tests and the rollout's log)."""

    generate_calls: int = 0
    turns: int = 0
    env_steps: int = 0
    errors: int = 0
    timeouts: int = 0
    max_pending: int = 0
    """Most environment calls in flight while the engine generated."""
    observations_cut: int = 0
    """Observations cut to ``env.max_observation_chars`` or to the context left."""
    close_errors: int = 0
    """``Environment.close`` calls that raised (each logged: the first, then every 100th)."""


class DaemonPool:
    """A fixed pool of daemon threads running calls into futures (a
    ThreadPoolExecutor's threads are joined at interpreter exit: one hung environment
    call would hold the process)."""

    def __init__(self, num_threads: int, name: str):
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self.num_threads = num_threads
        for i in range(num_threads):
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._calls.put((future, fn, args))
        return future

    def shutdown(self) -> None:
        """Stop the idle threads (a hung one ends with the process)."""
        for _ in range(self.num_threads):
            self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued (its trajectory timed out)
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001  (any: it goes to the trajectory, the thread goes on)
                future.set_exception(exc)


class MultiTurnDriver:
    """Drives trajectories for one replica (``run``); owns the environment pool."""

    def __init__(self, env_cfg, tokenizer, factory=None, context_tokens: int = 0):
        """``context_tokens``: the model's context (``max_position_embeddings``); 0: unknown."""
        self.cfg = env_cfg
        self.tokenizer = tokenizer
        self.factory = factory or load_env_factory(env_cfg.path)
        self.pool = DaemonPool(env_cfg.num_threads, "env")
        self.stats = DriverStats()
        self.limit, self.limit_name = context_limit(env_cfg.max_context_tokens, context_tokens)

    @functools.cached_property
    def token_chars(self) -> int:
        """``longest_token_chars`` of the tokenizer (read at the first cut)."""
        return longest_token_chars(self.tokenizer)

    def close(self) -> None:
        self.pool.shutdown()

    # -- one unit ---------------------------------------------------------------------
    def run(
        self,
        engine: RolloutEngine,
        params: SamplingParams,
        samples: list[Sample],
        lock: AbstractContextManager | None = None,
        count: Callable[[Any], None] | None = None,
    ) -> list[Trajectory]:
        """Drive one trajectory per sample to its end; ``params.n`` is ignored (one
        sample per trajectory: give a group's prompt once per member). ``lock`` is held
        around each generate call (the replica's engine lock: the gateway shares the
        engine), never while environments step. ``count(engine.stats)`` after each
        generate call (the replica's decode counters)."""
        params = msgspec.structs.replace(params, n=1)
        trajs = [self.start(sample, params.max_new_tokens) for sample in samples]
        while not all(t.done for t in trajs):
            ready = [t for t in trajs if not t.done and t.future is None]
            if ready:
                pending = sum(1 for t in trajs if t.future is not None)
                self.stats.max_pending = max(self.stats.max_pending, pending)
                self._turn(engine, params, ready, lock or nullcontext(), count)
                params = msgspec.structs.replace(params, seed=None)  # a seed starts the unit's stream once
            self.collect(trajs, block=not ready)
        for t in trajs:
            self.end(t, engine.version)
        return trajs

    # -- one trajectory's steps (``run`` above, ``TurnStream`` below) -------------------
    def start(self, sample: Sample, max_new_tokens: int) -> Trajectory:
        """A new trajectory for ``sample`` whose turns are at most ``max_new_tokens``; its
        ``env.reset`` runs on the pool."""
        traj = Trajectory(prompt_ids=list(sample.prompt_ids), env=self.factory(), max_new_tokens=max_new_tokens)
        self._submit(traj, self._reset, traj.env, sample)
        return traj

    def next_context(self, t: Trajectory, max_new_tokens: int) -> list[int] | None:
        """The next turn's prompt (every id so far), or None when the turn could pass the
        context (``env.max_context_tokens``, the model's): the trajectory then ends
        unfinished (finish 0)."""
        limit = self.limit
        if limit and len(t.prompt_ids) + len(t.ids) + max_new_tokens > limit:
            t.done = True
            return None
        return t.prompt_ids + t.ids

    def took_turn(self, t: Trajectory, c: Completion) -> None:
        """Append a model turn (loss mask 1, its log-probs and versions) and send it to
        the environment (``env.step`` on the pool)."""
        versions = list(c.token_versions) if c.token_versions is not None else [c.version] * len(c.response_ids)
        if t.turns == 0 and versions:  # an observation before the first turn: that turn's first version
            t.versions = [versions[0] if v < 0 else v for v in t.versions]
        t.ids += c.response_ids
        t.logp += c.logprobs
        t.mask += [1] * len(c.response_ids)
        t.versions += versions
        t.version = c.version
        t.turns += 1
        self.stats.turns += 1
        text = self.tokenizer.decode(c.response_ids, skip_special_tokens=True)
        action = Action(text=text, ids=list(c.response_ids), truncated=c.finish_reason == "length")
        self._submit(t, t.env.step, action)

    def end(self, t: Trajectory, version: int) -> None:
        """Close an ended trajectory's row: one that never took a turn (an error in
        reset, no room) gets one context token, out of the loss; tokens that no turn
        dated get ``version`` (the version the row runs under)."""
        if not t.ids:
            t.ids, t.logp, t.mask, t.versions = [self.tokenizer.eos_token_id], [0.0], [0], [version]
        t.versions = [version if v < 0 else v for v in t.versions]
        if not t.hung and t.future is None:
            self.pool.submit(self._close, t.env)

    def _close(self, env: Environment) -> None:
        """``env.close()`` on the pool: its error is the environment's, logged and counted."""
        try:
            env.close()
        except Exception as exc:  # noqa: BLE001  (any: the trajectory is already out)
            self.stats.close_errors += 1
            if self.stats.close_errors == 1 or self.stats.close_errors % 100 == 0:
                log.warning(
                    "%s.close() raised %s: %s (%d so far)", type(env).__name__, type(exc).__name__, exc, self.stats.close_errors
                )

    def _reset(self, env: Environment, sample: Sample) -> Step:
        env.bind(self.tokenizer)
        return Step(observation=env.reset(sample))

    def _submit(self, traj: Trajectory, fn, *args) -> None:
        traj.future = self.pool.submit(fn, *args)
        traj.deadline = time.monotonic() + self.cfg.step_timeout_s

    def _turn(
        self,
        engine: RolloutEngine,
        params: SamplingParams,
        ready: list[Trajectory],
        lock: AbstractContextManager,
        count: Callable[[Any], None] | None,
    ) -> None:
        """One generate call over the ready trajectories; each turn goes to its env."""
        fits, prompts = [], []
        for t in ready:
            context = self.next_context(t, params.max_new_tokens)
            if context is not None:
                fits.append(t)
                prompts.append(context)
        if not fits:
            return
        with lock:
            completions = engine.generate(prompts, params)
        self.stats.generate_calls += 1
        if count is not None:
            count(getattr(engine, "stats", None))
        for t, c in zip(fits, completions):
            self.took_turn(t, c)

    def collect(self, trajs: list[Trajectory], block: bool, max_wait_s: float | None = None) -> None:
        """Apply the environment calls that ended (waiting for the first one when
        ``block``: nothing else to do, at most ``max_wait_s`` when given); end the ones
        past their deadline."""
        pending = [t for t in trajs if t.future is not None]
        if not pending:
            return
        if block:
            now = time.monotonic()
            futures = [t.future for t in pending if t.future is not None]
            timeout = max(0.0, min(t.deadline for t in pending) - now)
            wait(futures, timeout=timeout if max_wait_s is None else min(timeout, max_wait_s), return_when=FIRST_COMPLETED)
        now = time.monotonic()
        for t in pending:
            future = t.future
            assert future is not None
            if future.done():
                t.future = None
                try:
                    self._apply(t, future.result())
                except Exception as exc:  # the environment's error ends this trajectory only
                    self._fail(t, f"{type(exc).__name__}: {exc}")
            elif now >= t.deadline:
                future.cancel()
                t.future = None
                t.hung = True
                self.stats.timeouts += 1
                self._fail(t, f"environment call timed out after {self.cfg.step_timeout_s:g} s (env.step_timeout_s)")

    def _apply(self, t: Trajectory, step: Step) -> None:
        if t.turns > 0:  # a step (a reset has turns == 0)
            self.stats.env_steps += 1
            t.reward += step.reward * self.cfg.discount ** (t.turns - 1)
            t.tool_calls += int(step.info.get("tool_calls", 0))
            if step.done:
                t.finished = t.done = True
                return
            if t.turns >= self.cfg.max_turns:
                t.done = True  # the turn limit: ends unfinished (finish 0)
                return
        ids = self._observation(step.observation, self._room(t))
        if ids is None:  # not even the marker fits: the trajectory ends here (finish 0)
            t.done = True
            return
        t.ids += ids
        t.logp += [0.0] * len(ids)
        t.mask += [0] * len(ids)
        t.versions += [t.versions[-1] if t.versions else -1] * len(ids)  # -1: dated by the first turn (took_turn)

    def _room(self, t: Trajectory) -> int | None:
        """Tokens an observation may take in ``t``: the context less what it holds and one
        more turn; None without a context limit."""
        if not self.limit:
            return None
        return self.limit - len(t.prompt_ids) - len(t.ids) - t.max_new_tokens

    def _observation(self, obs: Observation, room: int | None = None) -> list[int] | None:
        """The ids of ``obs``, at most ``room`` of them (None: no limit); None when not
        even the marker fits."""
        if obs is None or obs == "":
            return []
        limit = self.cfg.max_observation_chars
        if limit and len(obs) > limit:  # cut before the tokenizer or a list of ints sees it all
            self._count_cut(f"an observation of {len(obs)} {'chars' if isinstance(obs, str) else 'ids'} was cut to "
                            f"env.max_observation_chars = {limit}")  # fmt: skip
            if isinstance(obs, str):
                obs = f"{obs[:limit]}[observation cut: {len(obs)} chars, env.max_observation_chars = {limit}]"
            else:
                obs = obs[:limit]
        if room is None:
            return observation_ids(self.tokenizer, obs) if isinstance(obs, str) else [int(i) for i in obs]
        ids = self._fit(obs, room)
        if ids is None:
            self._count_cut(f"an observation found no room in its trajectory ({self.limit_name}): the trajectory ends")
        return ids

    def _fit(self, obs: str | list[int], room: int) -> list[int] | None:
        """``obs`` as at most ``room`` ids: whole if it fits, else as much of it as fits
        followed by the marker (module docstring); None if the marker alone does not fit."""
        size = len(obs)
        if isinstance(obs, str):
            head = obs[: max(room, 0) * self.token_chars]  # a longer text surely passes the room: never tokenised whole
            ids = observation_ids(self.tokenizer, head)
        else:
            ids = [int(i) for i in obs[: max(room, 0) + 1]]
        if len(head if isinstance(obs, str) else obs) == size and len(ids) <= room:
            return ids
        marker = f"[observation cut to fit the context: {size} {'chars' if isinstance(obs, str) else 'ids'}, {self.limit_name}]"
        if isinstance(obs, str):
            content = self.tokenizer(head, add_special_tokens=False)["input_ids"]
            keep = room - (len(observation_ids(self.tokenizer, marker)))
            while keep > 0:  # the joins may tokenise a little differently: shrink until it fits
                ids = observation_ids(self.tokenizer, self.tokenizer.decode(content[:keep]) + marker)
                if len(ids) <= room:
                    break
                keep -= len(ids) - room
        else:
            marker_ids = self.tokenizer(marker, add_special_tokens=False)["input_ids"]
            keep = room - len(marker_ids)
            ids = ids[: max(keep, 0)] + list(marker_ids)
        if keep <= 0:
            return None
        self._count_cut(f"an observation of {size} {'chars' if isinstance(obs, str) else 'ids'} was cut to {len(ids)} "
                        f"tokens to fit the context ({self.limit_name})")  # fmt: skip
        return ids

    def _count_cut(self, what: str) -> None:
        self.stats.observations_cut += 1
        if self.stats.observations_cut == 1 or self.stats.observations_cut % 100 == 0:
            log.warning("%s (%d cut so far)", what, self.stats.observations_cut)

    def _fail(self, t: Trajectory, why: str) -> None:
        self.stats.errors += 1
        t.error, t.done = why, True
        log.warning("trajectory ended by an environment error after %d turns: %s", t.turns, why)


def context_limit(max_context_tokens: int, context_tokens: int) -> tuple[int, str]:
    """The tokens a trajectory may hold (0: no limit) and how a message names that limit."""
    if max_context_tokens and (not context_tokens or max_context_tokens <= context_tokens):
        return max_context_tokens, f"env.max_context_tokens = {max_context_tokens}"
    if context_tokens:
        return context_tokens, f"the model's context of {context_tokens} tokens, max_position_embeddings"
    return 0, ""


class TurnStream:
    """Multi-turn trajectories whose turns are decoded in one ``RolloutStream``
    (partial rollout with ``[env] path``; ``stream.py`` holds one). No queue, no actor:
    the replica's stream mode adds trajectories and calls ``step`` between weight swaps.

    Each ``step``: the environment calls that came back are applied; every trajectory
    whose next turn is ready joins the stream (its whole context as the prompt,
    prefilled under the weights held then); one decode step runs; each finished turn
    goes to its environment. A turn's tokens carry the versions that sampled them
    (``Completion.token_versions``), so a trajectory whose turns span a weight swap
    records each version (``Trajectory.versions``).

    Invariants: a trajectory is in the stream (a turn decoding), at its environment
    (a future), or ended, never two of these; ``step`` returns each trajectory once,
    when it ends, its row closed (``MultiTurnDriver.end``) with the version held then
    for tokens no turn dated."""

    def __init__(self, driver: MultiTurnDriver, stream: RolloutStream, max_new_tokens: int, version: Callable[[], int]):
        """``stream``: opened with ``n = 1`` (one sequence per turn). ``version()``: the
        version the engine holds (for a trajectory that ends before any turn)."""
        self.driver = driver
        self.stream = stream
        self.max_new_tokens = max_new_tokens
        self.version = version
        self.live: list[Trajectory] = []  # not ended
        self._decoding: dict[int, Trajectory] = {}  # stream prompt index -> trajectory whose turn decodes

    @property
    def num_live(self) -> int:
        """Trajectories not ended (decoding, at their environment, or ready)."""
        return len(self.live)

    def add(self, samples: list[Sample]) -> list[Trajectory]:
        """Start one trajectory per sample (``env.reset`` on the pool)."""
        trajs = [self.driver.start(sample, self.max_new_tokens) for sample in samples]
        self.live += trajs
        return trajs

    def step(self, wait_s: float) -> list[Trajectory]:
        """One round (class docstring) when this is the stream's only user: ``feed``, one
        decode step (or, with nothing to decode, a wait of at most ``wait_s`` for an
        environment call), ``ended``."""
        self.feed()
        if self.stream.num_active:
            for c in self.stream.step():
                self.took(c)
        else:
            self.wait(wait_s)
        return self.ended()

    def feed(self) -> None:
        """Apply the environment calls that came back; every trajectory whose next turn is
        ready joins the stream (one whose turn could pass ``env.max_context_tokens`` ends)."""
        self.driver.collect([t for t in self.live if t.future is not None], block=False)
        decoding = {id(t) for t in self._decoding.values()}
        ready = [t for t in self.live if not t.done and t.future is None and id(t) not in decoding]
        contexts = [(t, self.driver.next_context(t, self.max_new_tokens)) for t in ready]
        joining = [(t, ids) for t, ids in contexts if ids is not None]
        if joining:
            pending = sum(1 for t in self.live if t.future is not None)
            self.driver.stats.max_pending = max(self.driver.stats.max_pending, pending)
            for (t, _), index in zip(joining, self.stream.add([ids for _, ids in joining], n=1)):
                self._decoding[index] = t

    def owns(self, c: Completion) -> bool:
        """Whether ``c`` is a turn of one of these trajectories (the stream may serve others)."""
        return c.prompt_index in self._decoding

    def took(self, c: Completion) -> None:
        """The stream finished a turn: it goes to its environment."""
        self.driver.took_turn(self._decoding.pop(c.prompt_index), c)

    def wait(self, wait_s: float) -> None:
        """Nothing to decode: wait at most ``wait_s`` for an environment call."""
        self.driver.collect([t for t in self.live if t.future is not None], block=True, max_wait_s=wait_s)

    def ended(self) -> list[Trajectory]:
        """The trajectories that ended since the last call, their rows closed."""
        ended = [t for t in self.live if t.done]
        if ended:
            self.live = [t for t in self.live if not t.done]
            version = self.version()
            for t in ended:
                self.driver.end(t, version)
        return ended

    def close(self) -> None:
        """Drop every trajectory (their environment calls run out on the pool)."""
        self.live, self._decoding = [], {}
