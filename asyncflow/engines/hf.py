"""Load a causal LM and its tokenizer from a local Hugging Face directory.

Invariants:
- Only local directories: nothing is downloaded (``local_files_only``). A hub id in the
  config was resolved to its snapshot directory by the driver (``config/hub.py``).
- Any causal LM that ``AutoModelForCausalLM`` builds is accepted (``causal_lm_refusal``
  says why not otherwise: an encoder-decoder, a model type without a causal LM head).
  Which of them the native rollout engine runs is ``engines/families``' answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)
"""Files beside the weights that a checkpoint copies from the model it started from."""


def _check_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face model directory (no config.json); "
            "point model_dir at a local directory saved with save_pretrained"
        )
    return path


def causal_lm_refusal(config: Mapping[str, Any]) -> str | None:
    """Why a model (``config.json`` as a dict) cannot be trained as a causal LM, or None.
    Reads no weights and needs no torch model: the driver asks before any process starts.
    An encoder (BERT, RoBERTa ...) has a causal LM class in transformers, which is one only
    with ``is_decoder = true``; without it the model was trained to fill in masked tokens."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_MASKED_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if not model_type:
        return "config.json names no model_type, so transformers cannot tell which model it is; give a directory saved with save_pretrained"
    if config.get("is_encoder_decoder"):
        return f"model_type {model_type!r} is an encoder-decoder; RL here trains decoder-only causal LMs"
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.get("is_decoder"):
        return (
            f"model_type {model_type!r} is an encoder (a masked LM; its causal LM class needs is_decoder = true); "
            "use a decoder-only causal LM checkpoint"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and "AutoModelForCausalLM" in (config.get("auto_map") or {}):
        return (
            f"model_type {model_type!r} is the repository's own code (auto_map), which transformers runs only with "
            "trust_remote_code, and asyncflow runs no code a model brings; use a model transformers implements"
        )
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return (
            f"model_type {model_type!r} has no causal LM head in transformers (AutoModelForCausalLM does not build it); "
            "use a decoder-only causal LM checkpoint"
        )
    return None


def load_config(model_dir: str | Path) -> PretrainedConfig:
    path = _check_dir(model_dir)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    reason = causal_lm_refusal(config.to_dict())
    if reason is not None:
        raise ValueError(f"{path}: {reason}")
    return config


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.nn.Module:
    """The causal LM in eval mode on ``device``."""
    path = _check_dir(model_dir)
    load_config(path)
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)  # a PreTrainedModel
    return model.to(device).eval()


def load_tokenizer(model_dir: str | Path):
    """The tokenizer (with its chat template) saved beside the model."""
    return AutoTokenizer.from_pretrained(_check_dir(model_dir), local_files_only=True)
