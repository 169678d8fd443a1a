"""The tool example: multi-digit multiplication with a ``calc`` tool.

The prompt is ``"37*48="`` (operands 10..99), the answer ``"1776"``. The tiny model
cannot multiply; with the tool it only has to call it and copy the result:

    <|user|>37*48=<|assistant|><calc>37*48</calc></s>      model turn 1 (loss)
    <|user|>1776<|assistant|>                              tool result (context)
    1776</s>                                               model turn 2 (loss)

``CalcEnv`` gives reward 1 to a final answer equal to the product, 0 otherwise
(``env_reward``; examples/tools.toml sets ``env.reward = "replace"``).

Warm start (``warm_start_sequences``, used by ``toy/tasks.make_task_model``
for ``data.task = "calc"``): a short supervised pass on whole trajectories, loss on
model tokens only, where only ``TOOL_FRACTION`` of them call the tool and the rest
answer a random product at once. The model learns both formats and to copy a tool
result; RL then has to learn *when* to call the tool: the tool-call rate and the
reward rise together.
"""

from __future__ import annotations

import ast
import operator
import random

from asyncflow.envs.base import Sample
from asyncflow.envs.tools import ToolEnvironment

CALC_MIN, CALC_MAX = 10, 99
TOOL_FRACTION = 0.2
"""Share of tool trajectories in the second phase of the warm start: about the
tool-call rate RL starts from."""
WARM_LR = 3e-3
FORMAT_STEPS = 50
"""Steps of the second phase (the mix of tool calls and direct guesses)."""
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("not integer arithmetic")


def calc(expr: str) -> str:
    """Integer arithmetic (``+ - * //`` and parentheses, at most 40 characters);
    ``error`` for anything else (bad model input is an answer, not a failure)."""
    try:
        if len(expr) > 40:
            raise ValueError("too long")
        return str(_eval(ast.parse(expr.strip(), mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, RecursionError):
        return "error"


class CalcEnv(ToolEnvironment):
    """``env.path = "asyncflow.envs.calc:CalcEnv"``."""

    tools = {"calc": calc}

    def score(self, sample: Sample, answer: str) -> float:
        return float(answer.strip() == sample.answer)


def calc_example(rng: random.Random) -> dict[str, str]:
    a, b = rng.randint(CALC_MIN, CALC_MAX), rng.randint(CALC_MIN, CALC_MAX)
    return {"prompt": f"{a}*{b}=", "answer": str(a * b)}


def warm_start(model, tokenizer, steps: int, seed: int = 0, progress=None) -> None:
    """The calc model's warm start, in two phases of supervised training on whole
    trajectories (loss on model turns only): ``steps`` on tool trajectories alone
    (the call format, copying the operands, copying the result), then
    ``FORMAT_STEPS`` on a mix where only ``TOOL_FRACTION`` call the tool and the rest
    guess a product at once, so the model starts RL knowing the tool but rarely
    using it. ``progress(done, total, loss)`` counts the steps of both phases."""
    import torch

    from asyncflow.toy.tiny import masked_warm_start

    pad = tokenizer.pad_token_id
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a model this small gains nothing from more, and loses much on a loaded machine
    try:
        tools = warm_start_sequences(tokenizer, seed=seed, tool_fraction=1.0)
        total = steps + FORMAT_STEPS
        first = (lambda done, _, loss: progress(done, total, loss)) if progress else None
        second = (lambda done, _, loss: progress(steps + done, total, loss)) if progress else None
        masked_warm_start(model, pad, tools, steps, lr=WARM_LR, seed=seed, progress=first)
        mix = warm_start_sequences(tokenizer, seed=seed + 1, tool_fraction=TOOL_FRACTION)
        masked_warm_start(model, pad, mix, FORMAT_STEPS, lr=WARM_LR, seed=seed + 1, progress=second)
    finally:
        torch.set_num_threads(threads)


def warm_start_sequences(tokenizer, num: int = 2000, seed: int = 0, tool_fraction: float = TOOL_FRACTION):
    """(ids, loss mask) of ``num`` whole trajectories, rendered as the rollout renders
    them (prompt by the chat template, observation by ``envs/render.py``)."""
    from asyncflow.engines.prompts import encode_chat_prompt
    from asyncflow.envs.render import observation_ids

    rng = random.Random(seed)
    eos = tokenizer.eos_token_id
    text = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    out = []
    for _ in range(num):
        ex = calc_example(rng)
        expr = ex["prompt"].rstrip("=")
        prompt = encode_chat_prompt(tokenizer, ex["prompt"])
        if rng.random() < tool_fraction:
            call = text(f"<calc>{expr}</calc>") + [eos]
            obs = observation_ids(tokenizer, ex["answer"])
            final = text(ex["answer"]) + [eos]
            ids = prompt + call + obs + final
            mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)
        else:
            guess = text(str(rng.randint(CALC_MIN, CALC_MAX) * rng.randint(CALC_MIN, CALC_MAX))) + [eos]
            ids = prompt + guess
            mask = [0] * len(prompt) + [1] * len(guess)
        out.append((ids, mask))
    return out
