"""Real-size model directories for the tests: random weights in the shapes of real
models, built offline once per session (config and tokenizer by ``save_pretrained``,
the weights written as transformers writes them: ``make_real_size_model``).

Every real model's embedding holds more than 2^24 elements, where float32 index
arithmetic stops being exact (the digest's sampled positions were once computed so,
and no real model could start): these shapes send such tensors down every path
(digest, weight sync, LoRA, checkpoints, generation, FSDP).

- ``qwen`` (Qwen2.5-0.5B's shape, 2 of its 24 layers): Qwen2ForCausalLM, vocabulary
  151,936 x hidden 896 (136 M elements), embeddings tied, intermediate 4,864, 14
  heads, 2 key/value heads, q/k/v biases.
- ``llama`` (Llama-3.2-1B's embedding, 1 layer): LlamaForCausalLM, vocabulary 128,256
  x hidden 2,048 (263 M elements, 1.05 GB in float32), 32 heads, 8 key/value heads,
  the llama3 rope scaling; the output head untied (Llama-3.2-1B ties it; untied, the
  separate ``lm_head`` of Llama-3.1-8B takes its own path) and the MLP narrow
  (intermediate 1,024, not 8,192: memory), so a float32 directory is 2.1 GB.
- ``qwen3`` (Qwen3-0.6B's shape, 2 of its 28 layers): Qwen3ForCausalLM, vocabulary
  151,936 x hidden 1,024, tied, 16 heads of 128 dims (2,048 wide: head_dim is not
  hidden / heads), 8 key/value heads, q/k norms.
- ``gemma3`` (Gemma 3 270M's shape, 2 of its 18 layers: a sliding one and a global
  one): Gemma3ForCausalLM, vocabulary 262,144 x hidden 640 (168 M elements), tied,
  4 heads of 256 dims, 1 key/value head, (1 + w) norms, a rope base per layer type.

The tokenizer is the tiny models' character tokenizer (``toy/tiny.py``): its ~100
ids are a prefix of the vocabulary; nothing here decodes a sampled id.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

REAL_SHAPES: dict[str, dict] = {
    "qwen": dict(
        arch="qwen2",
        vocab_size=151_936,
        hidden_size=896,
        intermediate_size=4_864,
        num_layers=2,
        num_heads=14,
        num_kv_heads=2,
        max_position_embeddings=32_768,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    "llama": dict(
        arch="llama",
        vocab_size=128_256,
        hidden_size=2_048,
        intermediate_size=1_024,
        num_layers=1,
        num_heads=32,
        num_kv_heads=8,
        max_position_embeddings=131_072,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8_192,
        },
    ),
    "qwen3": dict(
        arch="qwen3",
        vocab_size=151_936,
        hidden_size=1_024,
        intermediate_size=3_072,
        num_layers=2,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    ),
    "gemma3": dict(
        arch="gemma3_text",
        vocab_size=262_144,
        hidden_size=640,
        intermediate_size=2_048,
        num_layers=2,
        num_heads=4,
        num_kv_heads=1,
        head_dim=256,
        max_position_embeddings=32_768,
        tie_word_embeddings=True,
        rope_parameters=None,  # Gemma3TextConfig's own: a local base for sliding layers, a global one
    ),
}

_FAMILY_EXTRAS: dict[str, dict] = {
    "qwen3": {},
    "gemma3_text": dict(
        query_pre_attn_scalar=256,
        sliding_window=512,
        layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=None,
    ),
}
"""Config fields of the families ``toy/tiny.py``'s ``tiny_config`` does not build."""

_built: dict[str, Path] = {}  # one directory per shape and session


def real_size_config(kind: str):
    """The transformers config of ``kind`` (``REAL_SHAPES``), its architecture named."""
    from transformers import AutoConfig

    from asyncflow.toy.tiny import tiny_config

    spec = dict(REAL_SHAPES[kind])
    tied, rope = spec.pop("tie_word_embeddings"), spec.pop("rope_parameters")
    if spec["arch"] in _FAMILY_EXTRAS:
        arch = spec.pop("arch")
        config = AutoConfig.for_model(
            arch,
            vocab_size=spec["vocab_size"],
            hidden_size=spec["hidden_size"],
            intermediate_size=spec["intermediate_size"],
            num_hidden_layers=spec["num_layers"],
            num_attention_heads=spec["num_heads"],
            num_key_value_heads=spec["num_kv_heads"],
            head_dim=spec["head_dim"],
            max_position_embeddings=spec["max_position_embeddings"],
            tie_word_embeddings=tied,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=0,
            **_FAMILY_EXTRAS[arch],
        )
        if rope is not None:
            config.rope_parameters = rope
        config.architectures = [{"qwen3": "Qwen3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}[arch]]
        return config
    config = tiny_config(**spec)
    config.tie_word_embeddings = tied
    config.rope_parameters = rope
    config.architectures = [{"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[spec["arch"]]]
    return config


def write_real_size_config(out_dir: str | Path, kind: str) -> Path:
    """A directory holding only ``kind``'s ``config.json`` (what the planner and the
    preflight estimate read). Returns the directory."""
    out = Path(out_dir)
    real_size_config(kind).save_pretrained(out)
    return out


def make_real_size_model(out_dir: str | Path, kind: str, seed: int = 0) -> Path:
    """A ``kind`` (``REAL_SHAPES``) model directory in float32 with the tiny tokenizer:
    config and tokenizer by ``save_pretrained``, and ``model.safetensors`` holding the
    parameters of the model transformers builds from the config (named as it names
    them, the tied head left out as it leaves it out): each drawn once from N(0, 0.02),
    the norms ones. Skipping transformers' own initialisation (a uniform draw at
    construction, then a normal one) makes this several times faster. Returns the
    directory."""
    import safetensors.torch
    from transformers import AutoModelForCausalLM

    from asyncflow.toy.tiny import build_char_tokenizer

    config = real_size_config(kind)
    with torch.device("meta"):
        shapes = AutoModelForCausalLM.from_config(config)  # names and shapes only: no memory, no init
    g = torch.Generator().manual_seed(seed)
    weights = {
        name: _norm_init(name, p.shape, config)
        if name.endswith("norm.weight")
        else torch.empty(p.shape).normal_(0.0, 0.02, generator=g)
        for name, p in shapes.named_parameters()  # a tied head is the embedding: named once
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    config.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return out


def _norm_init(name: str, shape, config) -> torch.Tensor:
    """A norm's weight as the family initialises it: ones, or zeros where the family
    scales by (1 + weight) (Gemma)."""
    return torch.zeros(shape) if config.model_type.startswith("gemma") else torch.ones(shape)


def real_size_model(kind: str, tmp_path_factory) -> Path:
    """The session's ``kind`` directory (built on first use)."""
    if kind not in _built:
        start = time.perf_counter()
        _built[kind] = make_real_size_model(tmp_path_factory.mktemp(f"real_{kind}"), kind)
        print(f"built the real-size {kind} model in {time.perf_counter() - start:.1f} s")
    return _built[kind]


def numel_over_2_24(named) -> list[str]:
    """The names of the tensors of more than 2^24 elements."""
    return [name for name, t in named if t.numel() > 2**24]


def logprob_gaps(trainer, prompts: list[list[int]], done) -> torch.Tensor:
    """The trainer's log-probs of each completion's response tokens minus the ones the
    replica sampled with, all completions' tokens in one vector."""
    from asyncflow.engines.base import TokenBatch

    rows = [prompts[c.prompt_index] + c.response_ids for c in done]
    width = max(map(len, rows))
    ids_BT = torch.zeros(len(rows), width, dtype=torch.long)
    mask_BT = torch.zeros_like(ids_BT)
    for b, row in enumerate(rows):
        ids_BT[b, : len(row)], mask_BT[b, : len(row)] = torch.tensor(row), 1
    logp_BT = trainer.forward(TokenBatch(input_ids=ids_BT, attention_mask=mask_BT, response_mask=mask_BT.float())).logp
    gaps = []
    for b, c in enumerate(done):
        start = len(prompts[c.prompt_index])
        gaps.append(logp_BT[b, start : start + len(c.response_ids)] - torch.tensor(c.logprobs))
    return torch.cat(gaps)
