"""The online decision when roles are processes sharing a few CPU cores (this machine).

`online.decide` moves whole devices: a role's time scales as work / devices. On a
CPU box the devices are cores that every process shares, and two things differ:

- torch threads do not add speed here: under load, a second intra-op thread made a
  training step 1.5 to 5 times slower (threads wait on each other when a core is
  taken), so the trainer keeps its threads and is never given more;
- a core the trainer leaves idle (it waits on rollout) is free for another rollout
  replica: a new replica runs on the time the trainer does not use.

So a step's bound with R replicas and a trainer of T threads on C cores is
max(W_r / R, W_t / T, (W_r + W_t) / C), where W_r, W_t are each side's measured CPU
seconds per step (busy fraction x processes x step time): a side is limited by its
own parallelism or, together, by the cores. The step after a move is the measured
step scaled by bound(after) / bound(now), as in `online.predict_step_s`.

The lean, the patience and the minimum gain are `online`'s; only rollout replicas
move (1 at a time, within 1 .. max_replicas). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncflow.planner.online import MoveDecision, OnlinePolicy, Split, StepObservation, steady_lean


def bound_s(work_r: float, work_t: float, replicas: int, train_threads: int, cores: int) -> float:
    return max(work_r / replicas, work_t / train_threads, (work_r + work_t) / cores)


def decide(
    history: Sequence[StepObservation],
    split: Split,
    cores: int,
    max_replicas: int,
    policy: OnlinePolicy | None = None,
) -> MoveDecision | None:
    """Add or remove one rollout replica at the next step boundary, or None.
    `split`: rollout_workers = replicas, train_workers = the trainer's threads (kept)."""
    policy = policy or OnlinePolicy()
    to_role = steady_lean(history, policy)
    if to_role is None:
        return None
    k = policy.patience_steps
    window = list(history[-k:])
    R, T = split.rollout_workers, split.train_workers
    R_after = R + 1 if to_role == "rollout" else R - 1
    if not 1 <= R_after <= max_replicas:
        return None
    step_s = sum(o.step_s for o in window) / k
    work_r = sum(o.rollout.busy_fraction * o.step_s for o in window) / k * R
    work_t = sum(o.train.busy_fraction * o.step_s for o in window) / k * T
    now = bound_s(work_r, work_t, R, T, cores)
    after_s = step_s * bound_s(work_r, work_t, R_after, T, cores) / now if now > 0 else step_s
    gain = step_s / after_s - 1 if after_s > 0 else 0.0
    if gain < policy.min_gain:
        return None
    gap = sum(o.rollout.busy_fraction - o.train.busy_fraction for o in window) / k
    what = (
        f"trainer idle, rollout busy for {k} steps (busy rollout - train = {gap:+.2f}): another replica "
        f"runs on the core time the trainer leaves ({cores} cores shared)"
        if to_role == "rollout"
        else f"rollout waited on training for {k} steps (busy rollout - train = {gap:+.2f}): one replica fewer "
        f"leaves its core to the trainer ({cores} cores shared)"
    )
    return MoveDecision(
        from_role="train" if to_role == "rollout" else "rollout",
        to_role=to_role,
        num_workers=1,
        split_after=Split(rollout_workers=R_after, train_workers=T),
        predicted_step_s_before=step_s,
        predicted_step_s_after=after_s,
        predicted_gain=gain,
        reason=what,
    )
