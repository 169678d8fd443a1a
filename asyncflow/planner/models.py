"""Model shapes: Qwen2.5-like presets, or the shape in a Hugging Face config (read from
a local config.json by `planner.io.from_hf_config` / `planner.io.get_model`).

Only the shape matters to the cost model: parameter count, FLOPs per token, KV-cache
bytes per token. Parameters are counted from the shape (attention with q/k/v biases,
SwiGLU MLP, RMSNorm, embeddings tied or not), so a preset's count matches the
published checkpoint to within a fraction of a percent.
"""

from __future__ import annotations

import msgspec


class ModelShape(msgspec.Struct, kw_only=True, frozen=True):
    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool = False
    head_dim: int = 0  # 0: hidden_size // num_attention_heads

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim_

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim_

    @property
    def params_per_layer(self) -> int:
        h = self.hidden_size
        attention = h * self.q_dim + self.q_dim + 2 * (h * self.kv_dim + self.kv_dim) + self.q_dim * h
        mlp = 3 * h * self.intermediate_size
        return attention + mlp + 2 * h

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * self.params_per_layer + heads * self.num_embedding_params + self.hidden_size

    @property
    def num_matmul_params(self) -> int:
        """Parameters a token multiplies through (layers and the output head, not the lookup)."""
        return self.num_layers * self.params_per_layer + self.num_embedding_params

    def forward_flops_per_token(self, context_tokens: float) -> float:
        """2 FLOPs per weight, plus attention scores and values over `context_tokens`."""
        attention = 4 * self.num_layers * self.q_dim * context_tokens
        return 2 * self.num_matmul_params + attention

    def prefill_flops(self, prompt_tokens: int) -> float:
        """One prompt's prefill: every token through the layers, only the last through the output head."""
        head = 2 * self.num_embedding_params
        return prompt_tokens * self.forward_flops_per_token(prompt_tokens / 2) - (prompt_tokens - 1) * head

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_dim * dtype_bytes


def _qwen(name, layers, hidden, inter, heads, kv, vocab, tied) -> ModelShape:
    return ModelShape(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_kv_heads=kv,
        vocab_size=vocab,
        tie_word_embeddings=tied,
    )


# Shapes of the Qwen2.5 configs published on the Hugging Face hub.
PRESETS: dict[str, ModelShape] = {
    "0.5b": _qwen("qwen2.5-0.5b", 24, 896, 4864, 14, 2, 151936, True),
    "1.5b": _qwen("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 151936, True),
    "7b": _qwen("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064, False),
    "14b": _qwen("qwen2.5-14b", 48, 5120, 13824, 40, 8, 152064, False),
    "32b": _qwen("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064, False),
    "72b": _qwen("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, False),
}


def shape_from_hf_config(cfg: dict, name: str, source: str) -> ModelShape:
    """The shape in a Hugging Face config (a decoder-only Llama/Qwen2-style one), already
    read into a dict; ``name`` if it has no ``_name_or_path``, ``source`` names it in errors.
    Reading the file: `planner.io.from_hf_config`."""
    missing = [
        k for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in cfg
    ]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)}: the planner needs a decoder-only (Llama/Qwen2-style) config")
    return ModelShape(
        name=cfg.get("_name_or_path") or name,
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        vocab_size=cfg["vocab_size"],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=cfg.get("head_dim") or 0,
    )
