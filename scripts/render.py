"""Pages from templates and the measurements' JSON (scripts/records.py). No figure in a page
is typed by hand: a template is text with placeholders, each filled from a record's JSON.

A template (scripts/pages/<page>.md) is markdown with:

- ``{expr}`` or ``{expr:spec}``: a Python expression over the records (by name) and the
  helpers in ``HELPERS``, formatted with ``spec`` (``.3f``, ``+.3f``; ``.2fx`` adds an "x",
  ``min`` turns seconds into minutes). A record reads as its JSON's ``result``; ``command``,
  ``when``, ``seconds``, ``load_avg_1m`` and ``cpu`` are its own; a record measured per seed
  has ``runs``, one entry per seed. A key that is a Python keyword takes a trailing ``_``
  (``systems.async_``).
- ``@let NAME = expr``: a name for the lines below.
- ``@for NAME in expr`` ... ``@end``: the lines between, once per item.
- ``@if expr`` ... ``@end``: the lines between, only where ``expr`` is true (``has("name")``:
  the record's JSON is kept).
- ``@lines expr``: the lines an expression returns (``paired(...).table(...)``).

Conclusions are text in the template; the code below computes figures and verdicts only.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

META = ("command", "when", "seconds", "load_avg_1m", "cpu", "seed")
"""Keys of a record (or of one seed's entry) beside its ``result``."""


class Node:
    """A record's JSON seen by a template: keys as attributes, each key read noted in ``reads``."""

    def __init__(self, value: object, name: str, path: str, reads: set[tuple[str, str]]):
        self._value, self._name, self._path, self._reads = value, name, path, reads

    def _child(self, key: str) -> object:
        value = self._value
        assert isinstance(value, dict), f"{self._name}: {self._path} is not an object"
        top = key in value and (key in META or key == "runs")  # a record's own keys, or a per-seed record's entries
        if not top and key not in value and isinstance(value.get("result"), dict):
            value = value["result"]  # a record (or a seed's entry): its result's keys read as its own
        if key not in value:
            raise KeyError(f"{self._name} has no key {key!r} at {self._path or 'its top'}")
        path = ("" if key == "runs" else key) if top else f"{self._path}.{key}".lstrip(".")
        self._reads.add((self._name, path))
        return wrap(value[key], self._name, path, self._reads)

    def __getattr__(self, key: str) -> object:
        if key.startswith("_"):
            raise AttributeError(key)
        return self._child(key.removesuffix("_"))

    def __getitem__(self, key: object) -> object:
        if isinstance(key, int):
            assert isinstance(self._value, list)
            return wrap(self._value[key], self._name, self._path, self._reads)
        return self._child(str(key))

    def __iter__(self):
        assert isinstance(self._value, (list, dict)), f"{self._name}: {self._path} is not a list"
        if isinstance(self._value, dict):
            return iter(self._value)
        return (wrap(x, self._name, self._path, self._reads) for x in self._value)

    def __len__(self) -> int:
        return len(self._value)  # type: ignore[arg-type]

    def items(self):
        assert isinstance(self._value, dict)
        return ((k, self._child(k)) for k in self._value)


def wrap(value: object, name: str, path: str, reads: set[tuple[str, str]]) -> object:
    return Node(value, name, path, reads) if isinstance(value, (dict, list)) else value


def fmt(value: object, spec: str) -> str:
    if spec == "min":
        return f"{float(value) / 60:.1f}"  # type: ignore[arg-type]
    if spec.endswith("x"):
        return format(value, spec[:-1]) + "x"
    return format(value, spec)


@dataclass
class Paired:
    """Two figures measured on the same seeds, compared seed by seed: the difference a - b, its mean,
    sd and standard error of the mean (sd / sqrt(n)), how many standard errors the mean is from 0,
    the verdict "mean >= at_least", and ``not_worse``: "mean > -2 standard errors"."""

    seeds: list
    a: list[float]
    b: list[float]
    at_least: float = 0.0
    diff: list[float] = field(init=False)

    def __post_init__(self) -> None:
        assert len(self.seeds) == len(self.a) == len(self.b) >= 2, "a paired comparison needs 2 seeds or more"
        self.diff = [x - y for x, y in zip(self.a, self.b)]
        self.n, self.mean, self.sd = len(self.diff), statistics.mean(self.diff), statistics.stdev(self.diff)
        self.se = self.sd / self.n**0.5
        self.z = abs(self.mean) / self.se if self.se else float("inf")
        self.verdict = "met" if self.mean >= self.at_least else "not met"
        # "not worse beyond noise": the mean difference above -2 standard errors
        self.not_worse = "met" if self.mean > -2 * self.se else "not met"
        self.summary = f"{self.mean:+.3f} (sd {self.sd:.3f}, s.e. {self.se:.3f}, {self.n} seeds, {self.z:.1f} s.e. from 0)"

    def table(self, a_name: str, b_name: str) -> list[str]:
        """Seed by seed, then the means; the last column is a - b."""
        out = [f"| seed | {a_name} | {b_name} | {a_name} minus {b_name} |", "|---|---|---|---|"]
        out += [f"| {s} | {x:.3f} | {y:.3f} | {d:+.3f} |" for s, x, y, d in zip(self.seeds, self.a, self.b, self.diff)]
        out.append(
            f"| mean | {statistics.mean(self.a):.3f} | {statistics.mean(self.b):.3f} | "
            f"**{self.mean:+.3f}** (sd {self.sd:.3f}, s.e. {self.se:.3f}) |"
        )
        return out


def col(record: Node, path: str) -> list:
    """One figure of every seed's entry of a per-seed record, in seed order (``path``: dotted keys)."""
    out = []
    for run in record.runs:  # type: ignore[attr-defined]
        value = run
        for key in path.split("."):
            value = value[key]
        out.append(value)
    return out


def paired(record: Node, a: str, b: str, at_least: float = 0.0) -> Paired:
    """Figure ``a`` against ``b`` of each seed's entry of a per-seed record."""
    return Paired(col(record, "seed"), col(record, a), col(record, b), at_least)


HELPERS = {
    "len": len, "min": min, "max": max, "sum": sum, "abs": abs, "round": round, "sorted": sorted, "zip": zip,
    "any": any, "all": all, "str": str, "format": format, "mean": statistics.mean, "median": statistics.median,
    "correlation": statistics.correlation, "col": col, "paired": paired, "Paired": Paired,
}  # fmt: skip

FIELD = re.compile(r"\{([^{}]+)\}")
SPEC = re.compile(r"^(.*?):([<>^+\- #0-9.,a-z%]*)$", re.S)


def fill(line: str, env: dict) -> str:
    def one(m: re.Match) -> str:
        expr, spec = m.group(1), ""
        if found := SPEC.match(expr):
            expr, spec = found.groups()
        return fmt(eval(expr, env), spec)  # noqa: S307  (templates are this repository's own text)

    return FIELD.sub(one, line)


def render(template: str, records: dict[str, dict], reads: set[tuple[str, str]] | None = None, **extra) -> str:
    """``template`` filled from ``records`` (name -> the JSON kept in docs/data); ``extra``: more helpers."""
    reads = set() if reads is None else reads
    env: dict = {"__builtins__": {}, **HELPERS, **extra, **{n: wrap(r, n, "", reads) for n, r in records.items()}}
    env["has"] = records.__contains__
    return "\n".join(_lines(template.split("\n"), env)).rstrip("\n") + "\n"


def _lines(lines: list[str], env: dict) -> Iterable[str]:
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("@let "):
            exec(line[5:], env)  # noqa: S102
        elif line.startswith("@lines "):
            yield from eval(line[7:], env)  # noqa: S307
        elif line.startswith("@if "):
            end = _matching_end(lines, i)
            if eval(line[4:], env):  # noqa: S307
                yield from _lines(lines[i + 1 : end], env)
            i = end
        elif line.startswith("@for "):
            name, expr = line[5:].split(" in ", 1)
            end = _matching_end(lines, i)
            for item in eval(expr, env):  # noqa: S307
                scope = {**env, "item_": item}
                exec(f"{name} = item_", scope)  # noqa: S102  (the loop's names, a tuple unpacked as in Python)
                yield from _lines(lines[i + 1 : end], scope)
            i = end
        else:
            yield fill(line, env)
        i += 1


def _matching_end(lines: list[str], start: int) -> int:
    depth = 0
    for j in range(start, len(lines)):
        depth += lines[j].startswith(("@for ", "@if "))
        depth -= lines[j] == "@end"
        if depth == 0:
            return j
    raise ValueError(f"@for or @if on template line {start + 1} has no @end")
