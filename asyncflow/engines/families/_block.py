"""``Block``: how one decoder family wires its Hugging Face layer, as data.

What varies between the families the native engine runs is small and structural:
where the RMSNorms sit (before attention and MLP as in Llama; also after each as in
Gemma; only after each as in OLMo 2), whether a norm scales by ``weight`` or by
``1 + weight`` (Gemma), whether q and k are normalised (per head: Qwen3, Gemma 3; over
the whole projection: OLMo 2), whether q/k/v and gate/up are one fused matrix (Phi-3), and how a mixture-of-experts
router renormalises its top-k weights. (Gemma's sqrt(hidden) embedding scale is its
embedding module's own: calling the module applies it.) A ``Block`` says
exactly these; everything with a number in it (sizes, rope tables and scaling, the
attention scale, soft-caps, sliding windows and which layers have one, which layers
are MoE) is read from the model's config and modules by ``native_model.py``.

Invariants:
- A ``Block`` names Hugging Face module attributes; the weights are the HF modules'
  own parameters, so every family loads and swaps weights by the same names.
- ``refusal`` answers from ``config.json`` alone, before any weight is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

_DYNAMIC_ROPE = ("dynamic", "longrope")
"""Rope types whose tables depend on the sequence length seen: the native engine
precomputes one table per layer type."""


@dataclass(frozen=True)
class Block:
    attn_in_norm: str | None = "input_layernorm"
    """Norm applied to the residual stream before attention (None: none)."""
    attn_out_norm: str | None = None
    """Norm applied to the attention output before it joins the residual."""
    mlp_in_norm: str | None = "post_attention_layernorm"
    """Norm applied to the residual stream before the MLP."""
    mlp_out_norm: str | None = None
    """Norm applied to the MLP output before it joins the residual."""
    norm_offset: float = 0.0
    """RMSNorms scale by ``norm_offset + weight`` (Gemma stores weight - 1: offset 1)."""
    qk_norm: Literal["none", "head", "projection"] = "none"
    """RMSNorm of q and k (``self_attn.q_norm``/``k_norm``): over each head's dims, or
    over the whole projection before it is split into heads."""
    fused_qkv: bool = False
    """``self_attn.qkv_proj`` holds q, k and v in that order (Phi-3)."""
    fused_gate_up: bool = False
    """``mlp.gate_up_proj`` holds gate then up (Phi-3)."""
    moe_renormalize: Literal["always", "config"] = "config"
    """MoE layers: the top-k routing weights are renormalised to sum to 1 always
    (Mixtral), or when ``config.norm_topk_prob`` says so (Qwen MoE, OLMoE)."""

    def refusal(self, config: Mapping[str, Any]) -> str | None:
        """Why the native engine cannot run a model of this family, or None."""
        for rope_type in _rope_types(config):
            if rope_type in _DYNAMIC_ROPE:
                return f"rope_type {rope_type!r} recomputes its rotary tables per sequence length"
        return None


def _rope_types(config: Mapping[str, Any]) -> Iterator[str]:
    """Every rope type a config names: ``rope_parameters`` (flat, or one dict per layer
    type) and the older ``rope_scaling``."""
    for key in ("rope_parameters", "rope_scaling"):
        params = config.get(key)
        if not isinstance(params, Mapping):
            continue
        nested = [v for v in params.values() if isinstance(v, Mapping)]
        for p in nested or [params]:
            rope_type = p.get("rope_type", p.get("type"))
            if rope_type is not None:
                yield str(rope_type)
