"""The analytical cost model: time and memory per device of each RL role, and of a step.

Legend: P = parameters, L = layers, h = hidden size, V = vocabulary, S = samples per
step (prompts x samples per prompt), tp/pp/dp = tensor/pipeline/data-parallel degrees.
All times are seconds per RL step; memory is bytes per device.

A mixture of experts: every FLOP count below ("2P", "6P") is of the parameters a token
goes through (``ModelShape.forward_flops_per_token``: its experts, ``num_matmul_params``);
every byte count of weights, gradients, optimizer state, gathers and weight sync is of
all of them (``num_params``, ``total_params``, ``trainable_params``). A decode
iteration reads the experts its batch routes to (``ModelShape.params_read``). KV cache:
per sequence, a sliding-window layer holding at most the window
(``kv_bytes_per_sequence_per_device``).

- Rollout (one engine instance per `tp` devices). Prefill is compute-bound:
  2P FLOPs per prompt token over peak x prefill efficiency. Decode is bound by
  memory bandwidth: one iteration reads the weight shard (2P/tp bytes) and the KV
  cache of the batch, t_iter = max(bytes / BW, FLOPs / peak) + tensor-parallel
  all-reduces + a fixed overhead. The batch is what the KV cache holds beside the
  weights: b = (usable memory - 2P/tp - workspace) / (KV bytes per sequence / tp).
  Streaming (async) rollout is throughput-bound: S x mean response / b iterations.
  A synchronous step also waits for its longest response: the tail.
  The rollout mode (`Workload.rollout_mode`) says how a replica takes its rows:
  "stream" (``[workflow] partial_rollout``: one continuous batch, new prompt groups
  join as rows free, weights swap between decode steps) is the throughput-bound
  model above; "unit" (the default generate calls of ``prompts_per_call`` groups, weights
  swapped between calls) drains each call to its longest response before the next
  starts, so every call pays its own tail: the expected longest of the call's n
  long-tailed lengths (`expected_longest_response`, log-normal of
  `Workload.response_len_sigma`, capped). Both admit at most a call's sequences at once.
- Training: 6P FLOPs per token (forward + backward) at a model-FLOPs efficiency,
  plus the pipeline bubble (pp-1)/m, tensor-parallel all-reduces, and the FSDP
  all-gathers / reduce-scatters that do not hide behind compute. Memory: 16 bytes
  per parameter of model state (bf16 params and grads, fp32 master + Adam m, v),
  sharded over tp x pp x dp, plus checkpointed activations and the fp32 logits.
  With LoRA (`Workload.lora`) only the T trainable parameters (adapters, + norms)
  carry grads, master and Adam state: 2 (P + A) + 14 T bytes for P base and A
  adapter parameters (`train_state_bytes`); the optimizer and the gradients'
  reduce-scatter cover T only.
- Reference (and critic) forward: 2P FLOPs per token, weights 2P/tp.
- Reward model (a served role on devices of its own): a classifier is a forward of
  its own shape over every token of the step, with a one-score head instead of the
  vocabulary's logits. It runs beside the reference, after generation: a stage of
  its own in async mode (its latency on the loop, overlapping the reference's), a
  phase in sync mode.
- Weight sync: the rollout shard (2P/tp bytes) over the inter-node link, one copy
  per rollout instance, from the senders the fan-out has (`Workload.weight_fanout`,
  `fanout_s`): direct, the trainer's side sends all n copies, n x copy; tree, each
  node sends d, and the chunks flow down in a pipeline, d x copy + (depth - 1) x d
  chunk hops. With the delayed parameter update only the host-to-device swap stays
  on the rollout path. With LoRA only the trainable parameters travel: 2T/tp bytes.
- A step: synchronous = the sum of its phases. Asynchronous with staleness k =
  max(each stage's time, (the dependency chain: generate -> train -> sync) / (k+1)),
  since k+1 steps may be in flight around that loop.
"""

from __future__ import annotations

import functools
import math

import msgspec

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.hardware import GiB, Hardware
from asyncflow.planner.models import Lora, ModelShape, total_params, trainable_params

DTYPE_BYTES = 2  # bf16 weights, activations and KV cache
MODEL_STATE_BYTES_PER_PARAM = 16  # bf16 param + bf16 grad + fp32 master, Adam m and v
LOGITS_BYTES_PER_VOCAB = 6  # bf16 logits + fp32 log-softmax for log-probs
MIN_MICRO_BATCH_TOKENS = 16384  # packed micro-batch (verl's default token budget per device)
MAX_SEQS_PER_INSTANCE = 512  # engine scheduler cap (vLLM max_num_seqs-like)
ROLLOUT_MODES = ("unit", "stream")
WEIGHT_CHUNK_BYTES = 32 << 20  # the weights actor's chunk (actors/weights/actor.py CHUNK_BYTES): the relay pipeline's grain


class Workload(msgspec.Struct, kw_only=True, frozen=True):
    prompt_len_tokens: int = 1024  # mean prompt length
    response_len_tokens: int = 2048  # mean response length
    max_response_len_tokens: int = 8192  # generation cap: the long tail reaches it
    prompts_per_step: int = 256  # batch size, in prompts
    samples_per_prompt: int = 8  # GRPO group size n
    staleness: int = 1  # k: 0 is synchronous
    use_reference: bool = True  # KL to a reference policy
    use_critic: bool = False  # PPO
    train_micro_batch_tokens: int = 0  # 0: max(one max-length sequence, 16384), sequences packed
    prefill_chunk_tokens: int = 2048
    lora: Lora = msgspec.field(default_factory=Lora)  # rank 0: full fine-tuning
    weight_fanout: str = "direct"  # [workflow] weight_fanout: "direct" (the trainer sends every copy) or "tree"
    weight_fanout_degree: int = 2  # [workflow] weight_fanout_degree: children per node of the tree
    rollout_mode: str = "stream"  # how an async replica generates: "stream" (continuous) or "unit" (calls that drain)
    prompts_per_call: int = 0  # [rollout] prompts_per_call: groups per call (stream: admitted at once); 0: a replica's share
    response_len_sigma: float = 0.8  # spread of the log-normal response lengths (a unit call's longest)

    @property
    def num_samples(self) -> int:
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def max_seq_tokens(self) -> int:
        return self.prompt_len_tokens + self.max_response_len_tokens

    @property
    def mean_seq_tokens(self) -> int:
        return self.prompt_len_tokens + self.response_len_tokens

    @property
    def micro_batch_tokens(self) -> int:
        return self.train_micro_batch_tokens or max(self.max_seq_tokens, MIN_MICRO_BATCH_TOKENS)

    def validate(self) -> None:
        if self.response_len_tokens > self.max_response_len_tokens:
            raise ValueError(
                f"mean response length {self.response_len_tokens} exceeds the cap {self.max_response_len_tokens}: "
                "raise --max-response-len or lower --response-len"
            )
        if min(self.prompt_len_tokens, self.response_len_tokens, self.prompts_per_step, self.samples_per_prompt) < 1:
            raise ValueError("prompt and response lengths, batch size and samples per prompt must be at least 1")
        if self.staleness < 0:
            raise ValueError("staleness must be 0 (synchronous) or more")
        if self.weight_fanout not in ("direct", "tree") or self.weight_fanout_degree < 1:
            raise ValueError(
                f"weight fan-out {self.weight_fanout!r} of degree {self.weight_fanout_degree}: use 'direct' or 'tree' "
                "with a degree of 1 or more"
            )
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(
                f"rollout mode {self.rollout_mode!r}: use 'unit' (generate calls, [workflow] partial_rollout = false) or "
                "'stream' (partial_rollout = true)"
            )
        if self.prompts_per_call < 0 or self.response_len_sigma < 0:
            raise ValueError("prompts per call (0: a replica's share) and the response-length spread must be 0 or more")


class RoleCost(msgspec.Struct, kw_only=True):
    """One role on `devices` devices at given degrees: time per step and memory per device."""

    role: str
    devices: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    feasible: bool = True
    time_s: float = 0.0  # steady-state (streaming) busy time per step
    tail_s: float = 0.0  # extra time a synchronous step waits for its longest sample
    latency_s: float = 0.0  # from the last input to this role's last output (one micro-batch)
    batch_per_instance: int = 0  # rollout: concurrent sequences per engine instance
    memory_bytes: dict[str, float] = {}  # per device, by use
    memory_available_bytes: float = 0.0
    reason: str = ""  # why it does not fit, or what limits it

    @property
    def peak_memory_bytes(self) -> float:
        return sum(self.memory_bytes.values())


def usable_memory(hw: Hardware) -> float:
    return hw.memory_bytes * hw.usable_memory_fraction


def _explain(role: RoleCost) -> str:
    parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in role.memory_bytes.items() if v > 0)
    need, have = role.peak_memory_bytes, role.memory_available_bytes
    return (
        f"{role.role} on {role.devices} devices (tp={role.tp}, pp={role.pp}, dp={role.dp}) needs "
        f"{need / GiB:.1f} GiB per device ({parts}), has {have / GiB:.1f} GiB usable: short by {(need - have) / GiB:.1f} GiB"
    )


def _check_fit(role: RoleCost) -> RoleCost:
    if role.peak_memory_bytes > role.memory_available_bytes:
        role.feasible = False
        role.reason = _explain(role)
    return role


def train_state_bytes(model: ModelShape, lora: Lora) -> int:
    """The policy's model state: bf16 weights of every parameter (base + adapters), and
    the grad, fp32 master and Adam m, v of the trainable ones only. Without LoRA 16P."""
    trainable = trainable_params(model, lora)
    return DTYPE_BYTES * total_params(model, lora) + (MODEL_STATE_BYTES_PER_PARAM - DTYPE_BYTES) * trainable


def allreduce_s(hw: Hardware, eff: Efficiency, num_bytes: float, group: int, inter_node: bool) -> float:
    """Ring all-reduce: 2 (g-1)/g of the bytes cross each link, plus a fixed latency."""
    if group <= 1:
        return 0.0
    bandwidth = (hw.inter_node_bandwidth_bytes_per_s if inter_node else hw.intra_node_bandwidth_bytes_per_s) * eff.link_bandwidth
    return hw.collective_latency_s + 2 * (group - 1) / group * num_bytes / bandwidth


def decode_iteration_s(model: ModelShape, hw: Hardware, eff: Efficiency, tp: int, batch: float, context_tokens: float) -> float:
    """One decode iteration of `batch` sequences at mean context `context_tokens`, on tp devices.
    It reads the weights its tokens go through (a mixture of experts: the experts the batch
    routes to, ``ModelShape.params_read``) and the batch's KV cache."""
    weight_bytes = model.params_read(batch) * DTYPE_BYTES / tp
    kv_bytes = batch * kv_bytes_per_sequence_per_device(model, tp, context_tokens)
    memory_s = (weight_bytes + kv_bytes) / (hw.memory_bandwidth_bytes_per_s * eff.decode_bandwidth)
    compute_s = batch * model.forward_flops_per_token(context_tokens) / tp / (hw.peak_bf16_flops * eff.prefill_flops)
    comm_s = 2 * model.num_layers * allreduce_s(hw, eff, batch * model.hidden_size * DTYPE_BYTES, tp, inter_node=False)
    overhead_s = (
        eff.decode_overhead_s + model.num_layers * eff.decode_overhead_s_per_layer + batch * eff.decode_overhead_s_per_seq
    )
    return max(memory_s, compute_s) + comm_s + overhead_s


def _kv_bytes_per_token_layer_per_device(model: ModelShape, tp: int) -> float:
    if model.latent_attention:  # one compressed kv per token, which every tensor-parallel rank holds
        return model.kv_elements_per_token_layer * DTYPE_BYTES
    kv_heads_per_device = math.ceil(model.num_kv_heads / tp)  # replicated when tp > kv heads
    return 2 * kv_heads_per_device * model.head_dim_ * DTYPE_BYTES


def kv_bytes_per_token_per_device(model: ModelShape, tp: int) -> float:
    """A token's KV cache in every layer, per device."""
    return model.num_layers * _kv_bytes_per_token_layer_per_device(model, tp)


def kv_bytes_per_sequence_per_device(model: ModelShape, tp: int, tokens: float) -> float:
    """One sequence of ``tokens`` tokens' KV cache per device: every token in a global layer,
    at most the window in a sliding-window layer (``ModelShape.attended_tokens``)."""
    return model.attended_tokens(tokens) * _kv_bytes_per_token_layer_per_device(model, tp)


def tp_allowed(model: ModelShape, hw: Hardware, tp: int) -> bool:
    """Tensor parallelism stays inside a node and splits attention heads evenly."""
    return (
        hw.devices_per_node % tp == 0
        and model.num_attention_heads % tp == 0
        and (model.num_kv_heads % tp == 0 or tp % model.num_kv_heads == 0)
    )


def rollout_cost(model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, devices: int, tp: int) -> RoleCost:
    """Generation of one step's S samples on `devices` devices, engine instances of tp devices."""
    instances = devices // tp
    weights = model.num_params * DTYPE_BYTES / tp
    workspace = wl.prefill_chunk_tokens * (
        DTYPE_BYTES * (8 * model.hidden_size + 3 * model.active_intermediate_size / tp) + 4 * model.vocab_size / tp
    )
    kv_mean_seq = kv_bytes_per_sequence_per_device(model, tp, wl.mean_seq_tokens)
    kv_max_seq = kv_bytes_per_sequence_per_device(model, tp, wl.max_seq_tokens)
    available = usable_memory(hw)
    kv_free = available - weights - workspace
    seqs_per_instance = math.ceil(wl.num_samples / instances)
    groups_per_call = unit_groups_per_call(wl, instances)
    # at most a call's sequences decode at once, in either mode (a stream admits prompts_per_call groups)
    call_seqs = wl.prompts_per_call * wl.samples_per_prompt if wl.prompts_per_call else seqs_per_instance
    if wl.rollout_mode == "unit":
        call_seqs = groups_per_call * wl.samples_per_prompt
    # Mean KV held by a live sequence: prompt + mean response (a long one holds more for longer).
    batch_cap = int(max(kv_free, 0) // kv_mean_seq)
    batch = max(1, min(batch_cap, seqs_per_instance, call_seqs, MAX_SEQS_PER_INSTANCE))
    role = RoleCost(
        role="rollout",
        devices=devices,
        tp=tp,
        dp=instances,
        batch_per_instance=batch,
        memory_available_bytes=available,
        memory_bytes={"weights": weights, "workspace": workspace, "kv_cache": batch * kv_mean_seq},
    )
    if kv_free < kv_max_seq:
        # Not even one max-length sequence fits beside the weights.
        role.memory_bytes["kv_cache"] = kv_max_seq
        _check_fit(role)
        role.reason += " (KV cache of one max-length sequence)"
        role.feasible = False
        return role
    limit = (
        "KV cache"
        if batch == batch_cap
        else "samples"
        if batch == seqs_per_instance
        else "call size"
        if batch == call_seqs
        else "scheduler cap"
    )
    if wl.rollout_mode == "unit":
        calls = math.ceil(wl.prompts_per_step / groups_per_call)
        call_s = _generation_s(model, hw, eff, wl, tp, call_seqs, batch) + _tail_s(
            model, hw, eff, wl, tp, batch, expected_longest_response(wl, call_seqs)
        )
        # replicas take whole calls as they free up, and the calls of k + 1 steps may be out at once
        # (staleness k): per k + 1 steps the busiest instance serves ceil((k + 1) calls / instances) of them.
        # A synchronous step waits for its busiest instance's ceil(calls / instances) calls.
        waves = max(1, wl.staleness + 1)
        role.time_s = math.ceil(waves * calls / instances) / waves * call_s
        role.tail_s = max(0.0, math.ceil(calls / instances) * call_s - role.time_s)
        role.reason = f"batch {batch} per instance ({limit} limited), {calls} calls of {call_seqs} sequences per step"
    else:
        role.time_s = _generation_s(model, hw, eff, wl, tp, seqs_per_instance, batch)
        role.tail_s = _tail_s(model, hw, eff, wl, tp, batch, wl.max_response_len_tokens)
        role.reason = f"batch {batch} per instance ({limit} limited)"
    role.latency_s = role.tail_s  # the last sample ends this long after the throughput-bound part
    return role


def unit_groups_per_call(wl: Workload, instances: int) -> int:
    """Prompt groups per generate call: ``prompts_per_call``, or (0) each instance's whole share, rounded down."""
    return min(wl.prompts_per_call or max(1, wl.prompts_per_step // instances), wl.prompts_per_step)


def _generation_s(model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, tp: int, seqs: int, batch: int) -> float:
    """Throughput-bound generation of ``seqs`` sequences at ``batch`` at once on one instance: their
    prefill, and mean-length decoding, new sequences taking the rows of finished ones."""
    context = wl.prompt_len_tokens + wl.response_len_tokens / 2
    t_iter = decode_iteration_s(model, hw, eff, tp, batch, context)
    decode_s = seqs * wl.response_len_tokens / batch * t_iter
    prefill_flops = seqs * model.prefill_flops(wl.prompt_len_tokens) / tp
    prefill_calls = math.ceil(seqs / batch)  # admissions of up to `batch` new sequences
    prefill_s = prefill_flops / (hw.peak_bf16_flops * eff.prefill_flops)
    prefill_s += prefill_calls * model.num_layers * eff.prefill_overhead_s_per_layer
    # the engine's own per-call and per-sequence work (scheduling, completions; afctl profile)
    prefill_s += prefill_calls * eff.generate_overhead_s + seqs * eff.generate_overhead_s_per_seq
    return prefill_s + decode_s


def _tail_s(model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, tp: int, batch: int, longest: float) -> float:
    """The tail: the last sequences run on at a shrinking batch until the longest (``longest`` tokens) ends."""
    tail_batch = max(1, batch // 4)
    return max(0.0, longest - wl.response_len_tokens) * decode_iteration_s(
        model, hw, eff, tp, tail_batch, wl.prompt_len_tokens + longest / 2
    )


def expected_longest_response(wl: Workload, n: int) -> float:
    """The expected longest of ``n`` response lengths, log-normal with the workload's mean and
    ``response_len_sigma`` and capped at its maximum (``planner.simulate.response_lengths`` draws
    them so): what a generate call of ``n`` sequences decodes for before it returns."""
    return _expected_longest(float(wl.response_len_tokens), wl.response_len_sigma, float(wl.max_response_len_tokens), n)


@functools.lru_cache(maxsize=4096)
def _expected_longest(mean: float, sigma: float, cap: float, n: int) -> float:
    if sigma == 0 or n <= 0:
        return min(mean, cap)
    mu = math.log(mean) - sigma**2 / 2
    # E[min(max of n, cap)] = integral of min(exp(mu + sigma z), cap) d(Phi(z)^n), midpoint rule over z
    lo, hi, steps = -8.0, 8.0, 800
    dz = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        z = lo + (i + 0.5) * dz
        phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
        total += min(math.exp(mu + sigma * z), cap) * n * cdf ** (n - 1) * phi * dz
    return total


def micro_batch_tokens(wl: Workload, ranks: int) -> int:
    """The token budget of a micro-batch, no more than a rank's share (but one whole sequence)."""
    share = math.ceil(wl.num_samples * wl.mean_seq_tokens / ranks)
    return min(wl.micro_batch_tokens, max(share, wl.max_seq_tokens))


def forward_cost(
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    wl: Workload,
    devices: int,
    tp: int,
    role: str = "reference",
    vocab_logits: bool = True,
) -> RoleCost:
    """A forward pass over every token of the step (reference log-probs, critic values;
    a reward model's scores, without ``vocab_logits``)."""
    replicas = devices // tp
    tokens = wl.num_samples * wl.mean_seq_tokens
    flops = tokens * model.forward_flops_per_token(wl.mean_seq_tokens / 2)
    mb = micro_batch_tokens(wl, replicas)
    num_mb = math.ceil(tokens / replicas / mb)
    time_s = flops / (devices * hw.peak_bf16_flops * eff.forward_flops) + num_mb * eff.forward_overhead_s
    time_s += tokens / replicas * model.num_layers * eff.forward_overhead_s_per_token_layer
    time_s += num_mb * model.num_layers * 2 * allreduce_s(hw, eff, mb * model.hidden_size * DTYPE_BYTES, tp, False)
    cost = RoleCost(
        role=role,
        devices=devices,
        tp=tp,
        dp=replicas,
        time_s=time_s,
        latency_s=time_s / max(num_mb, 1),
        memory_available_bytes=usable_memory(hw),
        memory_bytes={
            "weights": model.num_params * DTYPE_BYTES / tp,
            "activations": mb * DTYPE_BYTES * (8 * model.hidden_size + 3 * model.active_intermediate_size) / tp,
            "logits": mb * model.vocab_size * LOGITS_BYTES_PER_VOCAB / tp if vocab_logits else 0.0,
        },
    )
    return _check_fit(cost)


def reward_model_cost(rm: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, devices: int, tp: int) -> RoleCost:
    """The reward-model role on ``devices`` devices: a classifier's forward over every
    token of the step (one score per sequence: no vocabulary logits)."""
    return forward_cost(rm, hw, eff, wl, devices, tp, role="reward_model", vocab_logits=False)


def train_cost(
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    wl: Workload,
    devices: int,
    tp: int,
    pp: int,
    with_reference: bool = False,
) -> RoleCost:
    """One optimizer step over the step's tokens (actor; + critic for PPO; + reference if colocated)."""
    dp = devices // (tp * pp)
    tokens = wl.num_samples * wl.mean_seq_tokens
    mb = micro_batch_tokens(wl, dp)
    num_mb = max(1, math.ceil(tokens / dp / mb))  # micro-batches per data-parallel rank
    models_trained = 2 if wl.use_critic else 1
    flops = models_trained * 3 * tokens * model.forward_flops_per_token(wl.mean_seq_tokens / 2)
    compute_s = flops / (devices * hw.peak_bf16_flops * eff.train_flops)
    compute_s *= 1 + (pp - 1) / num_mb  # 1F1B pipeline bubble
    layers_per_stage = math.ceil(model.num_layers / pp)
    tp_s = num_mb * layers_per_stage * 4 * allreduce_s(hw, eff, mb * model.hidden_size * DTYPE_BYTES, tp, False)
    # FSDP over dp: bf16 all-gather in forward and backward per micro-batch, fp32 reduce-scatter once
    # (of the trainable parameters' gradients). The critic (PPO) trains in full.
    critic_params = model.num_params if wl.use_critic else 0
    gathered_params = (total_params(model, wl.lora) + critic_params) / (tp * pp)
    reduced_params = (trainable_params(model, wl.lora) + critic_params) / (tp * pp)
    dp_inter = devices > hw.devices_per_node
    gather_s = (
        num_mb * 2 * allreduce_s(hw, eff, gathered_params * DTYPE_BYTES, dp, dp_inter) / 2
        + allreduce_s(hw, eff, reduced_params * 4, dp, dp_inter) / 2
    )
    exposed_comm_s = max(0.0, gather_s - compute_s) + (hw.collective_latency_s if dp > 1 else 0.0)
    critic_state = MODEL_STATE_BYTES_PER_PARAM * critic_params
    state_bytes = (train_state_bytes(model, wl.lora) + critic_state) / devices
    # the optimizer step passes over the trainable parameters' state only
    optimizer_bytes = MODEL_STATE_BYTES_PER_PARAM * (trainable_params(model, wl.lora) + critic_params) / devices
    optimizer_s = 3 * optimizer_bytes / (hw.memory_bandwidth_bytes_per_s * eff.decode_bandwidth)
    time_s = compute_s + tp_s + exposed_comm_s + optimizer_s + num_mb * eff.train_overhead_s
    time_s += models_trained * tokens / dp * layers_per_stage * eff.train_overhead_s_per_token_layer
    memory = {
        "model_states": state_bytes,
        "gathered_layers": 2 * models_trained * model.params_per_layer * DTYPE_BYTES / tp,
        "activations": (
            min(pp, num_mb) * layers_per_stage * mb * model.hidden_size * DTYPE_BYTES / tp
            + mb * DTYPE_BYTES * (8 * model.hidden_size + 3 * model.active_intermediate_size) / tp
        ),
        "logits": mb * model.vocab_size * LOGITS_BYTES_PER_VOCAB / tp,
    }
    if with_reference:
        ref = forward_cost(model, hw, eff, wl, devices, tp)
        time_s += ref.time_s
        memory["reference_weights"] = model.num_params * DTYPE_BYTES / devices  # sharded like the actor
    if wl.use_critic:
        critic_fwd = forward_cost(model, hw, eff, wl, devices, tp, role="critic")
        time_s += critic_fwd.time_s
    cost = RoleCost(
        role="train",
        devices=devices,
        tp=tp,
        pp=pp,
        dp=dp,
        time_s=time_s,
        latency_s=time_s / num_mb + optimizer_s,
        memory_available_bytes=usable_memory(hw),
        memory_bytes=memory,
    )
    return _check_fit(cost)


def tree_depth(num_replicas: int, degree: int) -> int:
    """Hops from the root to the deepest of ``num_replicas`` replicas in the fan-out tree of
    ``degree`` (heap order, the root at node 0: ``actors/weights/_relay.py``); 1: every
    replica is a child of the root."""
    depth, node = 0, num_replicas  # the last replica is the deepest node
    while node > 0:
        node = (node - 1) // degree
        depth += 1
    return depth


def fanout_s(copy_s: float, replicas: int, fanout: str = "direct", degree: int = 2, chunk_s: float = 0.0) -> float:
    """Seconds from a publish to the last of ``replicas`` replicas holding the version, one
    copy of which takes ``copy_s`` over a sender's link and one chunk ``chunk_s``: direct,
    the trainer's side sends every copy; tree, every node (the trainer too) sends at most
    ``degree``, and a relay forwards each chunk as it arrives, so the deepest replica is
    ``depth - 1`` chunk hops (each shared by ``degree`` children) behind the root's children."""
    n = max(1, replicas)
    if fanout == "direct":
        return n * copy_s
    return min(degree, n) * copy_s + (tree_depth(n, degree) - 1) * degree * min(chunk_s, copy_s)


def weight_transfer_s(
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    rollout_tp: int,
    colocated: bool = False,
    lora: Lora | None = None,
    replicas: int = 1,
    fanout: str = "direct",
    degree: int = 2,
) -> float:
    """New weights into every rollout device of ``replicas`` instances: a shard over the
    inter-node link (or local reshard: colocated, no fan-out), one copy per instance,
    sent as the fan-out (``fanout_s``) has it; with LoRA only the trainable parameters
    (adapters, + norms) travel."""
    shard = trainable_params(model, lora or Lora()) * DTYPE_BYTES / rollout_tp
    link = (hw.intra_node_bandwidth_bytes_per_s if colocated else hw.inter_node_bandwidth_bytes_per_s) * eff.link_bandwidth
    copies = 1 if colocated else replicas
    return fanout_s(shard / link, copies, fanout, degree, WEIGHT_CHUNK_BYTES / link) + hw.collective_latency_s


def workload_transfer_s(
    model: ModelShape, hw: Hardware, eff: Efficiency, wl: Workload, rollout_devices: int, rollout_tp: int
) -> float:
    """``weight_transfer_s`` of the workload's fan-out to the rollout instances of
    ``rollout_devices`` devices at tensor-parallel degree ``rollout_tp``."""
    return weight_transfer_s(
        model,
        hw,
        eff,
        rollout_tp,
        lora=wl.lora,
        replicas=max(1, rollout_devices // rollout_tp),
        fanout=wl.weight_fanout,
        degree=wl.weight_fanout_degree,
    )


def weight_swap_s(model: ModelShape, hw: Hardware, rollout_tp: int, lora: Lora | None = None) -> float:
    """Delayed parameter update: host buffer -> device copy at a generation-iteration
    boundary (with LoRA, of the adapters: what the sync sent)."""
    return trainable_params(model, lora or Lora()) * DTYPE_BYTES / rollout_tp / hw.host_to_device_bandwidth_bytes_per_s


class StepCost(msgspec.Struct, kw_only=True):
    mode: str  # "async", "sync" (task-separated, sequential) or "colocated" (every role on every device)
    staleness: int
    step_s: float
    bottleneck: str
    stage_s: dict[str, float]  # what each term of the step bound is


def async_step(
    rollout: RoleCost,
    train: RoleCost,
    reference: RoleCost | None,
    transfer_s: float,
    swap_s: float,
    staleness: int,
    reward_model: RoleCost | None = None,
) -> StepCost:
    """Streaming pipeline with staleness k: the slowest stage, or the dependency loop over k+1 steps."""
    stages = {
        "rollout": rollout.time_s + swap_s,
        "train": train.time_s,
    }
    if reference is not None:
        stages["reference"] = reference.time_s
    if reward_model is not None:
        stages["reward_model"] = reward_model.time_s
    # Generating step s needs the weights trained on step s-k-1: the loop
    # generate (incl. the tail) -> reference and reward model (side by side) -> train -> sync spans k+1 periods.
    scored_s = max(reference.latency_s if reference else 0.0, reward_model.latency_s if reward_model else 0.0)
    loop_s = rollout.time_s + rollout.tail_s + scored_s + train.latency_s + transfer_s
    stages["dependency"] = loop_s / (staleness + 1)
    bottleneck = max(stages, key=lambda name: stages[name])
    return StepCost(mode="async", staleness=staleness, step_s=stages[bottleneck], bottleneck=bottleneck, stage_s=stages)


def sync_step(
    rollout: RoleCost,
    train: RoleCost,
    reference: RoleCost | None,
    transfer_s: float,
    mode: str = "sync",
    extra_s: float = 0.0,
    reward_model: RoleCost | None = None,
) -> StepCost:
    """Each phase waits for the previous one: generate (with the tail), reference, reward model, train, sync."""
    stages = {"rollout": rollout.time_s + rollout.tail_s, "train": train.time_s, "weight_sync": transfer_s + extra_s}
    if reference is not None:
        stages["reference"] = reference.time_s
    if reward_model is not None:
        stages["reward_model"] = reward_model.time_s
    bottleneck = max(stages, key=lambda name: stages[name])
    return StepCost(mode=mode, staleness=0, step_s=sum(stages.values()), bottleneck=bottleneck, stage_s=stages)


def offload_s(model: ModelShape, hw: Hardware, devices: int, use_critic: bool, lora: Lora | None = None) -> float:
    """Colocated mode: training states to host before generation and back after (both ways)."""
    critic_state = MODEL_STATE_BYTES_PER_PARAM * model.num_params if use_critic else 0
    state = (train_state_bytes(model, lora or Lora()) + critic_state) / devices
    return 2 * state / hw.host_to_device_bandwidth_bytes_per_s
