"""The planner's presets against the parameter counts their model cards publish, and the
shape a Hugging Face config gives for each family (biases, q/k norms, experts)."""

from __future__ import annotations

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
}


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_a_presets_parameter_count_is_its_model_cards(key):
    total, active = PUBLISHED[key]
    shape = get_model(key)
    assert shape.num_params / 1e9 == pytest.approx(total, rel=0.03)
    if active is not None:  # a token goes through its experts only: FLOPs follow the active count
        assert (shape.num_matmul_params + shape.num_embedding_params * (not shape.tie_word_embeddings)) / 1e9 == (
            pytest.approx(active, rel=0.05)
        )
        assert shape.forward_flops_per_token(0) < 0.15 * 2 * shape.num_params


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
