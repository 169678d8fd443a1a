"""What the two emulated engines share (``emulated_rollout.py``, ``emulated_train.py``):
the model they stand for, its device time, its log-probs and its weights.

- Time: the planner's cost model (``planner/cost.py``) for ``emulated.model`` on
  ``emulated.hardware``, given the lengths of the call or step at hand (times
  ``token_scale``), times ``time_scale``. The engines sleep it on an event.
- Log-probs: ``logp_BT`` hashes each position's context (the ids before it), its
  token and the policy version to a number in [-4.02, -0.02]. Rollout and trainer call
  this one function on the same ids, so an on-policy ratio is exactly 1 and a row of
  another version has a ratio other than 1, deterministically.
- Weights: ``version_weights`` is a small tensor that is a function of the version, so
  the weights digest (``digest.py``) changes with every version and a replica's digest
  is the trainer's; the bytes a version stands for are ``Timing.weight_bytes``.

This module may import the planner's pure cost model (tests/test_layers.py names it):
an emulated device's time is that model. Shape legend: B rows, T tokens.

Invariant: everything here but ``EventSleep`` is a pure function of its arguments (no clock, no state).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from asyncflow.engines.base import TokenBatch
from asyncflow.engines.config import EmulatedConfig
from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import (
    DTYPE_BYTES,
    MAX_SEQS_PER_INSTANCE,
    Workload,
    decode_iteration_s,
    rollout_cost,
    train_cost,
    weight_swap_s,
)
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS

_M = (1 << 31) - 1  # a Mersenne prime: every product below stays under 2^53 in int64
_P, _A, _B, _C, _D = 1_000_003, 1_048_573, 999_983, 7_919, 2_097_143
WEIGHT_NAME = "emulated.policy"
WEIGHT_ELEMENTS = 64
CHECKPOINT_FILE = "emulated.json"
DEFAULT_VOCAB = 32_000


def logp_BT(ids_BT: torch.Tensor, version: int) -> torch.Tensor:
    """float32 [B, T]: ``logp[b, t]`` is the emulated ``log p(ids[b, t] | ids[b, :t])`` of
    policy ``version``; column 0 (no context) is 0. Padding gets a value: mask it."""
    ids = ids_BT.to(torch.int64).cpu()
    B, T = ids.shape
    out = torch.zeros((B, T), dtype=torch.float64)
    h = torch.ones(B, dtype=torch.int64)
    for t in range(1, T):
        h = (h * _P + ids[:, t - 1] + 1) % _M
        mix = (h * _A + ids[:, t] * _B + (version + 1) * _C) % _M
        mix = (mix * _D) % _M
        out[:, t] = -(0.02 + 4.0 * mix.to(torch.float64) / _M)
    return out.to(torch.float32)


def context_hash(ids: Sequence[int]) -> int:
    """``logp_BT``'s running hash of a context: the state after feeding ``ids`` (the value
    ``h`` has at the position after them), for ``next_logp``."""
    h = 1
    for t in ids:
        h = (h * _P + t + 1) % _M
    return h


def next_logp(h: int, token: int, version: int) -> tuple[float, int]:
    """``logp_BT``'s value for ``token`` after the context whose ``context_hash`` is ``h``, under
    ``version`` (the same float32), and the hash with ``token`` fed: a stream's log-probs one
    token at a time, each under its own version, in plain integer arithmetic."""
    mix = (h * _A + token * _B + (version + 1) * _C) % _M
    mix = (mix * _D) % _M
    return float(np.float32(-(0.02 + 4.0 * mix / _M))), (h * _P + token + 1) % _M


def version_weights(version: int) -> list[tuple[str, torch.Tensor]]:
    """The emulated weights of ``version``: one small float32 tensor that differs per version."""
    gen = torch.Generator().manual_seed(version + 1)
    return [(WEIGHT_NAME, torch.randn(WEIGHT_ELEMENTS, generator=gen, dtype=torch.float32))]


def rng(seed: int, *parts: Sequence[int] | int) -> random.Random:
    """A generator seeded by a hash of ``seed`` and ``parts`` (a prompt's ids, a sample index, a version)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(str(seed).encode())
    for p in parts:
        h.update(b"|" + (",".join(map(str, p)) if isinstance(p, Sequence) else str(p)).encode())
    return random.Random(int.from_bytes(h.digest(), "little"))


def response_length(r: random.Random, max_new_tokens: int, median_fraction: float, sigma: float) -> int:
    """A log-normal length around ``median_fraction * max_new_tokens`` (a long right tail),
    at least 1, capped at ``max_new_tokens``."""
    median = max(1.0, median_fraction * max_new_tokens)
    return max(1, min(max_new_tokens, math.ceil(median * math.exp(sigma * r.gauss(0.0, 1.0)))))


def vocab_of(model_dir: str | Path) -> tuple[int, int]:
    """(vocab size, first ordinary token id) of the tokenizer in ``model_dir`` (its
    config.json; none: a default), so emulated tokens decode to text."""
    path = Path(model_dir) / "config.json"
    vocab = json.loads(path.read_text()).get("vocab_size", DEFAULT_VOCAB) if path.exists() else DEFAULT_VOCAB
    return int(vocab), min(3, int(vocab) - 1)


class Timing:
    """Seconds of device time, from the planner's cost model, times ``time_scale``."""

    def __init__(self, cfg: EmulatedConfig):
        self.cfg = cfg
        self.model = PRESETS[cfg.model]
        self.hardware = get_hardware(cfg.hardware)
        self.efficiency = Efficiency()

    @property
    def weight_bytes(self) -> int:
        """Bytes of one version of the real model's weights (bf16), what a sync moves."""
        return self.model.num_params * DTYPE_BYTES

    def _tokens(self, n: float) -> int:
        return max(1, round(n * self.cfg.token_scale))

    def generate_s(self, prompt_lens: Sequence[int], response_lens: Sequence[int], num_prompts: int, n: int) -> float:
        """One generate call of ``num_prompts`` x ``n`` samples with these lengths (one per sample)."""
        wl = Workload(
            prompt_len_tokens=self._tokens(sum(prompt_lens) / len(prompt_lens)),
            response_len_tokens=self._tokens(sum(response_lens) / len(response_lens)),
            max_response_len_tokens=self._tokens(max(response_lens)),
            prompts_per_step=num_prompts,
            samples_per_prompt=n,
            use_reference=False,
        )
        tp = self.cfg.rollout_tp
        cost = rollout_cost(self.model, self.hardware, self.efficiency, wl, devices=tp, tp=tp)
        if not cost.feasible:
            raise ValueError(f"emulated rollout: {cost.reason}; raise rollout.engine.emulated.rollout_tp")
        return (cost.time_s + cost.tail_s) * self.cfg.time_scale

    def prefill_s(self, prompt_lens: Sequence[int]) -> float:
        """A stream's admission of these sequences (one per sample, each its prompt's length):
        the planner's prefill (``rollout_cost``: 2P FLOPs per prompt token over ``rollout_tp``
        devices, the per-layer and per-call overheads of one prefill, the per-sequence one)."""
        if not prompt_lens:
            return 0.0
        eff, hw, tp = self.efficiency, self.hardware, self.cfg.rollout_tp
        flops = sum(self.model.prefill_flops(self._tokens(n)) for n in prompt_lens) / tp
        seconds = flops / (hw.peak_bf16_flops * eff.prefill_flops)
        seconds += self.model.num_layers * eff.prefill_overhead_s_per_layer + eff.generate_overhead_s
        seconds += len(prompt_lens) * eff.generate_overhead_s_per_seq
        return seconds * self.cfg.time_scale

    def decode_s(self, batch: int, mean_context: float) -> float:
        """A stream's decode step of ``batch`` sequences at a mean context of ``mean_context``
        emulated tokens: an emulated token stands for ``token_scale`` modelled ones, so the
        step is that many of the planner's decode iterations (``decode_iteration_s``)."""
        if batch < 1:
            return 0.0
        tp, context = self.cfg.rollout_tp, mean_context * self.cfg.token_scale
        iteration = decode_iteration_s(self.model, self.hardware, self.efficiency, tp, batch, context)
        return self.cfg.token_scale * iteration * self.cfg.time_scale

    def mean_response(self, max_new_tokens: int) -> float:
        """The mean of ``response_length``'s log-normal (the cap ignored), at most ``max_new_tokens``."""
        median = max(1.0, self.cfg.response_median_fraction * max_new_tokens)
        return min(float(max_new_tokens), median * math.exp(self.cfg.response_sigma**2 / 2))

    def max_running(self, prompt_len: int, max_new_tokens: int) -> int:
        """Sequences one replica decodes at once: the planner's batch (``rollout_cost``): what
        the KV cache beside the weights holds of sequences of the mean length, at most
        ``MAX_SEQS_PER_INSTANCE``."""
        response = self.mean_response(max_new_tokens)
        wl = Workload(
            prompt_len_tokens=self._tokens(prompt_len),
            response_len_tokens=self._tokens(response),
            max_response_len_tokens=self._tokens(max_new_tokens),
            prompts_per_step=MAX_SEQS_PER_INSTANCE,
            samples_per_prompt=1,
            use_reference=False,
        )
        tp = self.cfg.rollout_tp
        cost = rollout_cost(self.model, self.hardware, self.efficiency, wl, devices=tp, tp=tp)
        if not cost.feasible:
            raise ValueError(f"emulated rollout: {cost.reason}; raise rollout.engine.emulated.rollout_tp")
        return cost.batch_per_instance

    def lengths(self, batch: TokenBatch) -> tuple[int, int]:
        """(mean prompt, mean response) tokens of a training batch's rows, as modelled."""
        real = batch.attention_mask.sum(dim=1).double()
        response = batch.response_mask.sum(dim=1).double()
        return self._tokens(float((real - response).mean())), self._tokens(float(response.mean()))

    def train_s(self, batch: TokenBatch) -> float:
        """One optimizer step over ``batch`` on ``train_devices`` devices."""
        prompt, response = self.lengths(batch)
        wl = Workload(
            prompt_len_tokens=prompt,
            response_len_tokens=response,
            max_response_len_tokens=response,
            prompts_per_step=batch.batch_size,
            samples_per_prompt=1,
            use_reference=False,
        )
        cfg = self.cfg
        cost = train_cost(self.model, self.hardware, self.efficiency, wl, cfg.train_devices, cfg.train_tp, cfg.train_pp)
        if not cost.feasible:
            raise ValueError(f"emulated trainer: {cost.reason}; raise train.engine.emulated.train_devices, train_tp or train_pp")
        return cost.time_s * self.cfg.time_scale

    def swap_s(self) -> float:
        """A replica's weight swap (host buffer to device) of one version."""
        return weight_swap_s(self.model, self.hardware, self.cfg.rollout_tp) * self.cfg.time_scale


class EventSleep:
    """Waits on an event (no core used); ``wake`` ends every wait at once (close).

    ``mark`` at the start of an emulated call makes the next wait end ``seconds`` after
    the mark: the host's own work of emulating the call (drawing tokens, hashing
    log-probs) happens during the device time, as a real engine's host work overlaps its
    device, instead of being added to it. Without a mark a wait is ``seconds`` long."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._since: float | None = None

    def mark(self) -> None:
        self._since = time.monotonic()

    def __call__(self, seconds: float) -> None:
        since, self._since = self._since, None
        if since is not None:
            seconds -= time.monotonic() - since
        if seconds > 0:
            self.event.wait(seconds)

    def wake(self) -> None:
        self.event.set()
