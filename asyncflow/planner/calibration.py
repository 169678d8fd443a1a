"""Efficiency factors (achieved over peak) and the profile that stores them.

A profile is a msgspec Struct, saved as JSON or TOML (by the file's suffix) by
`planner.io.save_profile` and read by `planner.io.load_profile`. The
factors multiply the hardware's peak figures; the fixed overheads add per call.
`fit_linear` turns measured (work, seconds) points into (efficiency, overhead_s):
time = overhead_s + work / (efficiency * peak), solved by least squares.
"""

from __future__ import annotations

import math
import statistics

import msgspec

from asyncflow.planner.hardware import Hardware


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
    work: list[float],
    other_s: list[float],
    time_s: list[float],
    peak: float,
    overhead_columns: list[list[float]] | None = None,
    grid: int = 200,
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


def fit_profile(points: list[Point], hardware: Hardware) -> Efficiency:
    """Fit each kind of point to (efficiency, overhead); kinds not measured keep defaults
    (`afctl profile` measures the points)."""

    def pick(kind):
        chosen = [p for p in points if p.kind == kind]
        return [p.work for p in chosen], [p.time_s for p in chosen]

    fields = {}
    flops, bandwidth = hardware.peak_bf16_flops, hardware.memory_bandwidth_bytes_per_s
    prefill = [p for p in points if p.kind == "prefill"]
    if prefill:
        # a prefill point is a whole generate call of one token: per call + per layer + per sequence + FLOPs
        columns = [[float(p.num_layers) for p in prefill]]
        if len({p.batch for p in prefill}) > 1:
            columns += [[1.0] * len(prefill), [float(p.batch) for p in prefill]]
        fields["prefill_flops"], overheads = fit_max(
            [p.work for p in prefill],
            [0.0] * len(prefill),
            [p.time_s for p in prefill],
            flops,
            overhead_columns=columns,
        )
        fields["prefill_overhead_s_per_layer"] = overheads[0]
        if len(overheads) == 3:
            fields["generate_overhead_s"], fields["generate_overhead_s_per_seq"] = overheads[1:]
    for kind, names in (
        ("trainer", ("trainer_overhead_s", "trainer_overhead_s_per_row")),
        ("snapshot", ("snapshot_overhead_s", "snapshot_s_per_param")),
        ("queue", ("queue_ask_s", "queue_ask_s_per_row")),
    ):
        chosen = [p for p in points if p.kind == kind]
        if chosen:  # time = fixed + work (rows or parameters) x per-unit
            fields.update(zip(names, fit_terms([[1.0] * len(chosen), [p.work for p in chosen]], [p.time_s for p in chosen])))
    handoff = [p for p in points if p.kind == "handoff"]
    if handoff:  # beyond the put's own ask (the producer's put may return before or after the consumer wakes)
        fields["queue_handoff_s"] = max(
            0.0,
            statistics.median(
                [p.time_s - fields.get("queue_ask_s", 0.0) - p.work * fields.get("queue_ask_s_per_row", 0.0) for p in handoff]
            ),
        )
    if {p.work for p in points if p.kind == "corun"} == {1.0, 2.0}:
        fields["corun_slowdown"] = fit_corun(points)
    for kind, eff_name, overhead_name in (
        ("train", "train_flops", "train_overhead_s"),
        ("forward", "forward_flops", "forward_overhead_s"),
    ):
        work, times = pick(kind)
        if work:
            chosen = [p for p in points if p.kind == kind]
            columns = [[1.0] * len(work)]
            if all(p.tokens and p.num_layers for p in chosen):  # per micro-batch + per token per layer
                columns.append([float(p.tokens * p.num_layers) for p in chosen])
            fields[eff_name], overheads = fit_max(work, [0.0] * len(work), times, flops, overhead_columns=columns)
            fields[overhead_name] = overheads[0]
            if len(overheads) == 2:
                fields[f"{kind}_overhead_s_per_token_layer"] = overheads[1]
    decode = [p for p in points if p.kind == "decode"]
    if decode:
        # Decode is bound by bandwidth or by compute (at the prefill efficiency), whichever is slower.
        compute_eff = fields.get("prefill_flops", Efficiency().prefill_flops)
        fields["decode_bandwidth"], overheads = fit_max(
            [p.work for p in decode],
            [p.flops / (compute_eff * flops) for p in decode],
            [p.time_s for p in decode],
            bandwidth,
            overhead_columns=[[1.0] * len(decode), [float(p.num_layers) for p in decode], [float(p.batch) for p in decode]],
        )
        fields["decode_overhead_s"], fields["decode_overhead_s_per_layer"], fields["decode_overhead_s_per_seq"] = overheads
    return Efficiency(**fields)


def fit_errors(points: list[Point], eff: Efficiency, hardware: Hardware) -> dict[str, float]:
    """Mean |predicted / measured - 1| per kind, with the fitted factors."""
    flops, bandwidth = hardware.peak_bf16_flops, hardware.memory_bandwidth_bytes_per_s

    def predict(p) -> float:
        if p.kind == "decode":
            compute = p.flops / (eff.prefill_flops * flops)
            return (
                eff.decode_overhead_s
                + p.num_layers * eff.decode_overhead_s_per_layer
                + p.batch * eff.decode_overhead_s_per_seq
                + max(p.work / (eff.decode_bandwidth * bandwidth), compute)
            )
        linear = {
            "trainer": (eff.trainer_overhead_s, eff.trainer_overhead_s_per_row),
            "snapshot": (eff.snapshot_overhead_s, eff.snapshot_s_per_param),
            "queue": (eff.queue_ask_s, eff.queue_ask_s_per_row),
        }
        if p.kind in linear:
            return linear[p.kind][0] + p.work * linear[p.kind][1]
        if p.kind == "handoff":
            return eff.queue_handoff_s + eff.queue_ask_s + p.work * eff.queue_ask_s_per_row
        if p.kind == "corun":  # against the mean time alone
            alone = [q.time_s for q in points if q.kind == "corun" and q.work == 1]
            return sum(alone) / len(alone) * (eff.corun_slowdown if p.work == 2 else 1.0)
        call = eff.generate_overhead_s + p.batch * eff.generate_overhead_s_per_seq
        factor, overhead = {
            "prefill": (eff.prefill_flops, p.num_layers * eff.prefill_overhead_s_per_layer + call),
            "train": (eff.train_flops, eff.train_overhead_s + p.tokens * p.num_layers * eff.train_overhead_s_per_token_layer),
            "forward": (
                eff.forward_flops,
                eff.forward_overhead_s + p.tokens * p.num_layers * eff.forward_overhead_s_per_token_layer,
            ),
        }[p.kind]
        return overhead + p.work / (factor * flops)

    errors: dict[str, list[float]] = {}
    for p in points:
        errors.setdefault(p.kind, []).append(abs(predict(p) / p.time_s - 1))
    return {k: sum(v) / len(v) for k, v in errors.items()}
