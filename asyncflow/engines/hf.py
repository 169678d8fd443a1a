"""Load a causal LM and its tokenizer from a local Hugging Face directory.

Invariants:
- Only local directories: nothing is downloaded (``local_files_only``).
- Only the decoder families the native engine implements are accepted
  (``SUPPORTED_ARCHITECTURES``); others fail here with the list, not later.
"""

from __future__ import annotations

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

SUPPORTED_ARCHITECTURES = ("Qwen2ForCausalLM", "LlamaForCausalLM")
"""Same block layout (pre-norm, RoPE, GQA, SwiGLU); Qwen2 adds q/k/v biases."""


def _check_dir(model_dir: str | Path) -> Path:
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is not a Hugging Face model directory (no config.json); "
            "point model_dir at a local directory saved with save_pretrained"
        )
    return path


def load_config(model_dir: str | Path) -> PretrainedConfig:
    path = _check_dir(model_dir)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    archs = tuple(config.architectures or ())
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ValueError(f"{path}: architectures {archs} not supported; supported: {SUPPORTED_ARCHITECTURES}")
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
