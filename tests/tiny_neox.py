"""A tiny GPT-NeoX: a decoder family the native engine does not implement (so
``rollout.engine.type = "auto"`` takes the hf engine), built with transformers' own
config class and the character tokenizer of ``toy/tiny.py``.

Its matrices are drawn N(0, 0.15) (transformers' init leaves the logits nearly
flat), so a wrong position, a stale cache or another model's weights moves the
log-probs by far more than the tests' 1e-4. Same seed, same bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GPTNeoXConfig

from asyncflow.toy.tiny import SPECIALS, build_char_tokenizer, tiny_config


def make_tiny_neox(out_dir: str | Path, seed: int = 0, num_layers: int = 2, max_position_embeddings: int = 256) -> Path:
    """Write the model and its tokenizer to ``out_dir``; returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = GPTNeoXConfig(
        vocab_size=tiny_config().vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=SPECIALS.index("<s>"),
        eos_token_id=SPECIALS.index("</s>"),
        pad_token_id=SPECIALS.index("<pad>"),
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                if param.dim() == 2:
                    param.normal_(0.0, 0.15)
    model.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    AutoTokenizer.from_pretrained(out, local_files_only=True).save_pretrained(out)  # as transformers loads it
    return out
