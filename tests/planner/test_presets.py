"""The planner's presets against the parameter counts their model cards publish, and the
shape a Hugging Face config gives for each family (biases, q/k norms, experts)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from asyncflow.planner.io import get_model
from asyncflow.planner.models import PRESETS, shape_from_hf_config

pytestmark = pytest.mark.timeout(30)

PUBLISHED = {  # billions: total, and the activated parameters of a mixture of experts (embeddings included)
    "qwen3-0.6b": (0.6, None),
    "qwen3-1.7b": (1.7, None),
    "qwen3-4b": (4.0, None),
    "qwen3-8b": (8.2, None),
    "qwen3-14b": (14.8, None),
    "qwen3-32b": (32.8, None),
    "qwen3-30b-a3b": (30.5, 3.3),
    "qwen3-235b-a22b": (235.0, 22.0),
    "llama3-1b": (1.24, None),
    "llama3-3b": (3.21, None),
    "llama3-8b": (8.03, None),
    "llama3-70b": (70.6, None),
    "llama3-405b": (405.9, None),
    # Gemma 3: the text model (the 4B, 12B and 27B cards' totals less their 0.4B SigLIP vision tower)
    "gemma3-1b": (1.0, None),
    "gemma3-4b": (3.88, None),
    "gemma3-12b": (11.77, None),
    "gemma3-27b": (27.0, None),
    "mixtral-8x7b": (46.7, 12.9),
    "mixtral-8x22b": (141.0, 39.0),
    "olmoe-1b-7b": (6.9, 1.3),
    "deepseek-v2-lite": (15.7, 2.4),
    "deepseek-v3": (671.0, 37.0),  # without the 14B of its multi-token-prediction module
}
ACTIVE_WITHOUT_LOOKUP = {"deepseek-v2-lite", "deepseek-v3"}  # DeepSeek's activated counts leave the embedding lookup out


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_a_presets_parameter_count_is_its_model_cards(key):
    total, active = PUBLISHED[key]
    shape = get_model(key)
    assert shape.num_params / 1e9 == pytest.approx(total, rel=0.03)
    if active is not None:  # a token goes through its experts only: FLOPs follow the active count
        counted = shape.num_matmul_params if key in ACTIVE_WITHOUT_LOOKUP else shape.num_active_params
        assert counted / 1e9 == pytest.approx(active, rel=0.05)
        assert shape.forward_flops_per_token(0) == 2 * shape.num_matmul_params  # the head's matmul, not the lookup
        assert shape.num_matmul_params <= shape.num_active_params < 0.3 * shape.num_params
    else:
        assert shape.num_active_params == shape.num_params


def test_a_config_json_gives_each_family_its_own_layers():
    base = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100}
    qwen2 = shape_from_hf_config({**base, "model_type": "qwen2"}, "q2", "q2")
    llama = shape_from_hf_config({**base, "model_type": "llama"}, "l", "l")
    qwen3 = shape_from_hf_config({**base, "model_type": "qwen3", "head_dim": 32}, "q3", "q3")
    moe = shape_from_hf_config(
        {**base, "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
        "m",
        "m",
    )
    assert qwen2.attention_bias and not llama.attention_bias and qwen3.qk_norm and not qwen3.attention_bias
    per_layer_biases = 16 * 4 + 2 * 16 * 4  # q, k, v biases: head_dim 16, 4 heads
    assert qwen2.params_per_layer - llama.params_per_layer == per_layer_biases
    assert moe.params_per_layer > moe.active_params_per_layer  # 8 experts held, 2 computed
    assert "llama3-8b" in PRESETS and "qwen3-30b-a3b" in PRESETS


# The shape fields of published config.json files (Hugging Face hub), as they are written
# there: keys the planner reads and some it must not be misled by (Qwen's sliding_window
# with use_sliding_window false, Gemma 3's text_config without the keys it leaves at
# their defaults).
CONFIGS = {
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_window_layers": 36,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "decoder_sparse_step": 1,
        "head_dim": 128,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "vocab_size": 151936,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "model_type": "mixtral",
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "vocab_size": 32000,
    },
    "olmoe-1b-7b": {
        "architectures": ["OlmoeForCausalLM"],
        "attention_bias": False,
        "clip_qkv": None,
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "model_type": "olmoe",
        "num_attention_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 16,
        "num_key_value_heads": 16,
        "tie_word_embeddings": False,
        "vocab_size": 50304,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "first_k_dense_replace": 1,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "model_type": "deepseek_v2",
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "tie_word_embeddings": False,
        "v_head_dim": 128,
        "vocab_size": 102400,
    },
    "deepseek-v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "first_k_dense_replace": 3,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "kv_lora_rank": 512,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_attention_heads": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 61,
        "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "tie_word_embeddings": False,
        "v_head_dim": 128,
        "vocab_size": 129280,
    },
    "gemma3-27b": {  # the image-text checkpoint: the language model's fields nested in text_config
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "query_pre_attn_scalar": 168,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
        "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27},
    },
    "gemma3-4b": {  # text_config leaves heads, kv heads, head_dim and vocabulary at Gemma3TextConfig's defaults
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    },
    "gemma3-1b": {
        "architectures": ["Gemma3ForCausalLM"],
        "head_dim": 256,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 26,
        "num_key_value_heads": 1,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "vocab_size": 262144,
    },
}


def _write(tmp_path, cfg: dict) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


@pytest.mark.parametrize("key", sorted(CONFIGS))
def test_a_published_config_json_gives_its_presets_shape(tmp_path, key):
    """Each family's config.json (dense, Qwen3-MoE's num_experts, Mixtral's num_local_experts,
    OLMoE, DeepSeek's shared experts, dense first layers and latent attention, Gemma 3's
    nested text_config) read from a directory or the file itself is the preset's shape."""
    directory = _write(tmp_path, CONFIGS[key])
    preset = PRESETS[key]
    for source in (directory, directory / "config.json"):
        shape = get_model(str(source))
        assert msgspec.structs.replace(shape, name=preset.name) == preset
        assert shape.name == "model"  # the directory's name: the config has no _name_or_path


def test_a_qwen2_moe_config_counts_its_shared_expert(tmp_path):
    """Qwen1.5-MoE-A2.7B (qwen2_moe): 60 routed experts, 4 per token, and a shared expert of
    5632 every token goes through: 14.3B parameters, 2.7B activated (its model card)."""
    cfg = {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "model_type": "qwen2_moe",
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_attention_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 16,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "sliding_window": 32768,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "vocab_size": 151936,
    }
    shape = get_model(str(_write(tmp_path, cfg) / "config.json"))
    assert shape.num_params / 1e9 == pytest.approx(14.3, rel=0.02)
    assert shape.num_active_params / 1e9 == pytest.approx(2.7, rel=0.05)
    assert shape.attention_bias and shape.sliding_window_layers == 0


def test_a_sliding_window_holds_at_most_the_window_in_its_local_layers():
    """Gemma 3: five of every six layers attend to the last 1024 tokens (512 in the 1B):
    a 32k-token sequence's KV cache is that of ~6.6k tokens in every layer, not 32k. Qwen
    configs name a window they do not use (use_sliding_window false): none counts."""
    gemma, small, qwen = PRESETS["gemma3-27b"], PRESETS["gemma3-1b"], PRESETS["qwen3-8b"]
    assert (gemma.sliding_window, gemma.sliding_window_layers) == (1024, 62 - 10)
    assert (small.sliding_window, small.sliding_window_layers) == (512, 26 - 4)
    full = gemma.kv_bytes_per_token()  # every layer holds every token
    assert gemma.kv_bytes_per_sequence(512) == 512 * full
    held = gemma.kv_bytes_per_sequence(32768) / full
    assert held == pytest.approx((10 * 32768 + 52 * 1024) / 62)
    assert qwen.kv_bytes_per_sequence(32768) == 32768 * qwen.kv_bytes_per_token()
    # attention's FLOPs follow the tokens each layer attends to
    long, short = gemma.forward_flops_per_token(32768), gemma.forward_flops_per_token(1024)
    dense_attention_per_token = 4 * gemma.num_layers * gemma.q_dim
    assert long - short == pytest.approx(dense_attention_per_token * 10 / 62 * (32768 - 1024))


def test_each_family_names_its_sliding_window_layers_its_own_way():
    """Mistral 7B v0.1 windows every layer at 4096, Gemma 2 every other one (and counts its
    four norms a layer: 9.24B), a config's layer_types lists them, and a Qwen config with
    use_sliding_window windows the layers from max_window_layers on."""
    base = {"num_hidden_layers": 8, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 100}
    mistral = {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "vocab_size": 32000,
    }
    gemma2 = {
        "model_type": "gemma2",
        "head_dim": 256,
        "hidden_size": 3584,
        "intermediate_size": 14336,
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "vocab_size": 256000,
    }
    m = shape_from_hf_config(mistral, "m", "m")
    assert (m.sliding_window, m.sliding_window_layers) == (4096, 32)
    assert m.num_params / 1e9 == pytest.approx(7.24, rel=0.01)
    g = shape_from_hf_config(gemma2, "g", "g")
    assert (g.sliding_window, g.sliding_window_layers, g.norms_per_layer, g.tie_word_embeddings) == (4096, 21, 4, True)
    assert g.num_params / 1e9 == pytest.approx(9.24, rel=0.01)
    kinds = ["sliding_attention"] * 3 + ["full_attention"]
    listed = shape_from_hf_config({**base, "model_type": "x", "sliding_window": 64, "layer_types": kinds * 2}, "x", "x")
    assert (listed.sliding_window, listed.sliding_window_layers) == (64, 6)
    qwen = {**base, "model_type": "qwen2", "sliding_window": 64, "max_window_layers": 6}
    assert shape_from_hf_config({**qwen, "use_sliding_window": True}, "q", "q").sliding_window_layers == 2
    assert shape_from_hf_config({**qwen, "use_sliding_window": False}, "q", "q").sliding_window == 0
    v3 = shape_from_hf_config({**mistral, "sliding_window": None}, "v3", "v3")  # Mistral 7B v0.3: no window
    assert (v3.sliding_window, v3.sliding_window_layers) == (0, 0)
