"""Reward models behind ``RewardScorer`` (engines/base.py): a sequence classifier or
a generative judge, each loaded from a local Hugging Face directory.

- ``ClassifierScorer``: ``AutoModelForSequenceClassification`` with ``num_labels = 1``.
  A pair is encoded the way ``encode_pair`` does it (the model's chat template over a
  user turn and an assistant turn, or the plain prompt then the response and the stop
  token); the score is the head's output at the last token (the model finds it from
  ``pad_token_id``; the batch is right-padded with it and masked).
- ``JudgeScorer``: a causal LM answers ``template`` (``{prompt}``, ``{response}``,
  ``{answer}`` filled in) greedily through the native rollout engine; the score is the
  first number of its text (``parse_score``), ``default`` when it has none.

Shape legend: B pairs in a batch, T tokens (padded).
Invariant: the same pairs give the same scores (no sampling; eval mode).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch

from asyncflow.engines.base import RewardScorer, RolloutEngine
from asyncflow.engines.config import SamplingParams
from asyncflow.engines.prompts import prompt_ids

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def encode_pair(tokenizer, prompt: str, response: str) -> list[int]:
    """Token ids of (prompt, response) for a classifier: through the tokenizer's chat
    template as a user turn and an assistant turn when it has one, else the prompt's
    and the response's tokens then the stop token."""
    if getattr(tokenizer, "chat_template", None):
        turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(turns, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = tokenizer(prompt + response, add_special_tokens=False)["input_ids"]
    return ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])


def parse_score(text: str, default: float) -> float:
    """The first number in a judge's text (``"7"``, ``"score: -0.5"``); ``default`` without one."""
    found = _NUMBER.search(text)
    return float(found.group()) if found else default


class ClassifierScorer(RewardScorer):
    def __init__(self, model_dir: str | Path, device: str = "cpu", dtype: str = "float32", batch_size: int = 16):
        from transformers import AutoModelForSequenceClassification

        from asyncflow.engines.hf import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=_DTYPES[dtype], local_files_only=True)
        if model.config.num_labels != 1:
            raise ValueError(
                f"{model_dir}: a reward model has num_labels = 1 (one score per sequence); this one has "
                f"{model.config.num_labels}: give a model trained with one output"
            )
        self.pad = model.config.pad_token_id
        if self.pad is None:
            self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            model.config.pad_token_id = self.pad
        self.model = model.to(device).eval()
        self.device = device
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
        encoded = [encode_pair(self.tokenizer, p, r) for p, r in zip(prompts, responses)]
        out: list[float] = []
        for start in range(0, len(encoded), self.batch_size):
            chunk = encoded[start : start + self.batch_size]
            width = max(len(ids) for ids in chunk)
            ids_BT = torch.full((len(chunk), width), self.pad, dtype=torch.long)
            mask_BT = torch.zeros((len(chunk), width), dtype=torch.long)
            for b, ids in enumerate(chunk):
                ids_BT[b, : len(ids)] = torch.tensor(ids)
                mask_BT[b, : len(ids)] = 1
            logits = self.model(input_ids=ids_BT.to(self.device), attention_mask=mask_BT.to(self.device)).logits
            out += [float(v) for v in logits[:, 0].float().cpu()]
        return out


class JudgeScorer(RewardScorer):
    def __init__(
        self,
        engine: RolloutEngine,
        model_dir: str | Path,
        template: str,
        max_new_tokens: int = 8,
        default: float = 0.0,
    ):
        """``engine``: a rollout engine holding the judge's weights (``factory.build_reward_scorer``
        builds it from ``model_dir``, whose tokenizer is read here)."""
        from asyncflow.engines.hf import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir)
        self.engine = engine
        self.template = template
        self.chat = bool(getattr(self.tokenizer, "chat_template", None))
        self.params = SamplingParams(
            temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=(int(self.tokenizer.eos_token_id),)
        )
        self.default = default

    def judgements(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[str]:
        """The judge's text for each pair."""
        texts = [self.template.format(prompt=p, response=r, answer=a) for p, r, a in zip(prompts, responses, answers)]
        done = self.engine.generate([prompt_ids(self.tokenizer, t, self.chat) for t in texts], self.params)
        by_prompt = {c.prompt_index: c for c in done}
        return [self.tokenizer.decode(by_prompt[i].response_ids, skip_special_tokens=True) for i in range(len(texts))]

    def score(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
        return [parse_score(t, self.default) for t in self.judgements(prompts, responses, answers)]
