"""Gemma 2 and Gemma 3: RMSNorms that scale by (1 + weight), before and after both
attention and MLP; a GeGLU MLP (tanh GELU, the config's ``hidden_activation``); the
embedding scaled by sqrt(hidden). Read from the config: the attention scale
(``query_pre_attn_scalar``), attention logit soft-capping (Gemma 2), final logit
soft-capping, sliding-window layers interleaved with global ones (``layer_types``),
and Gemma 3's own rope base per layer type. Gemma 3 adds q/k norm per head. The
embedding module applies the sqrt(hidden) scale itself."""

from asyncflow.engines.families._block import Block

_SANDWICH: dict = dict(
    attn_in_norm="input_layernorm",
    attn_out_norm="post_attention_layernorm",
    mlp_in_norm="pre_feedforward_layernorm",
    mlp_out_norm="post_feedforward_layernorm",
    norm_offset=1.0,
)

GEMMA2 = Block(**_SANDWICH)
GEMMA3 = Block(**_SANDWICH, qk_norm="head")
