"""Mixture-of-experts families: softmax over the router's logits, the top k experts per
token, their weights renormalised (Mixtral always; Qwen MoE and OLMoE when
``norm_topk_prob``), a shared expert gated by a sigmoid where the layer has one
(Qwen2-MoE). Which layers are MoE (``mlp_only_layers``, ``decoder_sparse_step``) is read
from the modules: a layer whose MLP has ``experts``."""

from asyncflow.engines.families._block import Block

QWEN_MOE = Block()
"""Qwen2-MoE (shared expert) and Qwen3-MoE (q/k norm: ``QWEN3_MOE``)."""
QWEN3_MOE = Block(qk_norm="head")
MIXTRAL = Block(moe_renormalize="always")
OLMOE = Block(qk_norm="projection")
