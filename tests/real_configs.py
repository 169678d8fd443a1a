"""Config files of real models, for tests that need a real model's shapes but none of its weights
(the preflight's step and memory estimates): nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

# SmolLM2-135M-Instruct's config.json, the fields the estimates read (examples/smollm2.toml's model)
SMOLLM2_135M = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
}


def write_smollm2_config(model_dir: Path) -> Path:
    """``model_dir`` (made if new) holding SmolLM2-135M's config.json and nothing else."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(SMOLLM2_135M))
    return model_dir
