"""Rule-based rewards and custom rewards by dotted path.

Every reward function has one batch signature::

    fn(prompts: list[str], responses: list[str], answers: list[str],
       finish_reasons: list[str]) -> list[float]

``responses`` are decoded without special tokens; ``finish_reasons[i]`` is 'stop'
when the response ended with a stop token and 'length' when it was cut at
max_new_tokens; ``answers`` are the dataset's reference answers. The result has one
float per sample. A custom reward is named ``"package.module:function"`` and loaded
with ``load_reward_fn``.

Every value a reward function returns is checked before it is used: a function that
returns the wrong number of values, or a value that is not a finite number (NaN,
inf), is refused with a ``RewardError`` naming the function and the row. Bad values
never reach training. ``weighted_sum`` checks each of its terms the same way.

Invariant: rule-based rewards are deterministic and never raise on malformed model
output (an unparsable answer scores 0).
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction

RewardFn = Callable[[list[str], list[str], list[str], list[str]], list[float]]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_ANY_NUMBER = re.compile(r"\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}|" + _NUMBER.pattern)


def exact_match(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    """1.0 when the stripped response equals the stripped answer."""
    return [float(r.strip() == a.strip()) for r, a in zip(responses, answers)]


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def parse_number(text: str) -> Fraction | None:
    """A number from ``text``: integers, decimals, '1,000', 'a/b', '\\frac{a}{b}',
    with surrounding '$', spaces and a trailing '.' ignored; None when it is not one
    number."""
    s = text.strip().strip("$").strip().rstrip(".").strip()
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace(" ", "")
    m = _FRAC.fullmatch(s) or _FRAC.fullmatch(s.lstrip("-"))
    if m:
        num, den = parse_number(m.group(1)), parse_number(m.group(2))
        if num is None or den is None or den == 0:
            return None
        value = num / den
        return -value if s.startswith("-") else value
    if not _NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    if "/" in s:
        top, bottom = s.split("/")
        return None if int(bottom) == 0 else Fraction(top) / Fraction(bottom)
    return Fraction(s)


def extract_answer(response: str) -> Fraction | None:
    """The model's final answer: the last ``\\boxed{}`` if any, else the last number."""
    boxed = last_boxed(response)
    if boxed is not None:
        return parse_number(boxed)
    found = [m.group(0) for m in _ANY_NUMBER.finditer(response)]
    return parse_number(found[-1]) if found else None


def math_answer(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
    """1.0 when the response's final answer equals the reference as a number
    (3/4 == 0.75 == \\frac{3}{4}); 0.0 otherwise, or when either does not parse."""
    out = []
    for r, a in zip(responses, answers):
        got, want = extract_answer(r), parse_number(last_boxed(a) or a)
        out.append(float(got is not None and want is not None and got == want))
    return out


def format_reward(pattern: str) -> RewardFn:
    """A reward of 1.0 when the stripped response matches ``pattern`` in full and the
    response ended with a stop token (not cut by max_new_tokens)."""
    compiled = re.compile(pattern)

    def reward(prompts: list[str], responses: list[str], answers: list[str], finish_reasons: list[str]) -> list[float]:
        return [float(f == "stop" and compiled.fullmatch(r.strip()) is not None) for r, f in zip(responses, finish_reasons)]

    return reward


class RewardError(ValueError):
    """A reward function returned values that cannot be trained on."""


def reward_name(fn: Callable) -> str:
    """``module:qualname`` of a reward function, as a config names it."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def _checked(fn: Callable, out: Sequence, prompts: Sequence[str], row_ids: Sequence[int] | None) -> list[float]:
    """``out`` as floats, after checking it has one finite number per prompt."""
    name = reward_name(fn)
    if isinstance(out, (str, bytes, dict)):  # has a len, but is not one value per sample
        raise RewardError(
            f"reward function {name} returned {type(out).__name__} {str(out)[:40]!r}, not a list of floats; "
            "return one float per sample"
        )
    try:
        count = len(out)
    except TypeError:
        raise RewardError(
            f"reward function {name} returned {type(out).__name__}, not a list of floats; return one float per sample"
        ) from None
    if count != len(prompts):
        raise RewardError(
            f"reward function {name} returned {count} values for {len(prompts)} responses "
            f"(expected {len(prompts)}, got {count}); return one float per sample"
        )
    values = []
    for i, v in enumerate(out):
        try:  # a number (bool, numpy and torch scalars included); a string is not one, whatever it spells
            value = math.nan if isinstance(v, (str, bytes)) else float(v)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            row = f"row {row_ids[i]}, " if row_ids is not None else ""
            raise RewardError(
                f"reward function {name} returned {v!r} for sample {i} ({row}prompt {prompts[i][:80]!r}); "
                f"a reward must be a finite number"
            )
        values.append(value)
    return values


class weighted_sum:
    """sum_i w_i * fn_i(...): e.g. partial credit for format plus exact match. Each
    term's values are checked (count, finiteness) under the term's own name."""

    def __init__(self, *terms: tuple[float, RewardFn]):
        self.terms = terms
        self.__module__ = __name__
        self.__qualname__ = "weighted_sum(" + ", ".join(f"{w:g}*{reward_name(fn)}" for w, fn in terms) + ")"

    def __call__(
        self,
        prompts: list[str],
        responses: list[str],
        answers: list[str],
        finish_reasons: list[str],
        row_ids: Sequence[int] | None = None,
    ) -> list[float]:
        total = [0.0] * len(responses)
        for weight, fn in self.terms:
            for i, v in enumerate(_checked(fn, fn(prompts, responses, answers, finish_reasons), prompts, row_ids)):
                total[i] += weight * v
        return total


BUILTIN_REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "math_answer": math_answer}


def load_reward_fn(spec: str) -> RewardFn:
    """A reward function by name: a builtin ('exact_match', 'math_answer') or a
    dotted path 'package.module:function' importable on every reward host."""
    if spec in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[spec]
    if ":" not in spec:
        raise ValueError(f"reward {spec!r}: use a builtin {sorted(BUILTIN_REWARDS)} or 'package.module:function'")
    module_name, attr = spec.split(":", 1)
    fn = getattr(importlib.import_module(module_name), attr, None)
    if fn is None or not callable(fn):
        raise ValueError(f"reward {spec!r}: module {module_name!r} has no callable {attr!r}")
    params = list(inspect.signature(fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 4 and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise ValueError(
            f"reward {spec!r} takes {len(positional)} positional arguments; a reward is "
            "fn(prompts, responses, answers, finish_reasons) -> list[float]"
        )
    return fn


def call_reward(
    fn: RewardFn,
    prompts: Sequence[str],
    responses: Sequence[str],
    answers: Sequence[str],
    finish_reasons: Sequence[str],
    row_ids: Sequence[int] | None = None,
) -> list[float]:
    """Call a reward function and check it returned one finite float per sample
    (``RewardError`` naming the function and the row otherwise; ``row_ids`` label the
    rows in that error)."""
    args = (list(prompts), list(responses), list(answers), list(finish_reasons))
    out = fn(*args, row_ids=row_ids) if isinstance(fn, weighted_sum) else fn(*args)
    return _checked(fn, out, prompts, row_ids)
