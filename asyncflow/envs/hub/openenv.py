"""OpenEnv environments (``openenv-core``) as asyncflow environments.

An OpenEnv environment is a server-side ``openenv.core.Environment`` whose ``reset`` and
``step(action)`` return an ``Observation`` (a pydantic model with ``done``, ``reward``,
``metadata`` and fields of its own), the action being a pydantic ``Action``. Here it
plays one trajectory, either

- in this process: ``make()`` returns the environment (``openenv_env(cls)`` builds the
  class for ``env.path``), or
- served elsewhere (a container, a Hugging Face Space, ``uv run server``): ``base_url``
  names the server, played over OpenEnv's own WebSocket client, one session per
  trajectory; the action's schema is read from the server's ``/schema``.

Mapping (docs/environments.md, "Hub environments"):
- ``reset``: called with ``reset_kwargs(sample)``, by default ``seed`` = a digest of the
  prompt (a GRPO group starts from one state); override it to hand the environment the
  sample (``{"question": sample.prompt, "answer": sample.answer}``). Its observation is
  inserted after the prompt.
- the turn's text is the action: a JSON object of the action's fields (a fenced
  ```json block too), or, for an action of one required field, the text itself as that
  field. A turn that is neither is answered, not raised: the observation says what an
  action is, reward 0, the trajectory goes on (``info["invalid_action"]``).
- the observation's own fields (not ``done``, ``reward``, ``metadata``) are rendered:
  one text field as its text, several as JSON (override ``render``); ``reward`` None is
  0; ``done`` ends the trajectory; ``metadata["tool_calls"]`` counts as tool calls (in
  process only: OpenEnv's server leaves ``metadata`` out of what it sends).
- the environment (or the served session) is closed when its trajectory ends, or when
  the driver drops a trajectory it ended (the turn limit, a timeout).
"""

from __future__ import annotations

import json
import re
import typing
import urllib.request
import weakref
from functools import cache
from typing import Any

from asyncflow.envs.base import Action, Environment, Observation, Sample, Step
from asyncflow.envs.gym import prompt_seed

_BASE_FIELDS = ("done", "reward", "metadata")
_FENCED = re.compile(r"```[\w-]*\s*\n(.*?)\n?\s*```", re.DOTALL)


def _openenv():
    try:
        import openenv.core as core
    except ImportError as exc:
        raise ImportError(
            "env.path names an OpenEnv environment (asyncflow.envs.hub.openenv), but openenv-core is not installed "
            "in this Python: pip install -e '.[hub]' (in the asyncflow checkout) on every rollout host (and the trainer's with [eval])"
        ) from exc
    return core


class InvalidAction(ValueError):
    """The model's turn is not an action of this environment."""


def parse_action(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The action's fields from a turn's text (the module docstring's rule), checked
    against ``schema`` (the action's JSON schema) for its required fields only."""
    body = text.strip()
    if fenced := _FENCED.fullmatch(body):
        body = fenced.group(1).strip()
    try:
        fields = json.loads(body)
    except ValueError:
        fields = None
    required = [f for f in schema.get("required", []) if f not in _BASE_FIELDS]
    if not isinstance(fields, dict):
        if len(required) != 1:
            raise InvalidAction(f"an action is a JSON object of its fields {_describe(schema)}")
        return {required[0]: text}
    missing = [f for f in required if f not in fields]
    if missing:
        raise InvalidAction(
            f"the action lacks {', '.join(missing)}: an action is a JSON object of its fields {_describe(schema)}"
        )
    return fields


def _describe(schema: dict[str, Any]) -> str:
    props = {k: v.get("type", "any") for k, v in schema.get("properties", {}).items() if k not in _BASE_FIELDS}
    return json.dumps(props)


def action_type(env: Any) -> Any:
    """The ``Action`` class an in-process environment takes, read from its generic
    base (``Environment[MyAction, MyObservation, State]``)."""
    base = _openenv().Action
    for cls in type(env).__mro__:
        for orig in getattr(cls, "__orig_bases__", ()):
            for arg in typing.get_args(orig):
                if isinstance(arg, type) and issubclass(arg, base):
                    return arg
    raise TypeError(
        f"{type(env).__name__} does not say its action type: declare it as Environment[MyAction, MyObservation, State], "
        "or set action_type on your OpenEnvEnvironment subclass"
    )


@cache
def _served_schema(base_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/schema", timeout=30) as reply:
        return json.loads(reply.read())["action"]


class OpenEnvEnvironment(Environment):
    """One trajectory of an OpenEnv environment: implement ``make`` (in process) or
    set ``base_url`` (served); override ``reset_kwargs`` and ``render`` as needed."""

    base_url: str = ""
    """A served environment's address (``http://host:port``); empty: ``make()``."""
    action_type: Any = None
    """The in-process environment's ``Action`` class; None: read from its generic base."""

    def make(self) -> Any:
        """A new in-process ``openenv.core.Environment`` (one per trajectory)."""
        raise NotImplementedError(f"{type(self).__name__}: implement make() (an in-process environment) or set base_url")

    def reset_kwargs(self, sample: Sample) -> dict[str, Any]:
        return {"seed": prompt_seed(sample)}

    def render(self, fields: dict[str, Any]) -> Observation:
        """The observation's own fields as what the model sees next."""
        if not fields:
            return None
        if len(fields) == 1 and isinstance(text := next(iter(fields.values())), str):
            return text
        return json.dumps(fields, ensure_ascii=False)

    # -- Environment ----------------------------------------------------------------------
    def reset(self, sample: Sample) -> Observation:
        core = _openenv()
        if self.base_url:
            self.client = core.GenericEnvClient(base_url=self.base_url).sync()
            self.closer = weakref.finalize(self, self.client.close)  # once: at done, or when the driver drops it
            self.client.connect()
            self.schema = _served_schema(self.base_url)
            result = self.client.reset(**self.reset_kwargs(sample))
            return self._observe(result.observation, result.reward, result.done)[0]
        self.env = self.make()
        if not isinstance(self.env, core.Environment):
            raise TypeError(
                f"{type(self).__name__}.make returned a {type(self.env).__name__}, not an openenv.core.Environment: "
                "return an instance of your OpenEnv environment, or set base_url to play a served one"
            )
        self.closer = weakref.finalize(self, self.env.close)
        self.action_cls = self.action_type or action_type(self.env)
        self.schema = self.action_cls.model_json_schema()
        return self._observe_model(self.env.reset(**self.reset_kwargs(sample)))[0]

    def close(self) -> None:
        """The trajectory ended however it ended (the driver's call): what ``reset`` opened is
        closed now rather than at garbage collection (once: the finalizer runs at most once)."""
        closer = getattr(self, "closer", None)
        if closer is not None:
            closer()

    def step(self, action: Action) -> Step:
        import pydantic

        try:  # the model's turn as an action; the environment's own errors are not caught here
            fields = parse_action(action.text, self.schema)
            typed = None if self.base_url else self.action_cls.model_validate(fields)
        except (InvalidAction, pydantic.ValidationError) as exc:
            why = str(exc)
            if isinstance(exc, pydantic.ValidationError):
                why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            return Step(observation=f"invalid action: {why}", info={"invalid_action": 1})
        if self.base_url:
            result = self.client.step(fields)
            observation, reward, done, info = self._observe(result.observation, result.reward, result.done)
        else:
            observation, reward, done, info = self._observe_model(self.env.step(typed))
        if done:
            self.closer()
        return Step(observation=None if done else observation, reward=reward, done=done, info=info)

    def _observe_model(self, obs: Any) -> tuple[Observation, float, bool, dict[str, Any]]:
        return self._observe(obs.model_dump(mode="json"), obs.reward, obs.done)

    def _observe(self, fields: dict[str, Any], reward: Any, done: bool) -> tuple[Observation, float, bool, dict[str, Any]]:
        metadata = fields.get("metadata") or {}
        info = {"tool_calls": metadata["tool_calls"]} if isinstance(metadata.get("tool_calls"), int) else {}
        own = {k: v for k, v in fields.items() if k not in _BASE_FIELDS}
        return self.render(own), float(reward or 0.0), bool(done), info


def openenv_env(
    make: Any, *, reset_kwargs: typing.Callable[[Sample], dict[str, Any]] | None = None, name: str | None = None
) -> type[OpenEnvEnvironment]:
    """An ``OpenEnvEnvironment`` class (a zero-argument factory, for ``env.path``) playing
    ``make()`` in process (``make`` is the environment's class, or a function making
    one); ``reset_kwargs(sample)``, if given, replaces the default ``{"seed": ...}``."""
    body: dict[str, Any] = {"make": lambda self: make()}
    if reset_kwargs is not None:
        body["reset_kwargs"] = lambda self, sample: reset_kwargs(sample)
    made = getattr(make, "__name__", "")
    return type(name or (f"OpenEnv{made}" if made.isidentifier() else "OpenEnvEnv"), (OpenEnvEnvironment,), body)
