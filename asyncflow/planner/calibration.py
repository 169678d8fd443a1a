"""Efficiency factors (achieved over peak) and the profile file that stores them.

A profile is a msgspec Struct saved as JSON or TOML (by the file's suffix). The
factors multiply the hardware's peak figures; the fixed overheads add per call.
`fit_linear` turns measured (work, seconds) points into (efficiency, overhead_s):
time = overhead_s + work / (efficiency * peak), solved by least squares.
"""

from __future__ import annotations

import json
import math
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
    decode_overhead_s_per_layer: float = 0.0  # per layer per iteration (kernel dispatch, eager mode)
    decode_overhead_s_per_seq: float = 0.0  # per sequence in the batch, per iteration (sampling, bookkeeping)
    prefill_overhead_s_per_layer: float = 0.0  # per layer per prefill call
    train_overhead_s: float = 0.0  # fixed cost per training micro-batch
    forward_overhead_s: float = 0.0  # fixed cost per forward micro-batch
    train_overhead_s_per_token_layer: float = 0.0  # per token per layer: norms, activations, softmax (not FLOP-bound)
    forward_overhead_s_per_token_layer: float = 0.0
    # Framework work around the engines (afctl profile times the real code paths):
    generate_overhead_s: float = 0.0  # per generate call (scheduler set-up, KV slots, results)
    generate_overhead_s_per_seq: float = 0.0  # per sequence of a call (admission, its Completion)
    trainer_overhead_s: float = 0.0  # per trainer step outside train_step (metrics, bookkeeping)
    trainer_overhead_s_per_row: float = 0.0  # per row: token batching, rewards, advantages
    snapshot_overhead_s: float = 0.0  # per weight publish: fixed part (chunking, announcing)
    snapshot_s_per_param: float = 0.0  # per parameter: export to a host copy and stage it
    queue_ask_s: float = 0.0  # one request-reply to a queue actor (controller or shard)
    queue_ask_s_per_row: float = 0.0  # per row the ask carries (metadata, small columns)
    queue_handoff_s: float = 0.0  # from a put's return to a role waiting in another process holding the rows
    corun_slowdown: float = 1.0  # a compute stage's time while another of our processes computes, over its time alone


class Point(msgspec.Struct, kw_only=True, frozen=True):
    """One measurement: `work` is FLOPs (compute kinds) or bytes (bandwidth kinds)."""

    kind: str
    size: str  # human description of what was run ("hidden 128, 4 layers, batch 8")
    work: float
    time_s: float
    flops: float = 0.0  # decode points: the iteration's FLOPs (it may be compute-bound)
    batch: int = 0  # decode points: sequences per iteration
    num_layers: int = 0  # of the model measured
    tokens: int = 0  # train / forward points: tokens of the batch


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


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(rhs)
    m = [row[:] + [r] for row, r in zip(matrix, rhs)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def nonneg_least_squares(columns: list[list[float]], y: list[float], weights: list[float]) -> list[float]:
    """Weighted least squares y ~ sum c_j columns_j with every c_j >= 0 (tries every subset; few columns)."""
    k = len(columns)
    best, best_err = [0.0] * k, sum(w * v * v for w, v in zip(weights, y))
    for mask in range(1, 2**k):
        idx = [j for j in range(k) if mask >> j & 1]
        gram = [[sum(w * columns[a][i] * columns[b][i] for i, w in enumerate(weights)) for b in idx] for a in idx]
        rhs = [sum(w * columns[a][i] * y[i] for i, w in enumerate(weights)) for a in idx]
        sol = _solve(gram, rhs)
        if sol is None or min(sol) < 0:
            continue
        coef = [0.0] * k
        for j, c in zip(idx, sol):
            coef[j] = c
        err = sum(w * (v - sum(coef[j] * columns[j][i] for j in range(k))) ** 2 for i, (w, v) in enumerate(zip(weights, y)))
        if err < best_err:
            best, best_err = coef, err
    return best


def fit_max(
    work: list[float], other_s: list[float], time_s: list[float], peak: float,
    overhead_columns: list[list[float]] | None = None, grid: int = 200,
) -> tuple[float, list[float]]:
    """Fit `time = sum_j c_j x_j + max(work / (eff * peak), other_s)`; returns (eff, [c_j]).

    For decode: `work` is bytes read per iteration, `other_s` its compute-bound time
    (from the prefill efficiency), the overhead columns e.g. layers (dispatch per
    layer) and batch (per-sequence sampling and bookkeeping). A log grid over eff,
    the overheads by non-negative least squares on relative errors.
    """
    columns = overhead_columns if overhead_columns is not None else [[1.0] * len(work)]
    weights = [1.0 / t**2 for t in time_s]

    def score(log_eff: float) -> tuple[float, float, list[float]]:
        eff = 10**log_eff
        pred = [max(w / (eff * peak), o) for w, o in zip(work, other_s)]
        coef = nonneg_least_squares(columns, [t - p for t, p in zip(time_s, pred)], weights)
        fitted = [p + sum(c * col[n] for c, col in zip(coef, columns)) for n, p in enumerate(pred)]
        return sum(((t - f) / t) ** 2 for t, f in zip(time_s, fitted)), eff, coef

    # Coarse log grid over (1e-4, 1], then a finer one around the best point.
    step = 4 / (grid - 1)
    best = min((score(-4 + i * step) for i in range(grid)), key=lambda r: r[0])
    centre = math.log10(best[1])
    fine = [min(0.0, centre - step + 2 * step * j / 100) for j in range(101)]
    best = min([best] + [score(x) for x in fine], key=lambda r: r[0])
    return best[1], best[2]


def fit_terms(columns: list[list[float]], time_s: list[float]) -> list[float]:
    """Non-negative coefficients c_j of `time = sum_j c_j x_j` (relative least squares).

    For the framework's fixed costs: e.g. columns [1, rows] give (seconds per step,
    seconds per row); [1, params] (seconds per publish, seconds per parameter)."""
    if not time_s or any(len(col) != len(time_s) for col in columns):
        raise ValueError("fit_terms needs one value per measurement in every column")
    return nonneg_least_squares(columns, list(time_s), [1.0 / t**2 for t in time_s])


def fit_corun(points: list[Point]) -> float:
    """`corun_slowdown` from "corun" points: work 1 = the stage alone, work 2 = two at once
    (each point a median time); the ratio of the means, at least 1."""
    alone = [p.time_s for p in points if p.kind == "corun" and p.work == 1]
    both = [p.time_s for p in points if p.kind == "corun" and p.work == 2]
    if not alone or not both:
        raise ValueError("fit_corun needs points of one process alone (work 1) and of two at once (work 2)")
    return max(1.0, (sum(both) / len(both)) / (sum(alone) / len(alone)))


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
