"""Efficiency factors (achieved over peak) and the profile file that stores them.

A profile is a msgspec Struct saved as JSON or TOML (by the file's suffix). The
factors multiply the hardware's peak figures; the fixed overheads add per call.
`fit_linear` turns measured (work, seconds) points into (efficiency, overhead_s):
time = overhead_s + work / (efficiency * peak), solved by least squares.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec


class Efficiency(msgspec.Struct, kw_only=True, frozen=True):
    """Achieved fraction of peak for each kind of work. Defaults: typical published MFU/MBU."""

    prefill_flops: float = 0.45  # prefill: compute-bound matmuls
    decode_bandwidth: float = 0.65  # decode: weights + KV read per iteration
    train_flops: float = 0.35  # forward + backward (+ recompute), model FLOPs utilisation
    forward_flops: float = 0.40  # reference / critic forward
    link_bandwidth: float = 0.70  # weight sync and collectives
    decode_overhead_s: float = 0.0  # fixed cost per decode iteration (launch, sampling, python)
    train_overhead_s: float = 0.0  # fixed cost per training micro-batch
    forward_overhead_s: float = 0.0  # fixed cost per forward micro-batch


class Point(msgspec.Struct, kw_only=True, frozen=True):
    """One measurement: `work` is FLOPs (compute kinds) or bytes (bandwidth kinds)."""

    kind: str
    size: str  # human description of what was run ("hidden 128, 4 layers, batch 8")
    work: float
    time_s: float
    flops: float = 0.0  # decode points: the iteration's FLOPs (it may be compute-bound)


class Profile(msgspec.Struct, kw_only=True):
    hardware: str
    efficiency: Efficiency
    points: list[Point] = []
    created_at: str = ""
    notes: str = ""


def fit_linear(work: list[float], time_s: list[float], peak: float) -> tuple[float, float]:
    """Least-squares `time = overhead + work / (eff * peak)`; returns (eff, overhead_s).

    With one point, or a negative intercept, the overhead is taken as zero and the
    efficiency fitted through the origin. The efficiency is clipped to (0, 1].
    """
    if len(work) != len(time_s) or not work:
        raise ValueError("fit_linear needs as many times as work sizes, at least one")
    n = len(work)
    overhead = 0.0
    if n >= 2:
        mean_w, mean_t = sum(work) / n, sum(time_s) / n
        var = sum((w - mean_w) ** 2 for w in work)
        if var > 0:
            slope = sum((w - mean_w) * (t - mean_t) for w, t in zip(work, time_s)) / var
            overhead = mean_t - slope * mean_w
            if slope > 0 and overhead >= 0:
                return min(1.0, 1.0 / (slope * peak)), overhead
    slope = sum(w * t for w, t in zip(work, time_s)) / sum(w * w for w in work)
    if slope <= 0:
        raise ValueError("measured times do not grow with work: profile larger sizes")
    return min(1.0, 1.0 / (slope * peak)), 0.0


def fit_max(
    work: list[float], other_s: list[float], time_s: list[float], peak: float, grid: int = 400
) -> tuple[float, float]:
    """Fit `time = overhead + max(work / (eff * peak), other_s)`; returns (eff, overhead_s).

    For decode: `work` is bytes read, `other_s` the compute-bound time of the same
    iteration (from the prefill efficiency), so the bandwidth factor is fitted the way
    the cost model uses it. A log grid over eff, the overhead in closed form.
    """
    best = (float("inf"), 1.0, 0.0)
    for i in range(grid):
        eff = 10 ** (-4 + 4 * i / (grid - 1))
        pred = [max(w / (eff * peak), o) for w, o in zip(work, other_s)]
        overhead = max(0.0, sum(t - p for t, p in zip(time_s, pred)) / len(pred))
        err = sum((t - overhead - p) ** 2 for t, p in zip(time_s, pred))
        if err < best[0]:
            best = (err, eff, overhead)
    return best[1], best[2]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value == float("inf") else "-inf" if value == float("-inf") else repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid TOML basic strings
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _to_toml(data: dict) -> str:
    """TOML of a profile: scalars, then tables, then arrays of tables (no tomli_w needed)."""
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, (dict, list))]
    for key, table in ((k, v) for k, v in data.items() if isinstance(v, dict)):
        lines += ["", f"[{key}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    for key, rows in ((k, v) for k, v in data.items() if isinstance(v, list)):
        for row in rows:
            lines += ["", f"[[{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in row.items()]
    return "\n".join(lines) + "\n"


def save_profile(profile: Profile, path: str | Path) -> None:
    path = Path(path)
    if path.suffix == ".toml":
        path.write_text(_to_toml(msgspec.to_builtins(profile)))
    else:
        path.write_bytes(msgspec.json.format(msgspec.json.encode(profile), indent=2))


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no profile at {path}: create one with `afctl profile --out {path}`")
    data = path.read_bytes()
    try:
        if path.suffix == ".toml":
            return msgspec.toml.decode(data, type=Profile)
        return msgspec.json.decode(data, type=Profile)
    except msgspec.ValidationError as exc:
        raise ValueError(f"{path} is not a planner profile ({exc}); recreate it with `afctl profile`") from exc
