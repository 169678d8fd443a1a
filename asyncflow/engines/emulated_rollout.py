"""The emulated rollout engine (``rollout.engine.type = "emulated"``): no model, no
device. A ``generate`` call draws each response's length (log-normal, capped at
``max_new_tokens``) and tokens from a seeded hash of (prompt, sample, version), gives
each token the log-prob ``emulated_model.logp_BT`` computes, and sleeps the device time
the planner's cost model gives the call (``emulated_model.Timing``). A weight load keeps
the small tensors it is given (their digest is the trainer's) and sleeps the swap time
of the real model's bytes.

Invariants: the same prompts, params and version give the same completions; the
log-probs are those the emulated trainer recomputes for the same ids and version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from asyncflow.engines import emulated_model
from asyncflow.engines.base import Completion, FinishReason, RolloutEngine
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.digest import weights_digest


class EmulatedRolloutEngine(RolloutEngine):
    def __init__(self, cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0):
        self.cfg = cfg.emulated
        self.timing = emulated_model.Timing(self.cfg)
        self.vocab, self.first_token = emulated_model.vocab_of(model_dir)
        self._version = version
        self._weights = emulated_model.version_weights(version)
        self.sleep = emulated_model.EventSleep()
        """Called with each emulated duration in seconds (tests record them instead)."""

    def _sample(
        self, prompt: Sequence[int], index: int, params: SamplingParams, ordinary: list[int]
    ) -> tuple[list[int], FinishReason]:
        r = emulated_model.rng(self.cfg.seed if params.seed is None else params.seed, prompt, index, self._version)
        length = emulated_model.response_length(
            r, params.max_new_tokens, self.cfg.response_median_fraction, self.cfg.response_sigma
        )
        stop = bool(params.stop_token_ids) and length < params.max_new_tokens
        ids = [r.choice(ordinary) for _ in range(length - 1 if stop else length)]
        return (ids + [params.stop_token_ids[0]], "stop") if stop else (ids, "length")

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        mark = getattr(self.sleep, "mark", None)
        if mark is not None:  # the host work below happens during the call's device time
            mark()
        stops = set(params.stop_token_ids)
        ordinary = [t for t in range(self.first_token, min(self.vocab, self.first_token + 4096)) if t not in stops]
        drawn = [(p, i, *self._sample(prompt, i, params, ordinary)) for p, prompt in enumerate(prompts) for i in range(params.n)]
        # every row's log-probs in one call, right-padded: a position's value depends only on the ids up to it
        rows = [list(prompts[p]) + ids for p, _, ids, _ in drawn]
        width = max(len(r) for r in rows)
        logp = emulated_model.logp_BT(torch.tensor([r + [0] * (width - len(r)) for r in rows]), self._version)
        out: list[Completion] = []
        for b, (p, i, ids, finish) in enumerate(drawn):
            start = len(prompts[p])
            out.append(Completion(p, i, ids, logp[b, start : start + len(ids)].tolist(), finish, self._version))
        seconds = self.timing.generate_s(
            [len(prompts[c.prompt_index]) for c in out], [len(c.response_ids) for c in out], len(prompts), params.n
        )
        self.sleep(seconds)
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        mark = getattr(self.sleep, "mark", None)
        if mark is not None:
            mark()
        self._weights = [(name, t.detach().to("cpu", torch.float32).clone()) for name, t in named_tensors]
        self.sleep(self.timing.swap_s())
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def weights_digest(self) -> int | None:
        return weights_digest(self._weights, torch.float32)

    def close(self) -> None:
        wake = getattr(self.sleep, "wake", None)
        if wake is not None:
            wake()
