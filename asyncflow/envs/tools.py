"""Tools as plain Python functions, and the tool-call format read from the model.

``ToolEnvironment`` exposes ``tools`` (name -> function). After each model turn it
looks for tool calls in the turn's text; each call runs, and the results go back
as one observation (a tool message, ``envs/render.py``). A turn without a call is
the final answer: ``score(sample, text)`` is the step's reward, and the trajectory
ends.

The call format follows the model's chat template:
- a template that knows tool calls (its text mentions ``<tool_call>``: Qwen 2/2.5/3,
  Hermes) gets ``<tool_call>{"name": "calc", "arguments": {"expr": "3*7"}}</tool_call>``,
  and the function is called with the arguments as keywords;
- any other template (the tiny character-level model has no tool support) gets the
  fallback ``<calc>3*7</calc>``: a tag named after the tool around its one text
  argument, and the function is called with that text.

A tool that raises ends the trajectory with an error (``actors/rollout/multiturn.py``):
a function that can fail on bad model input should return a message instead
(``calc`` answers ``error`` to an expression it cannot evaluate).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncflow.envs.base import Action, Environment, Observation, Sample, Step

Tool = Callable[..., Any]


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


class TagFormat:
    """``<name>text</name>``: the fallback for templates without tool calls."""

    def __init__(self, names: list[str]):
        alternatives = "|".join(re.escape(n) for n in names)
        self.pattern = re.compile(rf"<({alternatives})>(.*?)</\1>", re.DOTALL)

    def parse(self, text: str) -> list[ToolCall]:
        return [ToolCall(m.group(1), (m.group(2),)) for m in self.pattern.finditer(text)]


class JsonFormat:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen, Hermes).
    A block that is not a JSON object with a string ``name`` is not a call."""

    pattern = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str) -> list[ToolCall]:
        calls = []
        for m in self.pattern.finditer(text):
            try:
                obj = json.loads(m.group(1))
            except ValueError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                arguments = obj.get("arguments") or {}
                if isinstance(arguments, dict):
                    calls.append(ToolCall(obj["name"], (), tuple(sorted(arguments.items()))))
        return calls


def tool_format(tokenizer: Any, names: list[str]) -> TagFormat | JsonFormat:
    """The call format of this tokenizer's chat template (see the module docstring)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # several named templates
        template = " ".join(str(t) for t in template.values())
    return JsonFormat() if "<tool_call>" in template else TagFormat(names)


class ToolEnvironment(Environment):
    """An environment of tools. Subclasses set ``tools`` and implement ``score``."""

    tools: dict[str, Tool] = {}

    def bind(self, tokenizer: Any) -> None:
        super().bind(tokenizer)
        self.format = tool_format(tokenizer, list(self.tools))

    def reset(self, sample: Sample) -> Observation:
        self.sample = sample
        return None

    def score(self, sample: Sample, answer: str) -> float:
        """Reward of the final answer (a turn without tool calls)."""
        raise NotImplementedError

    def step(self, action: Action) -> Step:
        calls = self.format.parse(action.text)
        if not calls:
            return Step(reward=self.score(self.sample, action.text), done=True, info={"tool_calls": 0})
        results = []
        for call in calls:
            fn = self.tools.get(call.name)
            results.append(f"unknown tool {call.name}" if fn is None else str(fn(*call.args, **dict(call.kwargs))))
        return Step(observation="\n".join(results), info={"tool_calls": len(calls)})
