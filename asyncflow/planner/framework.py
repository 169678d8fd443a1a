"""The framework's own costs around the engines: what a unit of asyncflow's workflow
spends outside prefill, decode and train_step, from terms `afctl profile` measures.

- A generate call: a fixed cost per call and per sequence (scheduler set-up, KV
  slots, building the completions), then prefill, then ``longest - 1`` decode
  iterations (prefill samples the first token) over the sequences still running:
  the native engine drops a sequence when it stops, so the batch shrinks and the
  per-sequence cost of decode is paid for ``sum(len - 1)`` sequence-iterations, not
  ``batch x iterations``.
- A trainer step beyond ``train_step``: a fixed part and a part per row (token
  batching into a right-padded [B, T] batch, rewards, group advantages, figures);
  the engine trains the padded batch, B x (prompt + longest response) tokens.
- A weight publish: the host snapshot and its staging, fixed + per parameter.
- Queue asks: every unit asks the queue's actors a few times (get: controller +
  shard read; put: shard; ack: controller); one ask costs ``queue_ask_s`` plus
  ``queue_ask_s_per_row`` per row it carries. The weight path's asks (announce,
  fetch, acquire/release the swap) cost the same round trip.

Pure: no I/O.
"""

from __future__ import annotations

import msgspec

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.hardware import Hardware
from asyncflow.planner.models import ModelShape

# Asks per unit of work (asyncflow/actors/*.py): what travels on the unit's critical path.
ROLLOUT_CALL_ASKS = 4  # get_batch = get_meta (controller) + read (shard); put (shard); ack (controller)
REWARD_UNIT_ASKS = 4  # the same shape: get, read, put of the scores, ack
TRAINER_STEP_ASKS = 3  # get_meta, read, ack (the step's metrics go out from a sender thread)
POLL_ASKS = 1  # a gated replica's get_meta that times out
PUBLISH_ASKS = 2  # the replica's address (directory) + WeightsReady
FETCH_ASKS = 2  # GetLatestWeights + one GetWeightChunk (small models: one chunk)
SWAP_ASKS = 2  # AcquireSwap + ReleaseSwap


def swap_asks(staleness: int, replicas: int) -> int:
    """The swap grant's asks per swap: only where replicas take turns (async, more than one;
    actors/rollout/inbox.py ``swap_grant_needed``)."""
    return SWAP_ASKS if staleness > 0 and replicas > 1 else 0


def queue_s(eff: Efficiency, asks: int, rows: int) -> float:
    """`asks` request-replies, each carrying `rows` rows."""
    return asks * (eff.queue_ask_s + rows * eff.queue_ask_s_per_row)


class CallCost(msgspec.Struct, kw_only=True, frozen=True):
    overhead_s: float  # per call + per sequence
    prefill_s: float
    decode_s: float
    iterations: float  # decode iterations: longest response - 1

    @property
    def time_s(self) -> float:
        return self.overhead_s + self.prefill_s + self.decode_s


def generate_call(
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    batch: int,
    prompt_tokens: float,
    mean_response: float,
    longest_response: float,
) -> CallCost:
    """One static-batch generate call of `batch` sequences on one device, until its longest stops."""
    from asyncflow.planner.cost import decode_iteration_s

    longest = max(1.0, longest_response)
    mean = min(max(1.0, mean_response), longest)
    prefill_s = (
        batch * model.prefill_flops(max(1, round(prompt_tokens))) / (hw.peak_bf16_flops * eff.prefill_flops)
        + model.num_layers * eff.prefill_overhead_s_per_layer
    )
    iterations = longest - 1
    decode_s = 0.0
    if iterations > 0:
        live = batch * (mean - 1) / iterations  # mean sequences per iteration, finished ones dropped
        decode_s = iterations * decode_iteration_s(model, hw, eff, 1, max(live, 1e-9), prompt_tokens + longest / 2)
    overhead_s = eff.generate_overhead_s + batch * eff.generate_overhead_s_per_seq
    return CallCost(overhead_s=overhead_s, prefill_s=prefill_s, decode_s=decode_s, iterations=iterations)


def trainer_extra_s(eff: Efficiency, rows: int) -> float:
    """A trainer step's own work around train_step: fixed + per row."""
    return eff.trainer_overhead_s + rows * eff.trainer_overhead_s_per_row


def snapshot_s(eff: Efficiency, num_params: int) -> float:
    """Export the weights to a host copy and stage them for the replicas."""
    return eff.snapshot_overhead_s + num_params * eff.snapshot_s_per_param


def corun_stretch(eff: Efficiency, other_busy: float) -> float:
    """Expected slowdown of a compute stage while another of our processes computes a
    fraction `other_busy` of the time on the other core (`corun_slowdown` when always)."""
    return 1.0 + (eff.corun_slowdown - 1.0) * min(max(other_busy, 0.0), 1.0)


def shared_core_stretch(others_busy: list[float], cores: int) -> float:
    """Expected slowdown of a stage on one core while other processes are runnable, each
    independently a fraction `others_busy[i]` of the time: with k of them runnable the
    1 + k share `cores` (time slicing), so the stretch is E[max(1, (1 + k) / cores)]."""
    dist = [1.0]  # P(k others runnable), built one process at a time
    for b in others_busy:
        b = min(max(b, 0.0), 1.0)
        dist = [(dist[k] if k < len(dist) else 0.0) * (1 - b) + (dist[k - 1] * b if k else 0.0) for k in range(len(dist) + 1)]
    return sum(p * max(1.0, (1 + k) / max(cores, 1)) for k, p in enumerate(dist))


def aux_cpu_s(eff: Efficiency, calls_per_step: int, reward_score_s: float) -> dict[str, float]:
    """CPU seconds per step of our processes besides rollout and trainer: the reward
    actor (a unit per call: its score and asks) and the queue's processes (the server
    side of every ask of the step, taken as one ask's latency each)."""
    asks = calls_per_step * (ROLLOUT_CALL_ASKS + REWARD_UNIT_ASKS) + TRAINER_STEP_ASKS
    return {"reward": calls_per_step * (reward_score_s + REWARD_UNIT_ASKS * eff.queue_ask_s), "queue": asks * eff.queue_ask_s}
