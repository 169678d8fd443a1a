"""Model shapes: presets (Qwen2.5, Qwen3 dense and MoE, Llama 3, Gemma 3, Mixtral, OLMoE,
DeepSeek V2-Lite/V3), or the shape in a Hugging Face config (read from a local
config.json by `planner.io.from_hf_config` / `planner.io.get_model`; `shape_from_hf_config`
reads each family's keys).

Only the shape matters to the cost model: parameter count, FLOPs per token, KV-cache
bytes per sequence. Parameters are counted from the shape (attention with or without
q/k/v biases, q/k norms, multi-head latent attention, a SwiGLU MLP or a mixture of
SwiGLU experts with its router, a shared expert and dense first layers, RMSNorms,
embeddings tied or not), so a preset's count matches the published checkpoint to within
a fraction of a percent (tests/planner/test_presets.py). A mixture of experts holds
every expert (memory, gradients, optimizer state, weight sync: ``num_params``) but a
token goes through ``num_experts_per_tok`` of them (FLOPs: ``num_matmul_params``; the
model card's activated count: ``num_active_params``). A sliding-window layer holds and
attends to at most ``sliding_window`` tokens (``attended_tokens``).

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
    intermediate_size: int  # the dense MLP's (of a mixture of experts: its dense layers', if any)
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    tie_word_embeddings: bool = False
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    attention_bias: bool = True  # q/k/v biases (Qwen2); Llama and Qwen3 have none
    qk_norm: bool = False  # an RMSNorm on q and on k (Qwen3, Gemma 3, OLMoE)
    qk_norm_per_head: bool = True  # of head_dim each (Qwen3, Gemma 3); False: of the whole projection (OLMoE)
    norms_per_layer: int = 2  # RMSNorms of hidden_size per layer: 4 with Gemma's after-attention and after-MLP ones
    # mixture of experts
    num_experts: int = 0  # 0: a dense MLP of intermediate_size; else this many routed experts of moe_intermediate_size
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # an MLP every token goes through beside its experts (DeepSeek, Qwen2-MoE)
    num_dense_layers: int = 0  # layers of a mixture of experts with a dense MLP instead (DeepSeek's first_k_dense_replace)
    # sliding-window attention: sliding_window_layers of the layers attend to the last sliding_window tokens only
    sliding_window: int = 0
    sliding_window_layers: int = 0
    # multi-head latent attention (DeepSeek V2/V3): kv_lora_rank > 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: q is projected from the hidden state directly
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0

    @property
    def head_dim_(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def latent_attention(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key (latent attention: its rope and no-rope parts)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.latent_attention else self.head_dim_

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.latent_attention else self.head_dim_

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim_

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.qk_head_dim

    @property
    def attention_norm_params(self) -> int:
        """The attention's own norms: q/k norms, or latent attention's norms of its compressed q and kv."""
        if self.latent_attention:
            return self.q_lora_rank + self.kv_lora_rank
        if not self.qk_norm:
            return 0
        return 2 * self.head_dim_ if self.qk_norm_per_head else self.q_dim + self.kv_dim

    def _attention_params(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.latent_attention:
            q = h * self.q_lora_rank + self.q_lora_rank * self.q_dim if self.q_lora_rank else h * self.q_dim
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)  # the compressed kv and the shared rope key
            kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + heads * self.v_head_dim * h + self.attention_norm_params
        weights = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        biases = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        return weights + biases + self.attention_norm_params

    def _moe_mlp_params(self, experts: int) -> int:
        """A mixture's MLP with ``experts`` of its routed experts, its shared expert and router."""
        h = self.hidden_size
        routed = experts * 3 * h * self.moe_intermediate_size
        return routed + 3 * h * self.shared_expert_intermediate_size + h * self.num_experts

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.num_experts else 0

    @property
    def dense_layer_params(self) -> int:
        return self._attention_params() + 3 * self.hidden_size * self.intermediate_size + self.norms_per_layer * self.hidden_size

    def _moe_layer_params(self, experts: int) -> int:
        return self._attention_params() + self._moe_mlp_params(experts) + self.norms_per_layer * self.hidden_size

    @property
    def params_per_layer(self) -> int:
        """Every parameter of a decoder layer (all experts; the larger of a mixture's dense and expert layers)."""
        if not self.num_experts:
            return self.dense_layer_params
        moe = self._moe_layer_params(self.num_experts)
        return max(moe, self.dense_layer_params) if self.num_dense_layers else moe

    @property
    def active_params_per_layer(self) -> int:
        """The parameters of a layer one token goes through (of a mixture's expert layer: its
        ``num_experts_per_tok`` experts and the shared one)."""
        if not self.num_experts:
            return self.dense_layer_params
        return self._moe_layer_params(self.num_experts_per_tok)

    @property
    def num_embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _layers_params(self, experts: int) -> int:
        dense = self.num_layers - self.num_moe_layers
        return dense * self.dense_layer_params + self.num_moe_layers * self._moe_layer_params(experts)

    @property
    def num_params(self) -> int:
        """Every parameter: what the weights, gradients, optimizer state and a weight sync hold."""
        heads = 1 if self.tie_word_embeddings else 2
        return self._layers_params(self.num_experts) + heads * self.num_embedding_params + self.hidden_size

    @property
    def num_active_params(self) -> int:
        """The parameters one token touches, counted as a model card counts "activated"
        parameters (embeddings and output head included); ``num_params`` for a dense model."""
        heads = 1 if self.tie_word_embeddings else 2
        return self._layers_params(self.num_experts_per_tok) + heads * self.num_embedding_params + self.hidden_size

    @property
    def num_matmul_params(self) -> int:
        """Parameters a token multiplies through (layers, its experts only, and the output
        head, not the lookup): what FLOPs count."""
        return self._layers_params(self.num_experts_per_tok) + self.num_embedding_params

    @property
    def routed_expert_params(self) -> int:
        """Every routed expert's weights, all layers (0 for a dense model)."""
        return self.num_moe_layers * self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    def params_read(self, tokens: float) -> float:
        """The weights a forward of ``tokens`` tokens reads (a decode iteration of a batch):
        every weight of a dense model; of a mixture of experts, each routed expert with the
        chance that one of the tokens picks it, 1 - (1 - k/E)^tokens (routing taken as
        uniform): about the active parameters for one token, all of them for hundreds."""
        if not self.num_experts:
            return self.num_params
        untouched = (1 - self.num_experts_per_tok / self.num_experts) ** max(tokens, 1.0)
        return self.num_params - self.routed_expert_params * untouched

    @property
    def active_intermediate_size(self) -> int:
        """The MLP width a token's activations take: intermediate_size, or its experts' and
        the shared expert's together (the larger, with dense layers too)."""
        if not self.num_experts:
            return self.intermediate_size
        moe = self.num_experts_per_tok * self.moe_intermediate_size + self.shared_expert_intermediate_size
        return max(moe, self.intermediate_size) if self.num_dense_layers else moe

    def attended_tokens(self, context_tokens: float) -> float:
        """Tokens of a ``context_tokens`` context that the layers together attend to (and hold
        in the KV cache): every one in a global layer, at most the window in a sliding one."""
        local = self.sliding_window_layers if self.sliding_window else 0
        return (self.num_layers - local) * context_tokens + local * min(context_tokens, self.sliding_window)

    def forward_flops_per_token(self, context_tokens: float) -> float:
        """2 FLOPs per weight a token multiplies through (its experts only), plus attention
        scores and values over `context_tokens` (the window's in a sliding layer)."""
        per_context_token = 2 * self.num_attention_heads * (self.qk_head_dim + self.value_head_dim)
        return 2 * self.num_matmul_params + per_context_token * self.attended_tokens(context_tokens)

    def prefill_flops(self, prompt_tokens: int) -> float:
        """One prompt's prefill: every token through the layers, only the last through the output head."""
        head = 2 * self.num_embedding_params
        return prompt_tokens * self.forward_flops_per_token(prompt_tokens / 2) - (prompt_tokens - 1) * head

    @property
    def kv_elements_per_token_layer(self) -> int:
        """K and V of every kv head; latent attention caches its compressed kv and rope key instead."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.latent_attention else 2 * self.kv_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """A token's KV cache in every layer (a sliding window's layers hold fewer tokens:
        ``kv_bytes_per_sequence``)."""
        return self.num_layers * self.kv_elements_per_token_layer * dtype_bytes

    def kv_bytes_per_sequence(self, tokens: float, dtype_bytes: int = 2) -> float:
        """The KV cache of one sequence of ``tokens`` tokens (at most the window in a sliding layer)."""
        return self.attended_tokens(tokens) * self.kv_elements_per_token_layer * dtype_bytes


class Lora(msgspec.Struct, kw_only=True, frozen=True):
    """What LoRA trains (``[train.engine.lora]``); ``rank = 0``: off, every parameter trains."""

    rank: int = 0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    train_norms: bool = False

    @classmethod
    def of(cls, spec) -> Lora:
        """From a config's ``LoraConfig`` (``train.engine.lora``)."""
        return cls(rank=spec.rank, target_modules=tuple(spec.target_modules), train_norms=spec.train_norms)


def _attention_linears(model: ModelShape) -> dict[str, tuple[int, int]]:
    h, q = model.hidden_size, model.q_dim
    if model.latent_attention:
        heads, latent = model.num_attention_heads, model.kv_lora_rank
        queries = (
            {"q_a_proj": (h, model.q_lora_rank), "q_b_proj": (model.q_lora_rank, q)} if model.q_lora_rank else {"q_proj": (h, q)}
        )
        return {
            **queries,
            "kv_a_proj_with_mqa": (h, latent + model.qk_rope_head_dim),
            "kv_b_proj": (latent, heads * (model.qk_nope_head_dim + model.v_head_dim)),
            "o_proj": (heads * model.v_head_dim, h),
        }
    return {"q_proj": (h, q), "k_proj": (h, model.kv_dim), "v_proj": (h, model.kv_dim), "o_proj": (q, h)}


def _mlp_linears(hidden: int, inter: int) -> dict[str, tuple[int, int]]:
    return {"gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}


def _layer_linears(model: ModelShape) -> list[tuple[int, dict[str, list[tuple[int, int]]]]]:
    """Per kind of decoder layer: how many layers, and each linear layer's name and the
    (in_features, out_features) of its copies (a mixture: one per expert, and the shared one)."""
    h = model.hidden_size
    attention = {name: [shape] for name, shape in _attention_linears(model).items()}
    dense = {**attention, **{name: [shape] for name, shape in _mlp_linears(h, model.intermediate_size).items()}}
    if not model.num_experts:
        return [(model.num_layers, dense)]
    routed = _mlp_linears(h, model.moe_intermediate_size)
    shared = _mlp_linears(h, model.shared_expert_intermediate_size)
    moe = {
        **attention,
        **{
            name: [routed[name]] * model.num_experts + ([shared[name]] if model.shared_expert_intermediate_size else [])
            for name in routed
        },
    }
    return [(model.num_dense_layers, dense), (model.num_moe_layers, moe)]


def linear_features(model: ModelShape, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a decoder block's linear layer ``module`` (q_proj ... down_proj;
    of one expert in a mixture of experts; latent attention's q_a_proj ... kv_b_proj)."""
    count, linears = _layer_linears(model)[-1]
    if module not in linears:
        raise ValueError(f"{module!r} is not a linear layer of a decoder block: one of {', '.join(linears)}")
    return linears[module][0]


def _sum_over_linears(model: ModelShape, target_modules: tuple[str, ...], size) -> int:
    return sum(
        count * sum(size(i, o) for m in target_modules for i, o in linears.get(m, [])) for count, linears in _layer_linears(model)
    )


def lora_params(model: ModelShape, rank: int, target_modules: tuple[str, ...]) -> int:
    """Parameters of the LoRA adapters, from the shape alone (no model is built): each
    target module of each layer gets A [rank, in_features] and B [out_features, rank],
    so rank x (in_features + out_features) per module per layer (per expert of a
    mixture, and its shared expert). 0 when ``rank`` is 0."""
    return _sum_over_linears(model, target_modules, lambda i, o: rank * (i + o))


def adapted_params(model: ModelShape, target_modules: tuple[str, ...]) -> int:
    """Parameters of the weights the target modules name, every layer (and expert)."""
    return _sum_over_linears(model, target_modules, lambda i, o: i * o)


def norm_params(model: ModelShape) -> int:
    """RMSNorm weights: ``norms_per_layer`` per layer and the final one, ``hidden_size`` each
    (and the attention's own: Qwen3's q/k norms of ``head_dim``, ...)."""
    per_layer = model.norms_per_layer * model.hidden_size + model.attention_norm_params
    return model.num_layers * per_layer + model.hidden_size


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


def _gemma3(name, layers, hidden, inter, heads, kv, head_dim, vocab, window) -> ModelShape:
    """Gemma 3's language model: tied embeddings, q/k norms, four norms a layer, and five
    of every six layers attending to the last ``window`` tokens."""
    local = layers - layers // GEMMA3_GLOBAL_EVERY
    return _shape(
        name,
        layers,
        hidden,
        inter,
        heads,
        kv,
        vocab,
        True,
        head_dim=head_dim,
        attention_bias=False,
        qk_norm=True,
        norms_per_layer=4,
        sliding_window=window,
        sliding_window_layers=local,
    )


def _mixtral(name, layers, hidden, inter, heads, kv, vocab, experts, top_k) -> ModelShape:
    """Mixtral: its experts are intermediate_size wide (num_local_experts of them)."""
    moe = {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": inter}
    return _shape(name, layers, hidden, inter, heads, kv, vocab, False, attention_bias=False, **moe)


def _deepseek(name, layers, hidden, inter, heads, vocab, dense, experts, top_k, moe_inter, shared, q_lora) -> ModelShape:
    """DeepSeek V2/V3: latent attention (kv rank 512, rope 64, no-rope 128, values 128), ``dense``
    first layers with a dense MLP, ``shared`` experts beside the routed ones in the others."""
    return _shape(
        name,
        layers,
        hidden,
        inter,
        heads,
        heads,
        vocab,
        False,
        attention_bias=False,
        num_experts=experts,
        num_experts_per_tok=top_k,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared * moe_inter,
        num_dense_layers=dense,
        kv_lora_rank=512,
        q_lora_rank=q_lora,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
    )


GEMMA3_GLOBAL_EVERY = 6  # Gemma 3: every sixth layer attends globally (sliding_window_pattern)

# The values of the config.json files published on the Hugging Face hub (layers, hidden
# size, MLP width, attention heads, kv heads, head_dim, vocabulary, tied embeddings;
# experts, experts per token and their width): Qwen2.5 (by size alone, the first
# presets), Qwen3 dense and mixture of experts, Llama 3.1 / 3.2, Gemma 3 (the language
# model of the image-text checkpoints), Mixtral v0.1, OLMoE-1B-7B-0924, DeepSeek V2-Lite
# and V3. tests/planner/test_presets.py checks their counts against the model cards' and
# that each family's config.json gives the preset's shape.
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
    "gemma3-1b": _gemma3("gemma3-1b", 26, 1152, 6912, 4, 1, 256, 262144, 512),
    "gemma3-4b": _gemma3("gemma3-4b", 34, 2560, 10240, 8, 4, 256, 262208, 1024),
    "gemma3-12b": _gemma3("gemma3-12b", 48, 3840, 15360, 16, 8, 256, 262208, 1024),
    "gemma3-27b": _gemma3("gemma3-27b", 62, 5376, 21504, 32, 16, 128, 262208, 1024),
    "mixtral-8x7b": _mixtral("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 8, 2),
    "mixtral-8x22b": _mixtral("mixtral-8x22b", 56, 6144, 16384, 48, 8, 32000, 8, 2),
    "olmoe-1b-7b": _shape(
        "olmoe-1b-7b",
        16,
        2048,
        1024,
        16,
        16,
        50304,
        False,
        attention_bias=False,
        qk_norm=True,
        qk_norm_per_head=False,
        num_experts=64,
        num_experts_per_tok=8,
        moe_intermediate_size=1024,
    ),
    "deepseek-v2-lite": _deepseek("deepseek-v2-lite", 27, 2048, 10944, 16, 102400, 1, 64, 6, 1408, 2, 0),
    "deepseek-v3": _deepseek("deepseek-v3", 61, 7168, 18432, 128, 129280, 3, 256, 8, 2048, 1, 1536),
}

# Gemma3TextConfig's defaults (transformers), for the keys a published Gemma 3 text_config leaves out
_GEMMA3_TEXT_DEFAULTS: dict[str, object] = {
    "vocab_size": 262208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": GEMMA3_GLOBAL_EVERY,
    "tie_word_embeddings": True,
}
_DEFAULTS: dict[str, dict[str, object]] = {"gemma3_text": _GEMMA3_TEXT_DEFAULTS, "gemma2": {"tie_word_embeddings": True}}


def _language_model(cfg: dict) -> dict:
    """The language model's fields: a multimodal config (Gemma 3) nests them in
    ``text_config``; the family's defaults fill in what the file leaves out."""
    if "text_config" in cfg and "num_hidden_layers" not in cfg:
        outer = {k: cfg[k] for k in ("_name_or_path", "tie_word_embeddings") if k in cfg}
        inner = cfg["text_config"]
        model_type = inner.get("model_type") or f"{cfg.get('model_type', '')}_text"
        cfg = {**outer, **inner, "model_type": model_type}
    return {**_DEFAULTS.get(str(cfg.get("model_type", "")), {}), **cfg}


def _sliding_layers(cfg: dict, model_type: str, layers: int) -> int:
    """How many layers attend through the sliding window (0: none, or no window)."""
    if not cfg.get("sliding_window"):
        return 0
    if isinstance(cfg.get("layer_types"), list):  # newer configs name each layer's attention
        return sum(1 for kind in cfg["layer_types"] if kind == "sliding_attention")
    if model_type.startswith("gemma3"):  # every sliding_window_pattern-th layer is global
        return layers - layers // int(cfg.get("sliding_window_pattern") or GEMMA3_GLOBAL_EVERY)
    if model_type == "gemma2":  # alternating, the first local
        return (layers + 1) // 2
    if model_type in ("mistral", "mixtral"):
        return layers
    if cfg.get("use_sliding_window"):  # Qwen2/3: the layers from max_window_layers on
        return max(0, layers - int(cfg.get("max_window_layers") or 0))
    return 0


def _dense_layers(cfg: dict, layers: int) -> int:
    """Layers of a mixture of experts with a dense MLP: DeepSeek's first_k_dense_replace
    (and moe_layer_freq), Qwen-MoE's mlp_only_layers (and decoder_sparse_step)."""
    first = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = set(cfg.get("mlp_only_layers") or ())
    moe = [i for i in range(layers) if i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in only]
    return layers - len(moe)


def shape_from_hf_config(cfg: dict, name: str, source: str) -> ModelShape:
    """The shape in a Hugging Face config (a decoder-only one: Llama, Qwen2/3 and their
    mixtures of experts, Mistral/Mixtral, Gemma 2/3, OLMoE, DeepSeek V2/V3), already read
    into a dict; ``name`` if it has no ``_name_or_path``, ``source`` names it in errors.
    Reading the file: `planner.io.from_hf_config`."""
    cfg = _language_model(cfg)
    missing = [
        k for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size") if k not in cfg
    ]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)}: the planner needs a decoder-only (Llama/Qwen2-style) config")
    model_type = str(cfg.get("model_type", ""))
    layers = int(cfg["num_hidden_layers"])
    experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    moe_inter = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"]) if experts else 0
    # DeepSeek: n_shared_experts of the routed experts' width; Qwen2-MoE: one of its own width
    shared = int(cfg.get("n_shared_experts") or 0) * moe_inter or int(cfg.get("shared_expert_intermediate_size") or 0)
    latent = int(cfg.get("kv_lora_rank") or 0)
    projection_qk_norm = model_type in ("olmoe", "olmo2")
    return ModelShape(
        name=cfg.get("_name_or_path") or name,
        num_layers=layers,
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_attention_heads=cfg["num_attention_heads"],
        num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        vocab_size=cfg["vocab_size"],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        head_dim=cfg.get("head_dim") or 0,
        # Qwen2 always has q/k/v biases (its config has no key for them); Llama and Qwen3 say so, default none;
        # a config without model_type counts them (the Qwen2 layout, the planner's first)
        attention_bias=model_type in ("qwen2", "qwen2_moe", "") or bool(cfg.get("attention_bias", False)),
        qk_norm=model_type.startswith(("qwen3", "gemma3")) or projection_qk_norm,
        qk_norm_per_head=not projection_qk_norm,
        norms_per_layer=4 if model_type.startswith(("gemma2", "gemma3")) else 2,
        num_experts=experts,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=moe_inter,
        shared_expert_intermediate_size=shared if experts else 0,
        num_dense_layers=_dense_layers(cfg, layers) if experts else 0,
        sliding_window=int(cfg.get("sliding_window") or 0) if _sliding_layers(cfg, model_type, layers) else 0,
        sliding_window_layers=_sliding_layers(cfg, model_type, layers),
        kv_lora_rank=latent,
        q_lora_rank=int(cfg.get("q_lora_rank") or 0) if latent else 0,
        qk_nope_head_dim=int(cfg.get("qk_nope_head_dim") or 0) if latent else 0,
        qk_rope_head_dim=int(cfg.get("qk_rope_head_dim") or 0) if latent else 0,
        v_head_dim=int(cfg.get("v_head_dim") or 0) if latent else 0,
    )
