"""Qwen3: Llama's block with an RMSNorm over each head's dims of q and k, before rope."""

from asyncflow.engines.families._block import Block

QWEN3 = Block(qk_norm="head")
