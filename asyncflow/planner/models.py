"""Model shapes: presets (Qwen2.5, Qwen3 dense and MoE, Llama 3), or the shape in a
Hugging Face config (read from a local config.json by `planner.io.from_hf_config` /
`planner.io.get_model`).

Only the shape matters to the cost model: parameter count, FLOPs per token, KV-cache
bytes per token. Parameters are counted from the shape (attention with or without q/k/v
biases, Qwen3's q/k norms, a SwiGLU MLP or a mixture of SwiGLU experts with its router,
RMSNorm, embeddings tied or not), so a preset's count matches the published checkpoint
to within a fraction of a percent (tests/planner/test_presets.py). A mixture of experts
holds every expert (memory, weight sync: ``num_params``) but a token goes through
``num_experts_per_tok`` of them (FLOPs: ``num_matmul_params``).

LoRA (`Lora`, from ``[train.engine.lora]``) changes what trains, not the shape: the
adapters add `lora_params` weights, and only they (with ``train_norms``, the RMSNorm
weights too) have gradients and optimizer state and travel at a weight sync
(`trainable_params`); the frozen base holds its weights only.
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
    attention_bias: bool = True  # q/k/v biases (Qwen2); Llama and Qwen3 have none
    qk_norm: bool = False  # an RMSNorm of head_dim on q and on k (Qwen3)
    num_experts: int = 0  # 0: a dense MLP of intermediate_size; else this many experts of moe_intermediate_size
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim_

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim_

    def _attention_params(self) -> int:
        h = self.hidden_size
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        biases = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        return weights + biases + (2 * self.head_dim_ if self.qk_norm else 0)

    def _mlp_params(self, experts: int) -> int:
        if not self.num_experts:
            return 3 * self.hidden_size * self.intermediate_size
        return experts * 3 * self.hidden_size * self.moe_intermediate_size + self.hidden_size * self.num_experts

    @property
    def params_per_layer(self) -> int:
        """Every parameter of a decoder layer (all experts)."""
        return self._attention_params() + self._mlp_params(self.num_experts) + 2 * self.hidden_size

    @property
    def active_params_per_layer(self) -> int:
        """The parameters of a layer one token goes through (its ``num_experts_per_tok`` experts)."""
        return self._attention_params() + self._mlp_params(self.num_experts_per_tok) + 2 * self.hidden_size

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        heads = 1 if self.tie_word_embeddings else 2
        return self.num_layers * self.params_per_layer + heads * self.num_embedding_params + self.hidden_size

    @property
    def num_matmul_params(self) -> int:
        """Parameters a token multiplies through (layers, its experts only, and the output
        head, not the lookup)."""
        return self.num_layers * self.active_params_per_layer + self.num_embedding_params

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


class Lora(msgspec.Struct, kw_only=True, frozen=True):
    """What LoRA trains (``[train.engine.lora]``); ``rank = 0``: off, every parameter trains."""

    rank: int = 0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    train_norms: bool = False

    @classmethod
    def of(cls, spec) -> Lora:
        """From a config's ``LoraConfig`` (``train.engine.lora``)."""
        return cls(rank=spec.rank, target_modules=tuple(spec.target_modules), train_norms=spec.train_norms)


def linear_features(model: ModelShape, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a decoder block's linear layer ``module`` (q_proj ... down_proj;
    of one expert in a mixture of experts)."""
    h, q, kv = model.hidden_size, model.q_dim, model.kv_dim
    inter = model.moe_intermediate_size if model.num_experts else model.intermediate_size
    shapes = {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
    if module not in shapes:
        raise ValueError(f"{module!r} is not a linear layer of a decoder block: one of {', '.join(shapes)}")
    return shapes[module]


def lora_params(model: ModelShape, rank: int, target_modules: tuple[str, ...]) -> int:
    """Parameters of the LoRA adapters, from the shape alone (no model is built): each
    target module of each layer gets A [rank, in_features] and B [out_features, rank],
    so rank x (in_features + out_features) per module per layer. 0 when ``rank`` is 0."""
    mlp = ("gate_proj", "up_proj", "down_proj")
    copies = {m: model.num_experts if model.num_experts and m in mlp else 1 for m in target_modules}  # one per expert
    per_layer = sum(copies[m] * rank * sum(linear_features(model, m)) for m in target_modules)
    return model.num_layers * per_layer


def norm_params(model: ModelShape) -> int:
    """RMSNorm weights: two per layer and the final one, ``hidden_size`` each (and Qwen3's
    q/k norms, ``head_dim`` each)."""
    qk = 2 * model.head_dim_ if model.qk_norm else 0
    return (2 * model.num_layers + 1) * model.hidden_size + model.num_layers * qk


def total_params(model: ModelShape, lora: Lora) -> int:
    """Every weight the trainer holds: the model's, plus the adapters with LoRA."""
    return model.num_params + lora_params(model, lora.rank, lora.target_modules)


def trainable_params(model: ModelShape, lora: Lora) -> int:
    """The parameters with gradients and optimizer state, which are also what a weight sync
    sends: all of them without LoRA; with it the adapters (+ the norms with ``train_norms``)."""
    if lora.rank == 0:
        return model.num_params
    return lora_params(model, lora.rank, lora.target_modules) + (norm_params(model) if lora.train_norms else 0)


def _shape(name, layers, hidden, inter, heads, kv, vocab, tied, **more) -> ModelShape:
    """A preset: the shape fields in a config.json's order, then the family's own."""
    return ModelShape(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_kv_heads=kv,
        vocab_size=vocab,
        tie_word_embeddings=tied,
        **more,
    )


def _qwen(name, layers, hidden, inter, heads, kv, vocab, tied) -> ModelShape:
    return _shape(name, layers, hidden, inter, heads, kv, vocab, tied)


def _llama(name, layers, hidden, inter, heads, kv, tied, head_dim=0) -> ModelShape:
    return _shape(name, layers, hidden, inter, heads, kv, 128256, tied, head_dim=head_dim, attention_bias=False)


def _qwen3(name, layers, hidden, inter, heads, kv, tied, experts=0, top_k=0, moe_inter=0) -> ModelShape:
    moe = {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": moe_inter}
    return _shape(name, layers, hidden, inter, heads, kv, 151936, tied, head_dim=128, attention_bias=False, qk_norm=True, **moe)


# Shapes of the configs published on the Hugging Face hub: Qwen2.5 (by size alone, the
# first presets), Qwen3 dense and mixture of experts, Llama 3.1 / 3.2.
PRESETS: dict[str, ModelShape] = {
    "0.5b": _qwen("qwen2.5-0.5b", 24, 896, 4864, 14, 2, 151936, True),
    "1.5b": _qwen("qwen2.5-1.5b", 28, 1536, 8960, 12, 2, 151936, True),
    "7b": _qwen("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064, False),
    "14b": _qwen("qwen2.5-14b", 48, 5120, 13824, 40, 8, 152064, False),
    "32b": _qwen("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064, False),
    "72b": _qwen("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, False),
    "qwen3-0.6b": _qwen3("qwen3-0.6b", 28, 1024, 3072, 16, 8, True),
    "qwen3-1.7b": _qwen3("qwen3-1.7b", 28, 2048, 6144, 16, 8, True),
    "qwen3-4b": _qwen3("qwen3-4b", 36, 2560, 9728, 32, 8, True),
    "qwen3-8b": _qwen3("qwen3-8b", 36, 4096, 12288, 32, 8, False),
    "qwen3-14b": _qwen3("qwen3-14b", 40, 5120, 17408, 40, 8, False),
    "qwen3-32b": _qwen3("qwen3-32b", 64, 5120, 25600, 64, 8, False),
    "qwen3-30b-a3b": _qwen3("qwen3-30b-a3b", 48, 2048, 6144, 32, 4, False, experts=128, top_k=8, moe_inter=768),
    "qwen3-235b-a22b": _qwen3("qwen3-235b-a22b", 94, 4096, 12288, 64, 4, False, experts=128, top_k=8, moe_inter=1536),
    "llama3-1b": _llama("llama3.2-1b", 16, 2048, 8192, 32, 8, True, head_dim=64),
    "llama3-3b": _llama("llama3.2-3b", 28, 3072, 8192, 24, 8, True, head_dim=128),
    "llama3-8b": _llama("llama3.1-8b", 32, 4096, 14336, 32, 8, False),
    "llama3-70b": _llama("llama3.1-70b", 80, 8192, 28672, 64, 8, False),
    "llama3-405b": _llama("llama3.1-405b", 126, 16384, 53248, 128, 8, False),
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
    model_type = str(cfg.get("model_type", ""))
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)  # Qwen3-MoE / Mixtral
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
        # Qwen2 always has q/k/v biases (its config has no key for them); Llama and Qwen3 say so, default none;
        # a config without model_type counts them (the Qwen2 layout, the planner's first)
        attention_bias=model_type in ("qwen2", "") or bool(cfg.get("attention_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        num_experts=experts,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]) if experts else 0,
    )
