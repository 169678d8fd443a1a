"""verifiers environments (v1, prime-rl's library) as asyncflow environments.

A verifiers environment is a taskset (the rows: ``TaskData`` with a prompt, a system
prompt, fields of its own), a ``Task`` per row that scores a finished trace (its
``@vf.reward`` methods), and an ``Env`` whose ``run(task, agents)`` plays one episode:
``agents.agent.run(task)`` for a plain taskset (the model answers the prompt once), or
``agents.<seat>.interaction(task)`` and ``turn(message)`` for an environment that talks
back (a game engine, OpenEnv or TextArena through verifiers' own tasksets).

Here asyncflow's policy sits in that one seat. ``verifiers_env(config)`` (``config``
is verifiers' env config: ``{"taskset": {"id": "my-taskset"}}``) is the class
``env.path`` names; per trajectory it

- finds the task by the sample's ``answer``, the task's key: the run's data are the
  taskset's rows, written once by ``write_data`` (``prompt``: the task's system prompt
  and prompt as text; ``answer``: the key);
- runs the Env's ``run()`` on a thread of its own with its own event loop; each
  ``turn(message)`` hands ``message`` to the driver as the observation (None for a
  prompted task's opening, the prompt being the trajectory's prompt) and waits for the
  model's turn, which goes into the trace as the assistant's reply (its exact ids);
- when ``run()`` returns: the task's rewards on each trace (``Task.score``, without a
  runtime), the Env's ``finalize``, and the sum of the traces' weighted rewards is the
  step's reward (``info["verifiers_rewards"]``: each by name).

Not run here, since asyncflow's model is the policy and nothing may be downloaded:
verifiers' harness programs (uv scripts, containers), its interception server, MCP
toolsets and ``@vf.stop`` predicates; limits are asyncflow's (``env.max_turns``,
``env.step_timeout_s``). An Env with more than one seat is refused. A trajectory the
driver stops early (the turn limit) ends its episode when it is dropped: its last
``turn`` returns a terminated segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncflow.envs.base import Action, Environment, Observation, Sample, Step

_CLOSE = object()
_LOADED: dict[str, tuple[Any, dict[str, Any]]] = {}
_LOADING = threading.Lock()


def _verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError(
            "env.path names a verifiers environment (asyncflow.envs.hub.verifiers), but verifiers is not installed in "
            "this Python: pip install -e '.[hub]' (in the asyncflow checkout) on every rollout host (and the trainer's with [eval])"
        ) from exc
    return vf


def load(config: dict[str, Any], limit: int | None = None) -> tuple[Any, dict[str, Any]]:
    """The verifiers ``Env`` of ``config`` and its tasks by key (the first ``limit``),
    built once per process."""
    key = json.dumps([config, limit], sort_keys=True)
    with _LOADING:
        if key not in _LOADED:
            _verifiers()
            from verifiers.v1.utils.loaders import load_environment, resolve_env_config

            try:
                env = load_environment(resolve_env_config(config))
            except ImportError as exc:
                raise ValueError(
                    f"verifiers env {config}: {exc} Set taskset.id to an installed taskset package, or put its module "
                    "on cluster.python_path"
                ) from None
            tasks = env.taskset if limit is None else env.taskset.take(limit)
            if not tasks.bounded:
                raise ValueError(f"verifiers env {config}: the taskset is infinite; give verifiers_env(..., limit=N)")
            _LOADED[key] = (env, {task.key: task for task in tasks})
        return _LOADED[key]


def prompt_text(task: Any) -> str:
    """A task's prompt as the run's ``prompt`` text: its system prompt, a blank line, its
    prompt (the messages' text, joined); empty for a task the environment opens."""
    data = task.data
    text = data.prompt_text if data.prompt is not None else ""
    return f"{data.system_prompt}\n\n{text}" if data.system_prompt else text


def task_rows(config: dict[str, Any], limit: int | None = None) -> list[dict[str, str]]:
    """The run's data rows for the taskset of ``config``: ``prompt`` text, ``answer`` the task's key."""
    return [{"prompt": prompt_text(task), "answer": key} for key, task in load(config, limit)[1].items()]


def write_data(config: dict[str, Any], path: str | Path, limit: int | None = None) -> Path:
    """Write ``task_rows`` as JSON lines, the file ``data.path`` names."""
    path = Path(path)
    path.write_text("".join(json.dumps(row) + "\n" for row in task_rows(config, limit)))
    return path


class _Bridge:
    """Between the driver's calls (pool threads) and the episode (its thread and loop):
    ``events`` to the driver, the model's turns (or ``_CLOSE``) into the loop."""

    def __init__(self) -> None:
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.waiting: asyncio.Future | None = None

    async def ask(self, text: str | None) -> Action | None:
        """Hand ``text`` to the driver as the observation; the model's next turn, or
        None once the trajectory is over."""
        self.waiting = asyncio.get_running_loop().create_future()
        self.events.put(("turn", text))
        action = await self.waiting
        return None if action is _CLOSE else action

    def deliver(self, action: Any) -> None:
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the episode ended already
                loop.call_soon_threadsafe(self._resolve, action)

    def _resolve(self, action: Any) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(action)


def _text(message: Any) -> str:
    from verifiers.v1.types import content_text

    if isinstance(message, str):
        return message
    return "\n".join(content_text(m["content"] if isinstance(m, dict) else m.content) for m in message)


class _Exchange:
    """One seat's trace, turn by turn: what ``interaction()`` yields."""

    def __init__(self, bridge: _Bridge, trace: Any) -> None:
        self.bridge, self.trace = bridge, trace

    def add(self, message: Any, action: Action | None = None) -> None:
        from verifiers.v1.graph import MessageNode

        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        if action is None:
            self.trace.nodes.append(MessageNode(parent=parent, message=message))
        else:
            ids = list(action.ids)
            self.trace.nodes.append(
                MessageNode(parent=parent, message=message, sampled=True, token_ids=ids, mask=[True] * len(ids))
            )

    async def turn(self, message: Any = None) -> Any:
        vf = _verifiers()
        if message is not None:
            for m in [vf.UserMessage(content=message)] if isinstance(message, str) else message:
                self.add(m if not isinstance(m, dict) else vf.UserMessage(content=_text([m])))
        action = await self.bridge.ask(None if message is None else _text(message))
        if action is None:
            self.trace.stop("max_turns")
            return vf.Segment(messages=[], terminated=True)
        reply = vf.AssistantMessage(content=action.text)
        self.add(reply, action)
        return vf.Segment(messages=[reply])

    async def finish(self, task: Any) -> None:
        self.trace.stop("agent_completed")
        self.trace.ok = True
        await task.score(self.trace)


class _Seat:
    """asyncflow's policy in a verifiers seat: what ``Env.run`` calls on ``agents.<name>``."""

    def __init__(self, name: str, config: Any, bridge: _Bridge, traces: list) -> None:
        self.name, self.config, self.bridge, self.traces = name, config, bridge, traces

    def _exchange(self, task: Any) -> _Exchange:
        vf = _verifiers()
        from verifiers.v1.trace import AgentInfo, TraceTask

        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=self.config, name=self.name),
        )
        self.traces.append(trace)
        exchange = _Exchange(self.bridge, trace)
        if task.data.system_prompt:
            exchange.add(vf.SystemMessage(content=task.data.system_prompt))
        prompt = task.data.prompt
        for m in [] if prompt is None else [vf.UserMessage(content=prompt)] if isinstance(prompt, str) else prompt:
            exchange.add(m)
        return exchange

    async def run(self, task: Any, **_: Any) -> Any:
        exchange = self._exchange(task)
        await exchange.turn()
        await exchange.finish(task)
        return exchange.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any):
        exchange = self._exchange(task)
        try:
            yield exchange
        finally:
            await exchange.finish(task)


async def _episode(bridge: _Bridge, env: Any, task: Any) -> tuple[float, dict[str, float]]:
    vf = _verifiers()
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.trace import TraceTask

    bridge.loop = asyncio.get_running_loop()
    seats = agent_config_fields(env.config)
    if len(seats) != 1:
        raise ValueError(
            f"verifiers env {env.config.env_id!r} has {len(seats)} seats ({', '.join(seats)}): asyncflow's policy plays "
            "exactly one; pick an env of one seat"
        )
    traces: list = []
    agents = vf.Agents(env.config, lambda name, config: _Seat(name, config, bridge, traces))
    await env.setup(agents)
    await env.run(task, agents)
    episode = vf.Episode(env=vf.EnvInfo(id=env.config.env_id), task=TraceTask(type=type(task).__name__, data=task.data))
    episode.traces.extend(traces)
    await env.finalize(task, episode)
    rewards = {name: r.value for t in episode.traces for name, r in t.rewards.items() if r is not None}
    return sum(t.reward for t in episode.traces), rewards


def _play(bridge: _Bridge, env: Any, task: Any) -> None:
    try:
        reward, rewards = asyncio.run(_episode(bridge, env, task))
        bridge.events.put(("done", reward, rewards))
    except BaseException as exc:  # noqa: BLE001  (it goes to the driver's call, which raises it)
        bridge.events.put(("error", exc))


class VerifiersEnvironment(Environment):
    """One trajectory of a verifiers environment; ``verifiers_env`` makes the class."""

    config: dict[str, Any] = {}
    """verifiers' env config (``{"taskset": {"id": ...}}``, and its other keys)."""
    limit: int | None = None
    """Only the taskset's first ``limit`` tasks (needed for an infinite taskset)."""

    def reset(self, sample: Sample) -> Observation:
        env, tasks = load(self.config, self.limit)
        task = tasks.get(sample.answer)
        if task is None:
            raise KeyError(
                f"the sample's answer {sample.answer[:40]!r} is no task key of verifiers env {self.config}: write the run's "
                "data with asyncflow.envs.hub.verifiers.write_data (answer = the task's key) and give it as data.path"
            )
        self.bridge = _Bridge()
        self.thread = threading.Thread(target=_play, args=(self.bridge, env, task), name="verifiers-episode", daemon=True)
        self.thread.start()
        self.closer = weakref.finalize(self, self.bridge.deliver, _CLOSE)  # ended or dropped before the episode ended: end it
        self.ended: Step | None = None
        first = self._next()
        if first.done:  # run() ended without asking for a turn
            self.ended = first
        return first.observation

    def close(self) -> None:
        """The trajectory ended however it ended (the driver's call): what ``reset`` opened is
        closed now rather than at garbage collection (once: the finalizer runs at most once)."""
        closer = getattr(self, "closer", None)
        if closer is not None:
            closer()

    def step(self, action: Action) -> Step:
        if self.ended is not None:
            return self.ended
        self.bridge.deliver(action)
        return self._next()

    def _next(self) -> Step:
        event = self.bridge.events.get()
        if event[0] == "turn":
            return Step(observation=event[1] or None)
        if event[0] == "done":
            return Step(reward=float(event[1]), done=True, info={"verifiers_rewards": event[2]})
        raise event[1]


def verifiers_env(
    config: dict[str, Any], *, limit: int | None = None, name: str | None = None
) -> Callable[[], VerifiersEnvironment]:
    """A ``VerifiersEnvironment`` class (a zero-argument factory, for ``env.path``) for
    verifiers' env ``config``; nothing is loaded until the first trajectory."""
    return type(name or "VerifiersEnv", (VerifiersEnvironment,), {"config": config, "limit": limit})
