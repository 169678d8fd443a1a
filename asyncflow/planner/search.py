"""Search over allocations: which devices go to rollout, training and reference, at which degrees.

Invariants:
- every returned plan fits in memory on every device of every role;
- every (role, device count) for which no parallel degree fits is reported as an
  `Infeasible` with the memory that is short (which use, by how much), never dropped;
- a plan's training data-parallel degree divides the step's prompts: every rank
  trains whole prompt groups, as many as the others (the trainer refuses anything
  else, config/train.py); rollout replicas pull groups from the queue and need no such rule;
- device counts are multiples of a granularity g (1 up to 128 devices, then whole
  fractions of a node) so that 1024 devices are planned in well under a second.

Each role's best degrees are chosen per device count once (they do not depend on
the other roles), then every split (rollout, reference, train) is scored as a step.
A reward model (``search(reward_model=...)``) takes its own ``reward_model_devices``
first, at its best tensor-parallel degree; the rest are split as above, and its
stage counts in every step (``cost.async_step`` / ``cost.sync_step``). The
colocated plan runs it on every device in turn, like the other roles.

The async plans' rollout runs in the workload's rollout mode (``Workload.rollout_mode``:
generate calls that each drain to their longest response, or one continuous stream;
``cost.rollout_cost``), and each plan says which (``Plan.rollout_mode``). The sync and
colocated alternatives keep the step-wide model (every sample of the step batched on its
instance, the step waiting for its longest), whatever the async mode.
"""

from __future__ import annotations

import math

import msgspec

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import (
    RoleCost,
    StepCost,
    Workload,
    async_step,
    forward_cost,
    offload_s,
    reward_model_cost,
    rollout_cost,
    sync_step,
    tp_allowed,
    train_cost,
    weight_swap_s,
    weight_transfer_s,
    workload_transfer_s,
)
from asyncflow.planner.hardware import Hardware
from asyncflow.planner.models import ModelShape

MAX_COUNTS = 128  # device counts tried per role


class Plan(msgspec.Struct, kw_only=True):
    mode: str  # "async" (staleness k, k = 0 streams within a step), "sync" or "colocated"
    staleness: int
    rollout_devices: int
    rollout_tp: int
    rollout_instances: int
    rollout_batch_per_instance: int
    train_devices: int
    train_tp: int
    train_pp: int
    train_dp: int
    reference_devices: int  # 0: the reference runs on the training devices
    reference_tp: int
    predicted_step_s: float
    predicted_samples_per_s: float
    predicted_tokens_per_s: float  # prompt + response tokens through the step
    bottleneck: str
    stage_s: dict[str, float]
    peak_memory_bytes: float  # the fullest device of any role
    memory_bytes: dict[str, float]  # peak per device, by role
    reward_model_devices: int = 0  # the reward-model role's own devices (0: none)
    reward_model_tp: int = 0
    rollout_mode: str = "stream"  # async: the workload's rollout mode; sync and colocated: "step" (one batch, one tail)


class Infeasible(msgspec.Struct, kw_only=True):
    role: str
    devices: int
    tp: int
    pp: int
    needed_bytes: float
    available_bytes: float
    short_bytes: float
    reason: str


class SearchResult(msgspec.Struct, kw_only=True):
    plans: list[Plan]  # best first
    sync: Plan | None  # best task-separated synchronous plan (phases in sequence)
    colocated: Plan | None  # every role on every device in turn (verl-like)
    infeasible: list[Infeasible]
    num_splits: int  # splits scored
    num_infeasible_splits: int
    granularity: int


def granularity(num_devices: int, hw: Hardware) -> int:
    g = 1
    while num_devices // g > MAX_COUNTS and num_devices % (2 * g) == 0 and 2 * g <= hw.devices_per_node:
        g *= 2
    return g


def _tp_options(model: ModelShape, hw: Hardware) -> list[int]:
    return [tp for tp in range(1, hw.devices_per_node + 1) if tp_allowed(model, hw, tp)]


def _pp_options(model: ModelShape) -> list[int]:
    return [pp for pp in (1, 2, 4, 8, 16) if pp <= model.num_layers]


def _infeasible(cost: RoleCost) -> Infeasible:
    need, have = cost.peak_memory_bytes, cost.memory_available_bytes
    return Infeasible(
        role=cost.role,
        devices=cost.devices,
        tp=cost.tp,
        pp=cost.pp,
        needed_bytes=need,
        available_bytes=have,
        short_bytes=need - have,
        reason=cost.reason,
    )


def _best(candidates: list[RoleCost], score, infeasible: list[Infeasible]) -> RoleCost | None:
    fitting = [c for c in candidates if c.feasible]
    if fitting:
        return min(fitting, key=score)
    if candidates:
        infeasible.append(_infeasible(min(candidates, key=lambda c: c.peak_memory_bytes - c.memory_available_bytes)))
    return None


def _plan(
    mode: str,
    step: StepCost,
    rollout: RoleCost,
    train: RoleCost,
    reference: RoleCost | None,
    wl: Workload,
    reward_model: RoleCost | None = None,
) -> Plan:
    memory = {"rollout": rollout.peak_memory_bytes, "train": train.peak_memory_bytes}
    if reference is not None:
        memory["reference"] = reference.peak_memory_bytes
    if reward_model is not None:
        memory["reward_model"] = reward_model.peak_memory_bytes
    samples_per_s = wl.num_samples / step.step_s
    return Plan(
        mode=mode,
        staleness=step.staleness,
        rollout_devices=rollout.devices,
        rollout_tp=rollout.tp,
        rollout_instances=rollout.devices // rollout.tp,
        rollout_batch_per_instance=rollout.batch_per_instance,
        train_devices=train.devices,
        train_tp=train.tp,
        train_pp=train.pp,
        train_dp=train.dp,
        reference_devices=reference.devices if reference is not None else 0,
        reference_tp=reference.tp if reference is not None else train.tp,
        predicted_step_s=step.step_s,
        predicted_samples_per_s=samples_per_s,
        predicted_tokens_per_s=samples_per_s * wl.mean_seq_tokens,
        bottleneck=step.bottleneck,
        stage_s=step.stage_s,
        peak_memory_bytes=max(memory.values()),
        memory_bytes=memory,
        reward_model_devices=reward_model.devices if reward_model is not None and mode != "colocated" else 0,
        reward_model_tp=reward_model.tp if reward_model is not None else 0,
        rollout_mode=wl.rollout_mode if mode == "async" else "step",
    )


def async_rollout_score(model: ModelShape, hw: Hardware, wl: Workload, rollout: RoleCost) -> float:
    """What a rollout bounds an asynchronous step at (what the search picks its tensor-parallel
    degree by): its generation and weight swap, or generation plus the long tail spread over the
    staleness + 1 steps a sample may take. A larger degree holds a larger batch's KV cache per
    device and shortens each decode iteration (the tail is latency-bound), so with many devices
    per sample it can win although a smaller one fits."""
    swap_s = weight_swap_s(model, hw, rollout.tp, wl.lora)
    return max(rollout.time_s + swap_s, (rollout.time_s + rollout.tail_s) / (wl.staleness + 1))


def smallest_fitting_rollout(model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, devices: int) -> RoleCost | None:
    """The rollout on ``devices`` at the smallest tensor-parallel degree that fits in memory."""
    for tp in _tp_options(model, hw):
        if devices % tp == 0 and (cost := rollout_cost(model, hw, eff, wl, devices, tp)).feasible:
            return cost
    return None


class _Roles:
    """Best degrees per role and device count, computed once each."""

    def __init__(self, model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload):
        self.model, self.hw, self.eff, self.wl = model, hw, eff, wl
        # sync and colocated: the step-wide model, whatever the async rollout's mode
        self.step_wl = msgspec.structs.replace(wl, rollout_mode="stream", prompts_per_call=0)
        self.tps = _tp_options(model, hw)
        self.pps = _pp_options(model)
        self.infeasible: list[Infeasible] = []
        self._rollout: dict[tuple[int, str], RoleCost | None] = {}
        self._train: dict[tuple[int, bool], RoleCost | None] = {}
        self._reference: dict[int, RoleCost | None] = {}

    def rollout(self, devices: int, mode: str) -> RoleCost | None:
        key = (devices, mode)
        if key not in self._rollout:
            wl = self.wl if mode == "async" else self.step_wl
            cands = [rollout_cost(self.model, self.hw, self.eff, wl, devices, tp) for tp in self.tps if devices % tp == 0]

            def score(c: RoleCost) -> float:
                if mode == "async":
                    return async_rollout_score(self.model, self.hw, self.wl, c)
                return (
                    c.time_s
                    + c.tail_s
                    + (
                        weight_transfer_s(self.model, self.hw, self.eff, c.tp, colocated=True, lora=self.wl.lora)
                        if mode == "colocated"
                        else workload_transfer_s(self.model, self.hw, self.eff, self.wl, devices, c.tp)
                    )
                )

            sink = self.infeasible if mode == "async" else []
            self._rollout[key] = _best(cands, score, sink)
        return self._rollout[key]

    def train(self, devices: int, with_reference: bool) -> RoleCost | None:
        key = (devices, with_reference)
        if key not in self._train:
            cands = [
                train_cost(self.model, self.hw, self.eff, self.wl, devices, tp, pp, with_reference)
                for tp in self.tps
                for pp in self.pps
                # every FSDP rank trains whole prompt groups, as many as the others: the trainer (config/train.py)
                # refuses a prompts_per_step that is not a multiple of its ranks
                if devices % (tp * pp) == 0 and self.wl.prompts_per_step % (devices // (tp * pp)) == 0
            ]
            self._train[key] = _best(cands, lambda c: c.time_s, self.infeasible)
        return self._train[key]

    def reward_model(self, rm: ModelShape, devices: int) -> RoleCost | None:
        cands = [
            reward_model_cost(rm, self.hw, self.eff, self.wl, devices, tp) for tp in _tp_options(rm, self.hw) if devices % tp == 0
        ]
        return _best(cands, lambda c: c.time_s, self.infeasible)

    def reference(self, devices: int) -> RoleCost | None:
        if devices not in self._reference:
            cands = [forward_cost(self.model, self.hw, self.eff, self.wl, devices, tp) for tp in self.tps if devices % tp == 0]
            self._reference[devices] = _best(cands, lambda c: c.time_s, self.infeasible)
        return self._reference[devices]


def search(
    model: ModelShape,
    hw: Hardware,
    wl: Workload,
    num_devices: int,
    eff: Efficiency | None = None,
    top_k: int = 5,
    reward_model: ModelShape | None = None,
    reward_model_devices: int = 1,
) -> SearchResult:
    """Score every split of `num_devices`; return the best `top_k` async plans and the sync alternatives.
    With `reward_model`, its role takes `reward_model_devices` of them (the split is of the rest)."""
    wl.validate()
    total_devices = num_devices
    if reward_model is not None:
        num_devices -= reward_model_devices
    if num_devices < 2:
        rm = f" beside the reward model's {reward_model_devices}" if reward_model is not None else ""
        raise ValueError(
            f"{num_devices} device(s){rm}: a task-separated plan needs at least 2 (one for rollout, one for training)"
        )
    eff = eff or Efficiency()
    roles = _Roles(model, hw, eff, wl)
    rm_cost = roles.reward_model(reward_model, reward_model_devices) if reward_model is not None else None
    if reward_model is not None and rm_cost is None:  # it fits on no degree: every plan is infeasible
        return SearchResult(
            plans=[],
            sync=None,
            colocated=None,
            infeasible=roles.infeasible,
            num_splits=0,
            num_infeasible_splits=0,
            granularity=granularity(num_devices, hw),
        )
    g = granularity(num_devices, hw)
    counts = list(range(g, num_devices, g))
    use_ref = wl.use_reference
    ref_counts = [0] + ([c for c in counts if c <= num_devices // 2] if use_ref else [])
    scored: list[tuple[float, int, int]] = []
    sync_best: tuple[float, int, int] | None = None
    num_splits = num_infeasible = 0
    for ref_devices in ref_counts:
        reference = roles.reference(ref_devices) if ref_devices else None
        if ref_devices and reference is None:
            skipped = sum(1 for r in counts if num_devices - r - ref_devices >= g)
            num_splits += skipped
            num_infeasible += skipped
            continue
        for rollout_devices in counts:
            train_devices = num_devices - rollout_devices - ref_devices
            if train_devices < g:
                break
            num_splits += 1
            rollout = roles.rollout(rollout_devices, "async")
            train = roles.train(train_devices, with_reference=use_ref and not ref_devices)
            if rollout is None or train is None:
                num_infeasible += 1
                continue
            step = async_step(
                rollout,
                train,
                reference,
                workload_transfer_s(model, hw, eff, wl, rollout.devices, rollout.tp),
                weight_swap_s(model, hw, rollout.tp, wl.lora),
                wl.staleness,
                rm_cost,
            )
            scored.append((step.step_s, rollout_devices, ref_devices))
            rollout_sync = roles.rollout(rollout_devices, "sync")
            assert rollout_sync is not None  # the async rollout fits on these devices, so the sync one does
            sync = sync_step(
                rollout_sync,
                train,
                reference,
                workload_transfer_s(model, hw, eff, wl, rollout_sync.devices, rollout_sync.tp),
                reward_model=rm_cost,
            )
            if sync_best is None or sync.step_s < sync_best[0]:
                sync_best = (sync.step_s, rollout_devices, ref_devices)
    scored.sort()
    plans = []
    for _, rollout_devices, ref_devices in _distinct(scored, top_k, max(hw.devices_per_node, num_devices // 32)):
        rollout = roles.rollout(rollout_devices, "async")
        reference = roles.reference(ref_devices) if ref_devices else None
        train = roles.train(num_devices - rollout_devices - ref_devices, with_reference=use_ref and not ref_devices)
        assert rollout is not None and train is not None  # this split was scored above, so it is feasible
        step = async_step(
            rollout,
            train,
            reference,
            workload_transfer_s(model, hw, eff, wl, rollout.devices, rollout.tp),
            weight_swap_s(model, hw, rollout.tp, wl.lora),
            wl.staleness,
            rm_cost,
        )
        plans.append(_plan("async", step, rollout, train, reference, wl, rm_cost))
    sync_plan = None
    if sync_best is not None:
        _, rollout_devices, ref_devices = sync_best
        rollout = roles.rollout(rollout_devices, "sync")
        reference = roles.reference(ref_devices) if ref_devices else None
        train = roles.train(num_devices - rollout_devices - ref_devices, with_reference=use_ref and not ref_devices)
        assert rollout is not None and train is not None  # the best sync split was scored, so it is feasible
        step = sync_step(
            rollout, train, reference, workload_transfer_s(model, hw, eff, wl, rollout.devices, rollout.tp), reward_model=rm_cost
        )
        sync_plan = _plan("sync", step, rollout, train, reference, wl, rm_cost)
    return SearchResult(
        plans=plans,
        sync=sync_plan,
        colocated=colocated_plan(roles, total_devices, reward_model),
        infeasible=roles.infeasible,
        num_splits=num_splits,
        num_infeasible_splits=num_infeasible,
        granularity=g,
    )


def _distinct(scored: list[tuple[float, int, int]], top_k: int, spacing: int) -> list[tuple[float, int, int]]:
    """The best splits, each at least `spacing` devices (a node, or 1/32 of the cluster) away from those kept in some role,
    or with the reference placed differently, so the table shows alternatives, not neighbours."""
    kept: list[tuple[float, int, int]] = []
    for cand in scored:
        _, r, d = cand
        if any(abs(r - kr) < spacing and abs(d - kd) < spacing and (d == 0) == (kd == 0) for _, kr, kd in kept):
            continue
        kept.append(cand)
        if len(kept) == top_k:
            break
    return kept


def colocated_plan(roles: _Roles, num_devices: int, reward_model: ModelShape | None = None) -> Plan | None:
    """Every role on all devices in turn (the verl-style synchronous baseline); training states offloaded while generating."""
    model, hw, eff, wl = roles.model, roles.hw, roles.eff, roles.wl
    rollout = roles.rollout(num_devices, "colocated")
    train = roles.train(num_devices, with_reference=wl.use_reference)
    rm = roles.reward_model(reward_model, num_devices) if reward_model is not None else None
    if rollout is None or train is None or (reward_model is not None and rm is None):
        return None
    extra = offload_s(model, hw, num_devices, wl.use_critic, wl.lora)
    step = sync_step(
        rollout,
        train,
        None,
        weight_transfer_s(model, hw, eff, rollout.tp, colocated=True, lora=wl.lora),
        mode="colocated",
        extra_s=extra,
        reward_model=rm,
    )
    return _plan("colocated", step, rollout, train, None, wl, rm)


def best_sync(result: SearchResult) -> Plan | None:
    options = [p for p in (result.sync, result.colocated) if p is not None]
    return min(options, key=lambda p: p.predicted_step_s) if options else None


def speedup(result: SearchResult) -> float:
    """Predicted async-over-sync throughput: the best sync alternative's step over the best plan's."""
    sync = best_sync(result)
    if not result.plans or sync is None:
        return math.nan
    return sync.predicted_step_s / result.plans[0].predicted_step_s
