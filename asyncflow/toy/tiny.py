"""Tiny models for tests, benchmarks and examples: built offline in about a second.

``make_tiny_model(dir)`` writes a Hugging Face directory (config.json,
model.safetensors, tokenizer files, chat template) that ``transformers`` and every
engine here load like any downloaded model. Nothing is downloaded.

The tokenizer is character level: one token per character of ``CHARS`` plus the
special tokens ``SPECIALS``. Its vocabulary spells characters the byte-level way
(space is ``Ġ``, newline ``Ċ``; printable ASCII is itself), with a byte-level
pre-tokenizer and decoder: transformers 5 loads a ``qwen2`` directory's tokenizer as
``Qwen2Tokenizer`` (byte-level BPE from the vocabulary, whatever ``tokenizer.json``
says), and this way both read the same ids. ``make_tiny_model`` saves the tokenizer
as transformers loads it, so its ``tokenizer.json`` is the pipeline transformers runs
(a character outside ``CHARS`` vanishes rather than becoming ``<unk>``), which the
light tokenizer of ``engines/tokenizer.py`` runs as written. A character outside ``CHARS`` has no
token: ``encode_chat_prompt`` (``engines/prompts.py``) refuses it with an error naming it. The chat template renders a conversation as
``<|user|>{content}<|assistant|>{content}</s>``; with ``add_generation_prompt`` it
ends in ``<|assistant|>``, so a response is generated characters then ``</s>``.

Invariants:
- Same arguments and seed give byte-identical weights.
- ``supervised_warm_start`` trains only on response tokens (prompt tokens are
  context), so it teaches a format without touching the prompt distribution.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

# The alphabet and chat template live beside the prompt encoding that checks prompts
# against them (engines/prompts.py, production code); re-exported here.
from asyncflow.engines.prompts import CHARS, CHAT_TEMPLATE, encode_chat_prompt  # noqa: F401

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>")
Arch = Literal["qwen2", "llama"]


_BYTE_LEVEL = {" ": "\u0120", "\n": "\u010a"}  # what ByteLevel makes of the non-printable CHARS


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer with its chat template."""
    vocab = {tok: i for i, tok in enumerate(list(SPECIALS) + [_BYTE_LEVEL.get(c, c) for c in CHARS])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def tiny_config(
    arch: Arch = "qwen2",
    vocab_size: int = len(SPECIALS) + len(CHARS),
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 192,
    max_position_embeddings: int = 512,
) -> Qwen2Config | LlamaConfig:
    """A small decoder config (grouped-query attention, tied embeddings)."""
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=SPECIALS.index("<s>"),
        eos_token_id=SPECIALS.index("</s>"),
        pad_token_id=SPECIALS.index("<pad>"),
        rms_norm_eps=1e-6,
    )
    if arch == "qwen2":
        return Qwen2Config(**common)
    if arch == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown tiny arch {arch!r}; use 'qwen2' or 'llama'")


WarmStartProgress = Callable[[int, int, float], None]
"""``progress(steps done, steps, last loss)`` of a warm start."""


def make_tiny_model(
    out_dir: str | Path,
    arch: Arch = "qwen2",
    seed: int = 0,
    warm_start_pairs: list[tuple[str, str]] | None = None,
    warm_start_steps: int = 200,
    warm_start_fn=None,
    warm_start_progress: WarmStartProgress | None = None,
    **config_kwargs,
) -> Path:
    """Build, optionally warm-start, and save a tiny model + tokenizer to ``out_dir``.

    ``warm_start_pairs``: (prompt, response) texts for ``supervised_warm_start``;
    ``warm_start_fn(model, tokenizer)``: a warm start of its own instead (e.g. the
    multi-turn one of ``envs/calc.py``, through ``masked_warm_start``);
    ``warm_start_progress``: called as the pairs' warm start goes (``masked_warm_start``).
    Returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    config = tiny_config(arch, **config_kwargs)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if warm_start_pairs:
        supervised_warm_start(model, tokenizer, warm_start_pairs, steps=warm_start_steps, seed=seed, progress=warm_start_progress)
    elif warm_start_fn is not None:
        warm_start_fn(model, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # saved again as transformers loads it (a qwen2 directory's as Qwen2Tokenizer's pipeline), so
    # tokenizer.json is the pipeline that transformers and engines/tokenizer.py both run
    AutoTokenizer.from_pretrained(out, local_files_only=True).save_pretrained(out)
    return out


def supervised_warm_start(
    model: torch.nn.Module,
    tokenizer,
    pairs: list[tuple[str, str]],
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    progress: WarmStartProgress | None = None,
) -> list[float]:
    """A few seconds of next-token training on (prompt, response + eos) pairs, loss on
    response tokens only. Returns the loss per step."""
    eos = tokenizer.eos_token_id
    sequences = []
    for p, r in pairs:
        prompt, response = encode_chat_prompt(tokenizer, p), tokenizer(r, add_special_tokens=False)["input_ids"] + [eos]
        sequences.append((prompt + response, [0] * len(prompt) + [1] * len(response)))
    return masked_warm_start(model, tokenizer.pad_token_id, sequences, steps, batch_size, lr, seed, progress)


def masked_warm_start(
    model: torch.nn.Module,
    pad_token_id: int,
    sequences: list[tuple[list[int], list[int]]],
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
    progress: WarmStartProgress | None = None,
) -> list[float]:
    """Next-token training on (ids, loss mask) sequences: the loss counts only the
    tokens whose mask is 1 (a multi-turn trajectory's model turns). Returns the loss
    per step. ``progress(done, steps, loss)`` is called after every tenth of the steps."""
    rng = random.Random(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        batch = [sequences[rng.randrange(len(sequences))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids_BT = torch.full((batch_size, width), pad_token_id, dtype=torch.long)
        labels_BT = torch.full((batch_size, width), -100, dtype=torch.long)
        mask_BT = torch.zeros((batch_size, width), dtype=torch.long)
        for b, (ids, loss_mask) in enumerate(batch):
            ids_T = torch.tensor(ids)
            ids_BT[b, : len(ids)] = ids_T
            labels_BT[b, : len(ids)] = torch.where(torch.tensor(loss_mask, dtype=torch.bool), ids_T, -100)
            mask_BT[b, : len(ids)] = 1
        loss = model(input_ids=ids_BT, attention_mask=mask_BT, labels=labels_BT).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        losses.append(loss.item())
        if progress is not None and (len(losses) % max(steps // 10, 1) == 0 or len(losses) == steps):
            progress(len(losses), steps, losses[-1])
    model.eval()
    return losses


def make_tiny_reward_model(
    out_dir: str | Path,
    examples: list[tuple[str, str, float]],
    arch: Arch = "qwen2",
    seed: int = 0,
    steps: int = 300,
    batch_size: int = 64,
    lr: float = 3e-3,
    **config_kwargs,
) -> tuple[Path, list[float]]:
    """A tiny sequence classifier (``AutoModelForSequenceClassification``,
    ``num_labels = 1``) trained for ``steps`` steps to regress ``target`` from
    (prompt, response, target) texts, saved with the tokenizer to ``out_dir``.

    Pairs are encoded as the reward-model role encodes them (``encode_pair``: the chat
    template's user and assistant turns); its score is the head's output at the last
    token (the model's ``pad_token_id`` marks padding). Returns the directory and the
    loss per step."""
    from transformers import AutoModelForSequenceClassification

    from asyncflow.engines.reward_model import encode_pair

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_char_tokenizer()
    config = tiny_config(arch, **config_kwargs)
    config.num_labels = 1
    config.tie_word_embeddings = False  # the classifier has no output embedding to tie
    rng = random.Random(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
        pad = tokenizer.pad_token_id
        encoded = [(encode_pair(tokenizer, p, r), t) for p, r, t in examples]
        optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        model.train()
        losses = []
        for _ in range(steps):
            batch = [encoded[rng.randrange(len(encoded))] for _ in range(batch_size)]
            width = max(len(ids) for ids, _ in batch)
            ids_BT = torch.full((batch_size, width), pad, dtype=torch.long)
            mask_BT = torch.zeros((batch_size, width), dtype=torch.long)
            for b, (ids, _) in enumerate(batch):
                ids_BT[b, : len(ids)] = torch.tensor(ids)
                mask_BT[b, : len(ids)] = 1
            target_B = torch.tensor([t for _, t in batch], dtype=torch.float32)
            score_B = model(input_ids=ids_BT, attention_mask=mask_BT).logits[:, 0]
            loss = torch.nn.functional.mse_loss(score_B, target_B)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            losses.append(loss.item())
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, losses
