"""Phi-3 and Phi-4: Llama's block with q/k/v in one matrix (``qkv_proj``) and gate/up
in one (``gate_up_proj``); partial rotary (``partial_rotary_factor``) and the sliding
window come from the config."""

from asyncflow.engines.families._block import Block

PHI3 = Block(fused_qkv=True, fused_gate_up=True)
