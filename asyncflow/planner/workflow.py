"""The time per step of asyncflow's own local workflow, played out event by event from
stage times the cost model gives.

`cost.async_step` and `cost.sync_step` assume continuous batching and one device per
role. On one machine three mechanics of the workflow decide the step instead, and
this module models them:

- rollout works in units: one generate call of ``prompts_per_call x group_size``
  sequences (a static batch that runs until its longest sample stops, so
  ``max_new_tokens`` iterations), then a put; replicas take calls in order;
- the staleness gate: a call of step s may start only on a replica holding weights
  v >= s - k. A gated replica that already knows of newer weights waits for their
  fetch; one that does not blocks in a queue poll for ``poll_s`` (the rollout's
  0.2 s ``get_batch`` timeout) and looks at weights that arrived meanwhile only when
  the poll ends. In a sync step (k = 0) this poll is most of the step;
- the trainer takes step s once all its calls are put and rewarded, trains, and
  publishes version s + 1; replicas fetch it in the background and swap it in
  before their next call.

Processes share cores: `contention` stretches the stages that run at the same time
when more workers compute at once than there are cores (see docs/planner.md).
Pure: no I/O.
"""

from __future__ import annotations

import math

import msgspec


class StageTimes(msgspec.Struct, kw_only=True, frozen=True):
    call_s: float  # one generate call on one replica (prefill + decode; + its put)
    calls_per_step: int  # generate calls per trainer step (all replicas together)
    train_s: float  # one trainer step (train + the reference forward on the trainer, if any)
    publish_s: float = 0.0  # trainer: snapshot and stage the new weights
    fetch_s: float = 0.0  # replica: pull the new weights (in the background)
    swap_s: float = 0.0  # replica: load them, between calls
    reward_s: float = 0.0  # from a step's last put to its rows being ready for the trainer
    poll_s: float = 0.2  # a gated replica's blocking queue poll
    wake_on_announce: bool = False  # the gated wait ends at the announcement of new weights, not at the poll's end


class WorkflowResult(msgspec.Struct, kw_only=True):
    step_s: float  # mean step over the run, as `afctl bench e2e` measures it (first train start to last end)
    train_end_s: list[float]  # end of every trainer step
    num_polls: int  # polls a gated replica sat through
    rollout_busy: float  # fraction of the span the replicas spent generating
    train_busy: float


def contention(workers_at_once: float, cores: int) -> float:
    """How much slower each compute stage runs when `workers_at_once` share `cores`."""
    return max(1.0, workers_at_once / max(cores, 1))


def simulate(st: StageTimes, num_replicas: int, staleness: int, num_steps: int) -> WorkflowResult:
    """Play the workflow out for `num_steps` trainer steps (starting from version 0)."""
    if num_replicas < 1 or num_steps < 1 or st.calls_per_step < 1:
        raise ValueError("need at least one replica, one step and one call per step")
    C, k = st.calls_per_step, staleness
    total = num_steps * C
    rep_t = [0.0] * num_replicas
    rep_v = [0] * num_replicas
    published = {0: 0.0}  # version -> time; only known once its training step is scheduled
    call_end: list[float | None] = [None] * total
    train_start: list[float] = []
    train_end: list[float] = []
    next_call = 0
    polls = 0
    busy_r = 0.0

    def advance_trainer() -> None:
        while len(train_end) < num_steps:
            s = len(train_end)
            ends = call_end[s * C : (s + 1) * C]
            done = [e for e in ends if e is not None]
            if len(done) < len(ends):
                return
            start = max(train_end[-1] if train_end else 0.0, max(done) + st.reward_s)
            train_start.append(start)
            train_end.append(start + st.train_s + st.publish_s)
            published[s + 1] = train_end[-1]

    active = set(range(num_replicas))
    while active and next_call < total:
        i = min(active, key=lambda r: (rep_t[r], r))
        t = rep_t[i]
        newest = max((v for v, at in published.items() if at + st.fetch_s <= t), default=0)
        if newest > rep_v[i]:
            t += st.swap_s
            rep_v[i] = newest
        step = next_call // C
        if step <= rep_v[i] + k:
            call_end[next_call] = t + st.call_s
            next_call += 1
            busy_r += st.call_s
            rep_t[i] = t + st.call_s
            advance_trainer()
            continue
        announced = [at for v, at in published.items() if v > rep_v[i] and at <= t]
        if announced:  # WeightsReady came: wait for the fetch, then swap
            rep_t[i] = max(t, min(announced) + st.fetch_s)
        else:  # nothing announced yet: a blocking poll (or a wait the announcement ends)
            upcoming = [at for v, at in published.items() if v > rep_v[i] and at > t]
            if st.wake_on_announce and upcoming and min(upcoming) < t + st.poll_s:
                rep_t[i] = min(upcoming)
                continue
            rep_t[i] = t + st.poll_s
            polls += 1
    advance_trainer()
    span = train_end[-1] - train_start[0]
    return WorkflowResult(
        step_s=span / num_steps if num_steps > 1 else train_end[-1] - train_start[0],
        train_end_s=train_end,
        num_polls=polls,
        rollout_busy=min(1.0, busy_r / num_replicas / max(train_end[-1], 1e-12)),
        train_busy=min(1.0, num_steps * (st.train_s + st.publish_s) / max(train_end[-1], 1e-12)),
    )


def calls_per_step(prompts_per_step: int, prompts_per_call: int) -> int:
    return math.ceil(prompts_per_step / prompts_per_call)
