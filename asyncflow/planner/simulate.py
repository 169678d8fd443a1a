"""Discrete-event simulation of one plan, synchronous and asynchronous, over several steps.

Response lengths are drawn from a log-normal distribution (mean = the workload's mean
response, clipped at its cap): the long tail that makes synchronous steps wait.

- Rollout: each engine instance has `batch` slots (continuous batching); a sample
  holds a slot for prefill + length x the decode-iteration time. In async mode a
  sample of step s starts only once weights of version >= s - k are on the instance;
  a new version costs the instance one host-to-device swap (delayed update).
  In the workload's "unit" rollout mode (``Workload.rollout_mode``) the async run
  generates in calls of ``prompts_per_call`` groups: an instance takes the next call
  when its last one has drained (every sample done), so each call waits for its
  longest sample; in "stream" mode samples take slots as they free up.
- Reference and training are single FIFO servers whose rate (tokens/s) comes from the
  cost model; training of step s ends after its last sample, then the new weights
  travel to rollout (weight transfer). Sync mode runs the phases one after another.

Pure: `simulate_result` gives the figures and both runs, `chrome_trace` the trace
events; `planner.io.simulate_plan` writes them as a Chrome/Perfetto trace
(trace.json) and a PNG timeline with the sync run above the async run on the same
time axis.
"""

from __future__ import annotations

import heapq
import math

import msgspec
import numpy as np

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import (
    Workload,
    decode_iteration_s,
    forward_cost,
    rollout_cost,
    train_cost,
    unit_groups_per_call,
    weight_swap_s,
    workload_transfer_s,
)
from asyncflow.planner.hardware import Hardware
from asyncflow.planner.models import ModelShape

MAX_TRACE_INSTANCES = 4


class Span(msgspec.Struct, kw_only=True, frozen=True):
    lane: str
    name: str
    start_s: float
    end_s: float
    step: int


class ModeRun(msgspec.Struct, kw_only=True):
    mode: str
    step_s: float  # steady state: between the ends of the first and last training steps
    total_s: float
    train_end_s: list[float]
    rollout_busy_fraction: float  # slot-seconds used over slot-seconds available
    train_busy_fraction: float
    spans: list[Span]
    rollout_busy_series: list[tuple[float, float]]  # (time s, fraction of rollout slots busy)


class SimResult(msgspec.Struct, kw_only=True):
    num_steps: int
    staleness: int
    sync_step_s: float
    async_step_s: float
    sync_rollout_busy_fraction: float
    async_rollout_busy_fraction: float
    trace_path: str = ""
    png_path: str = ""


class _Costs(msgspec.Struct, kw_only=True):
    instances: int
    batch: int
    t_iter_s: float
    prefill_per_sample_s: float
    ref_s_per_token: float  # 0 when the reference runs on the training devices
    train_s_per_token: float
    transfer_s: float
    swap_s: float


def _costs(model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, plan) -> _Costs:
    # per sample: the throughput-bound costs (a unit call's tail is what the simulation plays out)
    rollout = rollout_cost(
        model, hw, eff, msgspec.structs.replace(wl, rollout_mode="stream"), plan.rollout_devices, plan.rollout_tp
    )
    instances = plan.rollout_devices // plan.rollout_tp
    context = wl.prompt_len_tokens + wl.response_len_tokens / 2
    t_iter = decode_iteration_s(model, hw, eff, plan.rollout_tp, rollout.batch_per_instance, context)
    seqs = math.ceil(wl.num_samples / instances)
    prefill = (rollout.time_s - seqs * wl.response_len_tokens / rollout.batch_per_instance * t_iter) / seqs
    tokens = wl.num_samples * wl.mean_seq_tokens
    colocated_ref = wl.use_reference and plan.reference_devices == 0
    train = train_cost(model, hw, eff, wl, plan.train_devices, plan.train_tp, plan.train_pp, colocated_ref)
    ref_rate = 0.0
    if wl.use_reference and plan.reference_devices:
        ref = forward_cost(model, hw, eff, wl, plan.reference_devices, plan.reference_tp)
        ref_rate = ref.time_s / tokens
    return _Costs(
        instances=instances,
        batch=rollout.batch_per_instance,
        t_iter_s=t_iter,
        prefill_per_sample_s=max(prefill, 0.0),
        ref_s_per_token=ref_rate,
        train_s_per_token=train.time_s / tokens,
        transfer_s=workload_transfer_s(model, hw, eff, wl, plan.rollout_devices, plan.rollout_tp),
        swap_s=weight_swap_s(model, hw, plan.rollout_tp, wl.lora),
    )


def response_lengths(wl: Workload, num_steps: int, seed: int = 0) -> np.ndarray:
    """[steps, samples] long-tailed lengths with the workload's mean before clipping
    (log-normal of ``Workload.response_len_sigma``)."""
    rng = np.random.default_rng(seed)
    sigma = wl.response_len_sigma
    mu = math.log(wl.response_len_tokens) - sigma**2 / 2
    lengths = rng.lognormal(mu, sigma, size=(num_steps, wl.num_samples))
    return np.clip(np.rint(lengths), 1, wl.max_response_len_tokens)


def _merge(spans: list[Span]) -> list[Span]:
    """Join back-to-back spans of the same lane and step (a FIFO server's busy periods)."""
    out: list[Span] = []
    for s in spans:
        if out and out[-1].lane == s.lane and out[-1].step == s.step and s.start_s - out[-1].end_s < 1e-9:
            out[-1] = Span(lane=s.lane, name=s.name, start_s=out[-1].start_s, end_s=s.end_s, step=s.step)
        else:
            out.append(s)
    return out


def _run(c: _Costs, wl: Workload, lengths: np.ndarray, staleness: int | None) -> ModeRun:
    """staleness None: synchronous phases; an int k: the streaming pipeline with staleness k."""
    num_steps, num_samples = lengths.shape
    group = wl.samples_per_prompt
    slots = [[0.0] * c.batch for _ in range(c.instances)]  # heaps of slot free times
    version_on = [0] * c.instances
    call_free = [0.0] * c.instances  # unit mode: when each instance's last call has drained
    available = [0.0]  # available[v]: time weights v reach the rollout devices
    ref_free = train_free = 0.0
    spans: list[Span] = []
    train_end: list[float] = []
    busy_slot_s = 0.0
    train_busy = 0.0
    intervals: list[tuple[float, float]] = []
    for step in range(num_steps):
        # Generation of this step may start once version step - k (sync: step) is available.
        need = step if staleness is None else max(0, step - staleness)
        gate = available[need]
        if staleness is None:
            slots = [[gate] * c.batch for _ in range(c.instances)]
        done: list[tuple[float, int]] = []  # (finish time, tokens)
        first_start = [math.inf] * c.instances
        last_end = [0.0] * c.instances
        if staleness is not None and wl.rollout_mode == "unit":
            placed = _unit_calls(c, wl, lengths[step], gate, available, version_on, call_free)
        else:
            placed = []
            for i in range(num_samples):
                inst = (i // group) % c.instances  # a GRPO group stays on one instance
                heap = slots[inst]
                start = max(heap[0], gate)
                if staleness is not None:
                    newest = max(v for v in range(len(available)) if available[v] <= start)
                    if newest > version_on[inst]:  # delayed update: one swap per new version
                        version_on[inst] = newest
                        heap[:] = [max(t, start) + c.swap_s for t in heap]
                        heapq.heapify(heap)
                        start = max(heap[0], gate)
                dur = c.prefill_per_sample_s + lengths[step, i] * c.t_iter_s
                heapq.heapreplace(heap, start + dur)
                placed.append((inst, start, dur))
        for i, (inst, start, dur) in enumerate(placed):
            busy_slot_s += dur
            intervals.append((start, start + dur))
            first_start[inst] = min(first_start[inst], start)
            last_end[inst] = max(last_end[inst], start + dur)
            done.append((start + dur, wl.prompt_len_tokens + int(lengths[step, i])))
        for inst in range(min(c.instances, MAX_TRACE_INSTANCES)):
            if first_start[inst] == math.inf:  # unit mode: no call of this step on this instance
                continue
            spans.append(
                Span(
                    lane=f"rollout {inst}",
                    name=f"generate step {step}",
                    start_s=first_start[inst],
                    end_s=last_end[inst],
                    step=step,
                )
            )
        rollout_end = max(t for t, _ in done)
        done.sort()
        if staleness is None:  # each phase waits for the whole previous one
            done = [(rollout_end, tok) for _, tok in done]
        # Reference: FIFO server on its own devices.
        ready = done
        if c.ref_s_per_token:
            ready = []
            for t, tok in done:
                start = max(t, ref_free)
                ref_free = start + tok * c.ref_s_per_token
                spans.append(Span(lane="reference", name=f"reference step {step}", start_s=start, end_s=ref_free, step=step))
                ready.append((ref_free, tok))
            if staleness is None:
                ready = [(ref_free, tok) for _, tok in ready]
        # Training: micro-batches of this step in arrival order, after the previous step.
        for t, tok in sorted(ready):
            start = max(t, train_free)
            train_free = start + tok * c.train_s_per_token
            train_busy += tok * c.train_s_per_token
            spans.append(Span(lane="train", name=f"train step {step}", start_s=start, end_s=train_free, step=step))
        train_end.append(train_free)
        arrive = train_free + c.transfer_s
        spans.append(Span(lane="weight sync", name=f"weights v{step + 1}", start_s=train_free, end_s=arrive, step=step))
        available.append(arrive)
    total = available[-1]
    step_s = (train_end[-1] - train_end[0]) / (num_steps - 1) if num_steps > 1 else train_end[0]
    return ModeRun(
        mode="sync" if staleness is None else "async",
        step_s=step_s,
        total_s=total,
        train_end_s=train_end,
        rollout_busy_fraction=busy_slot_s / (total * c.instances * c.batch),
        train_busy_fraction=train_busy / total,
        spans=_merge(spans),
        rollout_busy_series=_occupancy(intervals, c.instances * c.batch, total),
    )


def _unit_calls(
    c: _Costs,
    wl: Workload,
    lengths: np.ndarray,
    gate: float,
    available: list[float],
    version_on: list[int],
    call_free: list[float],
) -> list[tuple[int, float, float]]:
    """One step's samples in generate calls of ``prompts_per_call`` groups (a replica's share
    without it): each call goes to the instance that is free first, starts once the gate
    opens (after a swap when a newer version is there) and holds the instance until its
    longest sample ends; inside it, samples take the call's ``batch`` slots as they free up.
    (instance, start, duration) per sample; ``version_on`` and ``call_free`` are updated."""
    groups = unit_groups_per_call(wl, c.instances)
    call_seqs = groups * wl.samples_per_prompt
    placed: list[tuple[int, float, float]] = []
    for first in range(0, len(lengths), call_seqs):
        inst = min(range(c.instances), key=lambda j: call_free[j])
        start = max(call_free[inst], gate)
        newest = max(v for v in range(len(available)) if available[v] <= start)
        if newest > version_on[inst]:  # the swap between two calls
            version_on[inst] = newest
            start += c.swap_s
        slots = [start] * c.batch
        end = start
        for length in lengths[first : first + call_seqs]:
            begin = heapq.heappop(slots)
            dur = c.prefill_per_sample_s + length * c.t_iter_s
            heapq.heappush(slots, begin + dur)
            placed.append((inst, begin, dur))
            end = max(end, begin + dur)
        call_free[inst] = end
    return placed


def _occupancy(intervals: list[tuple[float, float]], num_slots: int, horizon_s: float, points: int = 400):
    """Fraction of all rollout slots busy, sampled at `points` times."""
    arr = np.asarray(intervals)
    grid = np.linspace(0.0, horizon_s, points)
    started = np.searchsorted(np.sort(arr[:, 0]), grid, side="right")
    ended = np.searchsorted(np.sort(arr[:, 1]), grid, side="right")
    return [(float(t), float(b) / num_slots) for t, b in zip(grid, started - ended)]


def simulate(
    model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, plan, num_steps: int = 6, seed: int = 0
) -> tuple[ModeRun, ModeRun]:
    """Run the plan synchronously and with its staleness (at least 1) on the same lengths."""
    if num_steps < 2:
        raise ValueError("simulate at least 2 steps (the step time is measured between step ends)")
    costs = _costs(model, hw, eff, wl, plan)
    lengths = response_lengths(wl, num_steps, seed)
    return _run(costs, wl, lengths, None), _run(costs, wl, lengths, max(1, wl.staleness))


def chrome_trace(runs: list[ModeRun]) -> dict:
    """Chrome trace-event JSON: one process per mode, one thread per lane, complete ('X') events in µs."""
    events = []
    for pid, run in enumerate(runs, 1):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": run.mode}})
        # Generation of consecutive steps overlaps in async mode: one thread per step parity.
        lanes = list(dict.fromkeys(_trace_lane(s) for s in run.spans))
        for tid, lane in enumerate(lanes, 1):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": lane}})
        tids = {lane: tid for tid, lane in enumerate(lanes, 1)}
        for s in run.spans:
            events.append(
                {
                    "name": s.name,
                    "cat": s.lane.split()[0],
                    "ph": "X",
                    "pid": pid,
                    "tid": tids[_trace_lane(s)],
                    "ts": s.start_s * 1e6,
                    "dur": max(s.end_s - s.start_s, 0.0) * 1e6,
                    "args": {"step": s.step},
                }
            )
        for t, frac in run.rollout_busy_series:
            events.append(
                {
                    "name": "rollout slots busy",
                    "ph": "C",
                    "pid": pid,
                    "tid": 0,
                    "ts": t * 1e6,
                    "args": {"percent": round(100 * frac, 2)},
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _trace_lane(span: Span) -> str:
    if span.lane.startswith("rollout"):
        return f"{span.lane} ({'even' if span.step % 2 == 0 else 'odd'} steps)"
    return span.lane


def simulate_result(
    model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, plan, num_steps: int = 6, seed: int = 0
) -> tuple[SimResult, list[ModeRun]]:
    """The summary of one plan's simulation, and its two runs (sync, then async) for the trace."""
    sync, streaming = simulate(model, hw, eff, wl, plan, num_steps, seed)
    result = SimResult(
        num_steps=num_steps,
        staleness=max(1, wl.staleness),
        sync_step_s=sync.step_s,
        async_step_s=streaming.step_s,
        sync_rollout_busy_fraction=sync.rollout_busy_fraction,
        async_rollout_busy_fraction=streaming.rollout_busy_fraction,
    )
    return result, [sync, streaming]


def timeline_title(model: ModelShape, hw: Hardware, plan) -> str:
    return (
        f"{model.name} on {plan.rollout_devices}+{plan.train_devices}+{plan.reference_devices} x {hw.name}: "
        f"rollout / train / reference"
    )
