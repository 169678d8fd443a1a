"""Llama and the families that share its block: pre-norm RMSNorm, rotary q/k, grouped
query attention, a SwiGLU MLP. Qwen2 adds q/k/v biases (read from the modules),
Mistral a sliding window, SmolLM3 layers without rope (``self_attn.use_rope``): all
read from the config and modules, so the block is Llama's."""

from asyncflow.engines.families._block import Block

LLAMA = Block()
