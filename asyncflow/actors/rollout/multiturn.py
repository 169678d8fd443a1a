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

Invariant: ``run`` returns one result per trajectory, in the order given, whatever
happened to each; an engine error fails the whole call (the unit), as single-turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import msgspec
import numpy as np

from asyncflow.actors.rollout import pack
from asyncflow.engines.base import RolloutEngine
from asyncflow.engines.config import SamplingParams
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

    def columns(self) -> dict[str, np.ndarray]:
        """The row's outputs (the shared trajectory format, docs/environments.md)."""
        return pack.row(
            response_ids=self.ids,
            rollout_logp=self.logp,
            finish=self.finished,
            loss_mask=self.mask,
            env_reward=0.0 if self.error else self.reward,
            env_error=bool(self.error),
            env_tool_calls=self.tool_calls,
        )


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
    """Observations cut to ``env.max_observation_chars``."""


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

    def __init__(self, env_cfg, tokenizer, factory=None):
        self.cfg = env_cfg
        self.tokenizer = tokenizer
        self.factory = factory or load_env_factory(env_cfg.path)
        self.pool = DaemonPool(env_cfg.num_threads, "env")
        self.stats = DriverStats()

    def close(self) -> None:
        self.pool.shutdown()

    # -- one unit ---------------------------------------------------------------------
    def run(
        self, engine: RolloutEngine, params: SamplingParams, samples: list[Sample], lock: AbstractContextManager | None = None
    ) -> list[Trajectory]:
        """Drive one trajectory per sample to its end; ``params.n`` is ignored (one
        sample per trajectory: give a group's prompt once per member). ``lock`` is held
        around each generate call (the replica's engine lock: the gateway shares the
        engine), never while environments step."""
        params = msgspec.structs.replace(params, n=1)
        trajs = []
        for sample in samples:
            traj = Trajectory(prompt_ids=list(sample.prompt_ids), env=self.factory())
            self._submit(traj, self._reset, traj.env, sample)
            trajs.append(traj)
        while not all(t.done for t in trajs):
            ready = [t for t in trajs if not t.done and t.future is None]
            if ready:
                pending = sum(1 for t in trajs if t.future is not None)
                self.stats.max_pending = max(self.stats.max_pending, pending)
                self._turn(engine, params, ready, lock or nullcontext())
                params = msgspec.structs.replace(params, seed=None)  # a seed starts the unit's stream once
            self._collect(trajs, block=not ready)
        for t in trajs:
            if not t.ids:  # ended before its first turn (an error in reset): one context token, out of the loss
                t.ids, t.logp, t.mask = [self.tokenizer.eos_token_id], [0.0], [0]
        return trajs

    def _reset(self, env: Environment, sample: Sample) -> Step:
        env.bind(self.tokenizer)
        return Step(observation=env.reset(sample))

    def _submit(self, traj: Trajectory, fn, *args) -> None:
        traj.future = self.pool.submit(fn, *args)
        traj.deadline = time.monotonic() + self.cfg.step_timeout_s

    def _turn(self, engine: RolloutEngine, params: SamplingParams, ready: list[Trajectory], lock: AbstractContextManager) -> None:
        """One generate call over the ready trajectories; each turn goes to its env."""
        limit = self.cfg.max_context_tokens
        fits = []
        for t in ready:
            if limit and len(t.prompt_ids) + len(t.ids) + params.max_new_tokens > limit:
                t.done = True  # no room for another turn: ends unfinished (finish 0)
            else:
                fits.append(t)
        if not fits:
            return
        with lock:
            completions = engine.generate([t.prompt_ids + t.ids for t in fits], params)
        self.stats.generate_calls += 1
        for t, c in zip(fits, completions):
            t.ids += c.response_ids
            t.logp += c.logprobs
            t.mask += [1] * len(c.response_ids)
            t.version = c.version
            t.turns += 1
            self.stats.turns += 1
            text = self.tokenizer.decode(c.response_ids, skip_special_tokens=True)
            action = Action(text=text, ids=list(c.response_ids), truncated=c.finish_reason == "length")
            self._submit(t, t.env.step, action)

    def _collect(self, trajs: list[Trajectory], block: bool) -> None:
        """Apply the environment calls that ended (waiting for the first one when
        ``block``: nothing else to do); end the ones past their deadline."""
        pending = [t for t in trajs if t.future is not None]
        if not pending:
            return
        if block:
            now = time.monotonic()
            futures = [t.future for t in pending if t.future is not None]
            wait(futures, timeout=max(0.0, min(t.deadline for t in pending) - now), return_when=FIRST_COMPLETED)
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
        ids = self._observation(step.observation)
        t.ids += ids
        t.logp += [0.0] * len(ids)
        t.mask += [0] * len(ids)

    def _observation(self, obs: Observation) -> list[int]:
        if obs is None or obs == "":
            return []
        limit = self.cfg.max_observation_chars
        if limit and len(obs) > limit:  # cut before the tokenizer or a list of ints sees it all
            self.stats.observations_cut += 1
            if self.stats.observations_cut == 1 or self.stats.observations_cut % 100 == 0:
                log.warning(
                    "an observation of %d %s was cut to env.max_observation_chars = %d (%d cut so far)",
                    len(obs),
                    "chars" if isinstance(obs, str) else "ids",
                    limit,
                    self.stats.observations_cut,
                )
            if isinstance(obs, str):
                obs = f"{obs[:limit]}[observation cut: {len(obs)} chars, env.max_observation_chars = {limit}]"
            else:
                obs = obs[:limit]
        if isinstance(obs, str):
            return observation_ids(self.tokenizer, obs)
        return [int(i) for i in obs]

    def _fail(self, t: Trajectory, why: str) -> None:
        self.stats.errors += 1
        t.error, t.done = why, True
        log.warning("trajectory ended by an environment error after %d turns: %s", t.turns, why)
