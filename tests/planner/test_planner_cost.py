"""Hand-checked numbers of the analytical cost model."""

import math

import msgspec
import pytest

from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import (
    Workload,
    async_step,
    decode_iteration_s,
    forward_cost,
    kv_bytes_per_sequence_per_device,
    kv_bytes_per_token_per_device,
    rollout_cost,
    sync_step,
    train_cost,
    weight_swap_s,
    weight_transfer_s,
)
from asyncflow.planner.hardware import HARDWARE, get_hardware
from asyncflow.planner.io import from_hf_config, get_model
from asyncflow.planner.models import PRESETS

PEAK = Efficiency(prefill_flops=1.0, decode_bandwidth=1.0, train_flops=1.0, forward_flops=1.0, link_bandwidth=1.0)


def test_preset_parameter_counts_match_the_published_qwen25_checkpoints():
    # Published sizes: 0.49B, 1.54B, 7.61B, 14.7B, 32.8B, 72.7B.
    expected = {"0.5b": 0.494, "1.5b": 1.544, "7b": 7.616, "14b": 14.770, "32b": 32.764, "72b": 72.706}
    for name, billions in expected.items():
        assert PRESETS[name].num_params / 1e9 == pytest.approx(billions, abs=0.001)


def test_qwen25_7b_kv_cache_is_56_kib_per_token_in_bf16():
    # 2 (K and V) x 28 layers x 4 KV heads x 128 head dim x 2 bytes = 57,344.
    assert PRESETS["7b"].kv_bytes_per_token() == 57344
    assert kv_bytes_per_token_per_device(PRESETS["7b"], 2) == 57344 / 2
    # Beyond the KV-head count the heads are replicated, not split further.
    assert kv_bytes_per_token_per_device(PRESETS["7b"], 8) == 57344 / 4


def test_decode_of_7b_at_batch_one_takes_the_weights_over_the_a100_bandwidth():
    m, hw = PRESETS["7b"], get_hardware("a100")
    t = decode_iteration_s(m, hw, PEAK, tp=1, batch=1, context_tokens=0)
    # 7,615,616,512 params x 2 bytes / 2.039e12 B/s = 7.470 ms.
    assert t == pytest.approx(2 * 7_615_616_512 / 2.039e12, rel=1e-9)
    assert t == pytest.approx(7.470e-3, abs=1e-6)


def test_decode_adds_the_kv_cache_read_of_the_whole_batch():
    m, hw = PRESETS["7b"], get_hardware("a100")
    base = decode_iteration_s(m, hw, PEAK, tp=1, batch=10, context_tokens=0)
    with_kv = decode_iteration_s(m, hw, PEAK, tp=1, batch=10, context_tokens=1000)
    # 10 sequences x 1000 tokens x 57,344 B = 573.44 MB at 2.039 TB/s = 0.2812 ms.
    assert with_kv - base == pytest.approx(573.44e6 / 2.039e12, rel=1e-6)


def test_large_decode_batches_become_compute_bound():
    m, hw = PRESETS["7b"], get_hardware("h100")
    t = decode_iteration_s(m, hw, PEAK, tp=1, batch=4096, context_tokens=0)
    assert t == pytest.approx(4096 * m.forward_flops_per_token(0) / hw.peak_bf16_flops, rel=1e-9)


def test_forward_flops_are_two_per_weight_plus_attention():
    m = PRESETS["7b"]
    matmul = 28 * m.params_per_layer + 152064 * 3584
    assert m.forward_flops_per_token(0) == 2 * matmul
    assert m.forward_flops_per_token(1000) - m.forward_flops_per_token(0) == 4 * 28 * 3584 * 1000


def test_prefill_sends_only_the_last_prompt_token_through_the_output_head():
    m = PRESETS["7b"]
    head = 2 * 152064 * 3584
    assert m.prefill_flops(1) == m.forward_flops_per_token(0.5)
    assert m.prefill_flops(100) == pytest.approx(100 * m.forward_flops_per_token(50) - 99 * head)


def test_training_time_is_six_flops_per_parameter_per_token_at_the_efficiency():
    m, hw = PRESETS["7b"], get_hardware("h100")
    wl = Workload(
        prompt_len_tokens=16,
        response_len_tokens=16,
        max_response_len_tokens=16,
        prompts_per_step=64,
        samples_per_prompt=16,
        use_reference=False,
    )
    eff = Efficiency(train_flops=0.5)
    cost = train_cost(m, hw, eff, wl, devices=8, tp=1, pp=1)
    tokens = 64 * 16 * 32
    six_n_d = 6 * m.num_matmul_params * tokens / (8 * hw.peak_bf16_flops * 0.5)
    # Short sequences: attention adds < 1 %, the optimizer step and exposed FSDP traffic a few %.
    assert six_n_d < cost.time_s < 1.1 * six_n_d


def test_training_memory_counts_16_bytes_per_parameter_sharded_over_all_devices():
    m, hw = PRESETS["7b"], get_hardware("h100")
    cost = train_cost(m, hw, Efficiency(), Workload(), devices=16, tp=2, pp=2)
    assert cost.memory_bytes["model_states"] == pytest.approx(16 * m.num_params / 16)
    assert cost.dp == 4


def test_weight_sync_moves_the_rollout_shard_over_the_inter_node_link():
    m, hw = PRESETS["7b"], get_hardware("h100")
    # 15.23 GB / (50 GB/s x 0.7) + 10 us = 0.4352 s.
    assert weight_transfer_s(m, hw, Efficiency(link_bandwidth=0.7), rollout_tp=1) == pytest.approx(
        2 * m.num_params / 35e9 + 10e-6
    )
    assert weight_transfer_s(m, hw, PEAK, rollout_tp=4) == pytest.approx(2 * m.num_params / 4 / 50e9 + 10e-6)
    assert weight_swap_s(m, hw, rollout_tp=1) == pytest.approx(2 * m.num_params / 50e9)


def test_rollout_batch_is_limited_by_the_kv_cache_beside_the_weights():
    m, hw = PRESETS["32b"], get_hardware("910b")
    wl = Workload(prompts_per_step=1024, samples_per_prompt=16)
    one = rollout_cost(m, hw, Efficiency(), wl, devices=8, tp=2)
    two = rollout_cost(m, hw, Efficiency(), wl, devices=8, tp=4)
    assert one.feasible and two.feasible
    assert "KV cache limited" in one.reason
    # More tensor parallelism: smaller weight shard, more room for KV, bigger batch.
    assert two.batch_per_instance > one.batch_per_instance
    assert one.peak_memory_bytes <= one.memory_available_bytes


def test_a_rollout_that_cannot_hold_the_weights_is_infeasible_and_says_by_how_much():
    m, hw = PRESETS["72b"], get_hardware("910b")
    cost = rollout_cost(m, hw, Efficiency(), Workload(), devices=1, tp=1)
    assert not cost.feasible
    assert "short by" in cost.reason and "weights 135.4" in cost.reason


def test_forward_cost_is_two_flops_per_parameter_per_token():
    m, hw = PRESETS["1.5b"], get_hardware("a100")
    wl = Workload(prompt_len_tokens=8, response_len_tokens=8, max_response_len_tokens=8, prompts_per_step=8, samples_per_prompt=8)
    cost = forward_cost(m, hw, PEAK, wl, devices=2, tp=1)
    tokens = 64 * 16
    assert cost.time_s == pytest.approx(tokens * m.forward_flops_per_token(8) / (2 * hw.peak_bf16_flops))


def test_a_sync_step_is_the_sum_of_its_phases_and_async_is_bounded_by_the_slowest_stage():
    m, hw = PRESETS["7b"], get_hardware("h100")
    wl = Workload()
    r = rollout_cost(m, hw, Efficiency(), wl, 32, 4)
    t = train_cost(m, hw, Efficiency(), wl, 32, 1, 1, with_reference=True)
    transfer, swap = weight_transfer_s(m, hw, Efficiency(), 4), weight_swap_s(m, hw, 4)
    s = sync_step(r, t, None, transfer)
    assert s.step_s == pytest.approx(r.time_s + r.tail_s + t.time_s + transfer)
    for k in (1, 2, 4):
        a = async_step(r, t, None, transfer, swap, k)
        assert a.step_s == max(a.stage_s.values())
        assert a.step_s >= max(r.time_s, t.time_s)
        assert a.step_s < s.step_s
    # A looser staleness never makes a step slower.
    assert async_step(r, t, None, transfer, swap, 4).step_s <= async_step(r, t, None, transfer, swap, 1).step_s


def test_hardware_profiles_cover_the_required_devices_and_unknown_names_list_the_choices():
    assert {"910b", "a100", "h100", "h200", "cpu"} <= set(HARDWARE)
    assert get_hardware("H100").memory_bytes == 80e9
    with pytest.raises(ValueError, match="choose one of"):
        get_hardware("tpu-v9")


def test_a_local_hf_config_is_read_like_a_preset(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 4, "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,'
        ' "num_key_value_heads": 2, "vocab_size": 100, "tie_word_embeddings": true}'
    )
    m = get_model(str(tmp_path))
    assert m.num_layers == 4 and m.kv_dim == 64
    per_layer = 128 * 128 + 128 + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 256 + 2 * 128
    assert m.num_params == 4 * per_layer + 100 * 128 + 128
    with pytest.raises(FileNotFoundError, match="preset"):
        from_hf_config(tmp_path / "missing")


def test_workload_rejects_a_mean_response_above_its_cap():
    with pytest.raises(ValueError, match="max-response-len"):
        Workload(response_len_tokens=9000, max_response_len_tokens=8192).validate()
    assert not math.isnan(Workload().num_samples)


def _only_compute_counts(hw):
    """``hw`` with memory, bandwidths and links so large that only FLOPs take time."""
    huge = 1e30
    return msgspec.structs.replace(
        hw,
        memory_bytes=1e15,
        memory_bandwidth_bytes_per_s=huge,
        intra_node_bandwidth_bytes_per_s=huge,
        inter_node_bandwidth_bytes_per_s=huge,
        host_to_device_bandwidth_bytes_per_s=huge,
        collective_latency_s=0.0,
    )


def test_a_mixture_of_experts_computes_with_its_active_parameters_and_holds_all_of_them():
    """Twice the experts (the same top-k): the same FLOPs (but the router's, 0.4 %), twice
    the experts' weights in memory, in the training state and in a weight sync. Twice the top-k (the same
    experts): more FLOPs, the same memory. Fails if compute used the total or memory the
    active parameters."""
    base = PRESETS["qwen3-30b-a3b"]
    more_experts = msgspec.structs.replace(base, num_experts=2 * base.num_experts)
    more_topk = msgspec.structs.replace(base, num_experts_per_tok=2 * base.num_experts_per_tok)
    assert more_experts.num_params > 1.9 * base.num_params
    assert more_experts.num_active_params == pytest.approx(base.num_active_params, rel=0.005)
    assert more_topk.num_params == base.num_params and more_topk.num_active_params > 1.5 * base.num_active_params
    wl, eff = Workload(prompts_per_step=64), Efficiency()
    fast = _only_compute_counts(get_hardware("h100"))

    def times(m):
        return (
            rollout_cost(m, fast, eff, wl, 8, 2).time_s,
            train_cost(m, fast, eff, wl, 16, 1, 1).time_s,
            forward_cost(m, fast, eff, wl, 8, 1).time_s,
        )

    for same, more in zip(times(base), times(more_experts)):
        assert more == pytest.approx(same, rel=0.005)
    for same, more in zip(times(base), times(more_topk)):
        assert more > 1.3 * same

    hw = get_hardware("h100")

    def held(m):
        return (
            rollout_cost(m, hw, eff, wl, 8, 8).memory_bytes["weights"],
            train_cost(m, hw, eff, wl, 16, 1, 1).memory_bytes["model_states"],
            forward_cost(m, hw, eff, wl, 8, 8).memory_bytes["weights"],
            weight_transfer_s(m, hw, eff, 8) - hw.collective_latency_s,
            weight_swap_s(m, hw, 8),
        )

    ratio = more_experts.num_params / base.num_params
    for same, more in zip(held(base), held(more_experts)):
        assert more == pytest.approx(ratio * same, rel=1e-9)
    assert held(more_topk) == held(base)
    assert held(base)[1] == pytest.approx(16 * base.num_params / 16)  # 16 bytes of state per parameter, 16 ranks


def test_a_mixture_of_experts_decode_reads_the_experts_its_batch_routes_to():
    """One sequence's decode iteration reads its 8 experts of 128 per layer (and every
    other weight); 512 sequences route to every expert."""
    m, hw = PRESETS["qwen3-30b-a3b"], get_hardware("h100")
    routed = m.num_layers * m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size
    one = decode_iteration_s(m, hw, PEAK, tp=1, batch=1, context_tokens=0)
    assert one == pytest.approx(2 * (m.num_params - routed * (1 - 8 / 128)) / hw.memory_bandwidth_bytes_per_s)
    assert one < 0.2 * 2 * m.num_params / hw.memory_bandwidth_bytes_per_s
    full = decode_iteration_s(m, hw, PEAK, tp=1, batch=512, context_tokens=0)
    assert full == pytest.approx(2 * m.num_params / hw.memory_bandwidth_bytes_per_s, rel=1e-6)


def test_a_sliding_window_models_kv_cache_is_the_windows_in_its_local_layers():
    """Gemma 3 27B at tp 1: a 9k-token sequence holds 9k tokens in its 10 global layers and
    1,024 in its 52 local ones; an instance fits that many more sequences than a model
    holding every token in every layer would."""
    m = PRESETS["gemma3-27b"]
    per_token_layer = 2 * m.num_kv_heads * m.head_dim_ * 2
    assert kv_bytes_per_sequence_per_device(m, 1, 9216) == per_token_layer * (10 * 9216 + 52 * 1024)
    assert kv_bytes_per_sequence_per_device(m, 2, 9216) == kv_bytes_per_sequence_per_device(m, 1, 9216) / 2
    everywhere = msgspec.structs.replace(m, sliding_window=0, sliding_window_layers=0)
    wl, hw = Workload(prompts_per_step=512), get_hardware("h100")
    windowed, full = rollout_cost(m, hw, Efficiency(), wl, 2, 2), rollout_cost(everywhere, hw, Efficiency(), wl, 2, 2)
    assert windowed.batch_per_instance > 2 * full.batch_per_instance
