"""Tiny random models of every decoder family the native engine implements, built with
transformers' own config classes: the family's real structure (head counts and GQA
ratio, an explicit head_dim where the family sets one, its norms, rope scaling, sliding
windows shorter than the test prompts, soft-caps, MoE routing with shared experts) at
a small width, and the character tokenizer of ``toy/tiny.py``.

Weights are drawn at a scale that makes each family's features matter (transformers'
own init leaves norms at exactly 1 or 0 and logits nearly flat): matrices N(0, 0.15),
vectors (norm weights, biases) their init plus N(0, 0.1). So a norm read as ``w``
where the family means ``1 + w``, or a window one position off, moves the log-probs by
far more than the tests' 1e-4.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from asyncflow.engines.prompts import CHARS
from asyncflow.toy.tiny import SPECIALS, build_char_tokenizer

VOCAB = len(SPECIALS) + len(CHARS)
WINDOW = 8
"""Sliding window of the windowed families: shorter than the tests' prompts."""

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def _config(name: str):
    import transformers as t

    c = dict(_COMMON)
    if name == "llama3":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
        return t.LlamaConfig(**c, rope_parameters=rope, tie_word_embeddings=False)
    if name == "qwen2_yarn":
        rope = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0, "original_max_position_embeddings": 32}
        return t.Qwen2Config(**c, rope_parameters=rope, tie_word_embeddings=True)
    if name == "qwen3":  # head_dim set apart from hidden / heads, as Qwen3's (1024 / 16 heads, head_dim 128)
        return t.Qwen3Config(**c, head_dim=32, tie_word_embeddings=True)
    if name == "qwen3_sliding":  # the first layer windowed (max_window_layers), the others global
        return t.Qwen3Config(**c, head_dim=16, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
    if name == "mistral":
        return t.MistralConfig(**c, sliding_window=WINDOW, tie_word_embeddings=False)
    if name == "smollm3":  # the middle layer without rope
        return t.SmolLM3Config(**c, no_rope_layers=[1, 0, 1], tie_word_embeddings=True)
    if name == "gemma2":
        return t.Gemma2Config(
            **c,
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            hidden_activation="gelu_pytorch_tanh",
        )
    if name == "gemma3":  # two local layers (base 10k) then a global one (base 1M), as Gemma 3's 5:1 pattern
        return t.Gemma3TextConfig(
            **c,
            head_dim=32,
            query_pre_attn_scalar=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            final_logit_softcapping=3.0,
        )
    if name == "phi3":  # fused qkv and gate_up, half the head dims rotated
        return t.Phi3Config(**c, partial_rotary_factor=0.5, sliding_window=None, tie_word_embeddings=False)
    if name == "olmo2":
        return t.Olmo2Config(**c, tie_word_embeddings=False)
    if name == "qwen3_moe":  # 8 experts, top 2, renormalised; the last layer dense (mlp_only_layers)
        return t.Qwen3MoeConfig(
            **c,
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[2],
        )
    if name == "mixtral":
        return t.MixtralConfig(**c, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)
    if name == "olmoe":  # top-k weights not renormalised
        return t.OlmoeConfig(**c, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False)
    if name == "qwen2_moe":  # a shared expert beside the routed ones, gated by a sigmoid
        return t.Qwen2MoeConfig(
            **c,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
            norm_topk_prob=False,
        )
    raise KeyError(name)


FAMILIES = (
    "llama3",
    "qwen2_yarn",
    "qwen3",
    "qwen3_sliding",
    "mistral",
    "smollm3",
    "gemma2",
    "gemma3",
    "phi3",
    "olmo2",
    "qwen3_moe",
    "mixtral",
    "olmoe",
    "qwen2_moe",
)
WINDOWED = ("qwen3_sliding", "mistral", "gemma2", "gemma3")
MOE = ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe")


@torch.no_grad()
def _draw(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _, p in model.named_parameters():
        if p.dim() >= 2:
            p.copy_(torch.randn(p.shape, generator=g) * 0.15)
        else:
            p.add_(torch.randn(p.shape, generator=g) * 0.1)


def make_family_model(out_dir: str | Path, name: str, seed: int = 0) -> Path:
    """A ``name`` (``FAMILIES``) model directory in float32 with the tiny tokenizer."""
    from transformers import AutoModelForCausalLM

    config = _config(name)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _draw(model, seed)
    out = Path(out_dir)
    model.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return out
