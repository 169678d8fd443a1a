"""The decoder families the native rollout engine implements: one small module each,
one line each in ``FAMILIES``.

A family is a ``Block`` (``_block.py``): which norms sit where and how they scale,
whether q/k are normalised, whether projections are fused, how an MoE router
renormalises. Sizes, rope, sliding windows, soft-caps and which layers are MoE are
read from the model's own config and modules; the family only says how its Hugging
Face modules are wired. A new family is one small module and one line here.

``why_not_native(config)`` answers before any model is loaded (it reads
``config.json``'s dict): None when the native engine runs the model, else the reason;
``rollout.engine.type = "auto"`` then takes the ``hf`` engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asyncflow.engines.families._block import Block
from asyncflow.engines.families.gemma import GEMMA2, GEMMA3
from asyncflow.engines.families.llama import LLAMA
from asyncflow.engines.families.moe import MIXTRAL, OLMOE, QWEN3_MOE, QWEN_MOE
from asyncflow.engines.families.olmo2 import OLMO2
from asyncflow.engines.families.phi3 import PHI3
from asyncflow.engines.families.qwen3 import QWEN3

FAMILIES: dict[str, Block] = {
    "llama": LLAMA,
    "qwen2": LLAMA,
    "mistral": LLAMA,
    "smollm3": LLAMA,
    "qwen3": QWEN3,
    "gemma2": GEMMA2,
    "gemma3_text": GEMMA3,
    "phi3": PHI3,
    "olmo2": OLMO2,
    "olmo3": OLMO2,
    "qwen3_moe": QWEN3_MOE,
    "mixtral": MIXTRAL,
    "olmoe": OLMOE,
    "qwen2_moe": QWEN_MOE,
}
"""``config.json``'s ``model_type`` -> its block."""

__all__ = ["FAMILIES", "Block", "block_of", "why_not_native"]


def why_not_native(config: Mapping[str, Any]) -> str | None:
    """None when the native engine implements this model (``config.json`` as a dict);
    else why not, in words a user can act on."""
    model_type = config.get("model_type")
    block = FAMILIES.get(str(model_type))
    if block is None:
        return f"model_type {model_type!r} is not one the native engine implements ({', '.join(sorted(FAMILIES))})"
    return block.refusal(config)


def block_of(config: Mapping[str, Any]) -> Block:
    """The block of a model the native engine runs; ValueError naming the reason otherwise."""
    reason = why_not_native(config)
    if reason is not None:
        raise ValueError(f'the native engine cannot run this model: {reason}; set rollout.engine.type = "hf" (or "auto")')
    return FAMILIES[str(config["model_type"])]
