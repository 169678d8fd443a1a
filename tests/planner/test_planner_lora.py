"""LoRA in the planner's cost model and `afctl plan`: the adapter count from the shape
matches peft's on the real engine, only the trainable parameters carry gradients and
optimizer state and travel at a sync, and without LoRA nothing changes."""

import json

import pytest
from click.testing import CliRunner

from asyncflow.cli.main import main
from asyncflow.engines.config import LoraConfig, TrainEngineConfig
from asyncflow.engines.factory import build_train_engine
from asyncflow.engines.lora import LINEAR_MODULES
from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import Workload, offload_s, train_cost, weight_swap_s, weight_transfer_s
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.io import from_hf_config
from asyncflow.planner.models import PRESETS, Lora, linear_features, lora_params, total_params, trainable_params

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.mark.parametrize(
    "targets, train_norms", [(ATTN, False), (("v_proj", "down_proj"), False), (LINEAR_MODULES, True)], ids=str
)
def test_the_adapter_count_from_the_shape_is_peft_s_count_on_the_tiny_model(tiny_dir, targets, train_norms):
    spec = LoraConfig(rank=4, target_modules=targets, train_norms=train_norms)
    engine = build_train_engine(TrainEngineConfig(lora=spec), str(tiny_dir))  # peft's layers, as a run builds them
    params = list(engine.net.parameters())
    trained = sum(p.numel() for p in params if p.requires_grad)
    in_optimizer = sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"])
    adapters = sum(p.numel() for n, p in engine.net.named_parameters() if ".lora_" in n)
    shape = from_hf_config(tiny_dir)
    lora = Lora.of(spec)
    assert lora_params(shape, 4, targets) == adapters > 0
    assert trainable_params(shape, lora) == trained == in_optimizer
    assert total_params(shape, lora) == sum(p.numel() for p in params)
    assert trained < shape.num_params / 3


def test_every_adaptable_layer_of_the_engines_has_a_shape_and_others_are_refused():
    m = PRESETS["7b"]
    assert {name: linear_features(m, name) for name in LINEAR_MODULES}["down_proj"] == (18944, 3584)
    with pytest.raises(ValueError, match="not a linear layer"):
        linear_features(m, "lm_head")


def _attention_adapters(m, rank: int) -> int:
    """rank x (in + out) of q, k, v, o per layer, written out: q/o h <-> heads x head_dim, k/v h -> kv_dim."""
    h, q, kv = m.hidden_size, m.num_attention_heads * m.head_dim_, m.num_kv_heads * m.head_dim_
    return m.num_layers * rank * ((h + q) + (h + kv) + (h + kv) + (q + h))


def test_lora_training_state_is_bf16_weights_of_all_and_16_bytes_per_trainable_parameter():
    m, hw = PRESETS["7b"], get_hardware("h100")
    P, A = m.num_params, _attention_adapters(m, 8)
    assert A == 28 * 8 * (4 * 3584 + 2 * 3584 + 2 * 512)  # 5,046,272
    full = train_cost(m, hw, Efficiency(), Workload(), devices=8, tp=1, pp=1)
    lora = train_cost(m, hw, Efficiency(), Workload(lora=Lora(rank=8)), devices=8, tp=1, pp=1)
    assert full.memory_bytes["model_states"] == 16 * P / 8
    assert lora.memory_bytes["model_states"] == (2 * (P + A) + 14 * A) / 8
    assert full.memory_bytes["model_states"] - lora.memory_bytes["model_states"] == pytest.approx((14 * P - 16 * A) / 8)
    assert lora.time_s < full.time_s  # the optimizer passes over the adapters' state only
    norms = (2 * m.num_layers + 1) * m.hidden_size
    with_norms = train_cost(m, hw, Efficiency(), Workload(lora=Lora(rank=8, train_norms=True)), devices=8, tp=1, pp=1)
    assert with_norms.memory_bytes["model_states"] == (2 * (P + A) + 14 * (A + norms)) / 8
    # PPO: the critic trains in full beside the LoRA policy
    ppo = train_cost(m, hw, Efficiency(), Workload(use_critic=True, lora=Lora(rank=8)), devices=8, tp=1, pp=1)
    assert ppo.memory_bytes["model_states"] == (2 * (P + A) + 14 * A + 16 * P) / 8
    assert offload_s(m, hw, 8, False, Lora(rank=8)) / offload_s(m, hw, 8, False) == pytest.approx(
        (2 * (P + A) + 14 * A) / (16 * P)
    )


def test_a_lora_weight_sync_moves_the_adapters_only():
    m, hw = PRESETS["7b"], get_hardware("h100")
    P, A = m.num_params, _attention_adapters(m, 16)
    lat = hw.collective_latency_s
    full, lora = weight_transfer_s(m, hw, Efficiency(), 2), weight_transfer_s(m, hw, Efficiency(), 2, lora=Lora(rank=16))
    assert (lora - lat) / (full - lat) == pytest.approx(A / P)
    assert weight_swap_s(m, hw, 2, Lora(rank=16)) / weight_swap_s(m, hw, 2) == pytest.approx(A / P)


def test_without_lora_nothing_changes_whatever_the_other_lora_keys_say():
    m, hw = PRESETS["7b"], get_hardware("h100")
    off = Lora(rank=0, target_modules=LINEAR_MODULES, train_norms=True)
    assert trainable_params(m, off) == total_params(m, off) == m.num_params
    for kw in ({}, {"use_critic": True}):
        a = train_cost(m, hw, Efficiency(), Workload(**kw), devices=16, tp=2, pp=2)
        b = train_cost(m, hw, Efficiency(), Workload(lora=off, **kw), devices=16, tp=2, pp=2)
        assert a.memory_bytes == b.memory_bytes and a.time_s == b.time_s
        assert a.memory_bytes["model_states"] == 16 * (2 if kw else 1) * m.num_params / 16
    assert weight_transfer_s(m, hw, Efficiency(), 1, lora=off) == weight_transfer_s(m, hw, Efficiency(), 1)


def _plan(*args):
    return CliRunner().invoke(main, ["plan", "--model", "7b", "--gpus", "2", "--hardware", "h100", *args])


def test_afctl_plan_fits_a_7b_on_two_gpus_with_lora_and_not_without():
    full = _plan()
    assert full.exit_code != 0 and "no plan fits in memory" in full.output and "model_states 56.7" in full.output
    lora = _plan("--lora-rank", "8", "--json")
    assert lora.exit_code == 0, lora.output
    plans = json.loads(lora.output.strip().splitlines()[-1])["plans"]
    assert plans and plans[0]["train_devices"] == 1
    bad = _plan("--lora-rank", "8", "--lora-targets", "q_proj,lm_head")
    assert bad.exit_code != 0 and "lm_head" in bad.output


def test_a_run_config_with_lora_is_predicted_with_the_adapters_sync():
    from asyncflow.config.load import load_config_text
    from asyncflow.planner.calibration import Profile
    from asyncflow.planner.predict import ConfigInputs, predict

    m = PRESETS["0.5b"]
    inputs = ConfigInputs(model=m, prompt_tokens=8.0, reward_score_s={"sync": 0.01, "async": 0.01})
    eff = Efficiency(snapshot_overhead_s=0.001, snapshot_s_per_param=1e-9)
    profile = Profile(hardware="cpu", efficiency=eff)

    def run(toml: str) -> dict:
        return predict(load_config_text(toml), profile, inputs, cores=2, num_steps=5, poll_s=0.05)

    full, lora = run(""), run("[train.engine.lora]\nrank = 8")
    assert run('[train.engine.lora]\nrank = 0\ntarget_modules = ["up_proj"]') == full
    T = _attention_adapters(m, 8)
    assert lora["framework"]["snapshot_s"] == pytest.approx(0.001 + T * 1e-9)
    assert full["framework"]["snapshot_s"] == pytest.approx(0.001 + m.num_params * 1e-9)
    hw = get_hardware("cpu")
    for mode in ("sync", "async"):
        got, was = lora["modes"][mode]["stages"], full["modes"][mode]["stages"]
        assert was["fetch_s"] - got["fetch_s"] == pytest.approx(
            weight_transfer_s(m, hw, eff, 1) - weight_transfer_s(m, hw, eff, 1, lora=Lora(rank=8))
        )
        assert got["swap_s"] < was["swap_s"]


def test_a_mixtures_adapters_count_every_expert_its_shared_expert_and_its_dense_layers():
    """DeepSeek-V2-Lite: its first layer's dense MLP of 10944, then 26 layers of 64 experts of
    1408 and a shared expert of 2 x 1408; latent attention's projections have names of their own."""
    m, r = PRESETS["deepseek-v2-lite"], 4
    h = m.hidden_size
    assert lora_params(m, r, ("gate_proj",)) == r * (h + 10944) + 26 * (64 * r * (h + 1408) + r * (h + 2816))
    assert linear_features(m, "kv_b_proj") == (512, 16 * (128 + 128))
    assert lora_params(m, r, ("q_proj", "o_proj")) == 27 * r * ((h + 16 * 192) + (16 * 128 + h))
    with pytest.raises(ValueError, match="kv_a_proj_with_mqa"):
        linear_features(m, "k_proj")
    refused = CliRunner().invoke(main, ["plan", "--model", "deepseek-v2-lite", "--gpus", "16", "--lora-rank", "8"])
    assert refused.exit_code != 0 and "kv_b_proj" in refused.output, refused.output
    planned = CliRunner().invoke(main, ["plan", "--model", "deepseek-v2-lite", "--gpus", "16", "--top", "1"])
    assert planned.exit_code == 0 and "15.7B params, 2.7B active per token" in planned.output, planned.output
