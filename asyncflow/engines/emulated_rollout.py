"""The emulated rollout engine (``rollout.engine.type = "emulated"``): no model, no
device. A ``generate`` call draws each response's length (log-normal, capped at
``max_new_tokens``) and tokens from a seeded hash of (prompt, sample, version), gives
each token the log-prob ``emulated_model.logp_BT`` computes, and sleeps the device time
the planner's cost model gives the call (``emulated_model.Timing``). A weight load keeps
the small tensors it is given (their digest is the trainer's) and sleeps the swap time
of the real model's bytes.

``open_stream`` (partial rollout, ``EmulatedStream``) runs the native engine's scheduler
loop (``NativeStream``) without a model: each ``step`` admits waiting sequences while a
row is free (at most the stream's ``max_running``, and the batch the planner gives a
replica: ``Timing.max_running``), gives each admitted one its first token and every
running one a token, and sleeps the cost model's time for that step: the prefill of the
admitted prompts and one decode iteration of the running batch at its mean context, per
modelled token (``Timing.prefill_s``, ``Timing.decode_s``). A sequence's length and
tokens are drawn at admission as ``generate`` draws them (so a stream run to the end
without a swap gives what ``generate`` gives); each token's log-prob and version are
those of the weights held when it is produced, so a swap between two steps shows in
``token_versions`` as in the native stream.

Invariants: the same prompts, params and version give the same completions; the
log-probs are those the emulated trainer recomputes for the same ids and version.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from msgspec.structs import replace as msgspec_replace

from asyncflow.engines import emulated_model
from asyncflow.engines.base import Completion, FinishReason, RolloutEngine, RolloutStream
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
        ordinary = self._ordinary(params)
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

    def _ordinary(self, params: SamplingParams) -> list[int]:
        stops = set(params.stop_token_ids)
        return [t for t in range(self.first_token, min(self.vocab, self.first_token + 4096)) if t not in stops]

    def open_stream(self, params: SamplingParams, max_running: int | None = None) -> EmulatedStream:
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        return EmulatedStream(self, params, max_running)

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


@dataclass
class _Seq:
    prompt_index: int
    sample_index: int
    prompt: list[int]
    max_new: int
    ids: list[int] = field(default_factory=list)  # the whole response, drawn at admission
    finish: FinishReason = "length"
    out_logps: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)
    h: int = 0  # the log-prob hash of the context so far (emulated_model.context_hash)


@dataclass
class StreamStats:
    """What an ``EmulatedStream`` did (for tests and benchmarks), as the native ``SchedulerStats``."""

    num_steps: int = 0
    """Decode steps."""
    decode_rows: int = 0
    """Sequences decoded, summed over the decode steps."""
    num_prefills: int = 0
    """Steps that admitted sequences."""
    max_running: int = 0
    """Most sequences running at once."""
    admitted_while_running: int = 0
    """Sequences admitted while others were still decoding (continuous batching)."""


class EmulatedStream(RolloutStream):
    """The emulated engine's partial rollout (module docstring): ``NativeStream``'s schedule,
    each step sleeping what the cost model gives it."""

    def __init__(self, engine: EmulatedRolloutEngine, params: SamplingParams, max_running: int | None = None):
        self.engine = engine
        self.params = params
        self.ordinary = engine._ordinary(params)
        self.max_running = max_running
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.stats = StreamStats()
        self.num_prompts = 0
        self._caps: dict[tuple[int, int], int] = {}  # (prompt length, max_new) -> the planner's batch

    def _rows(self) -> int:
        """Rows now: ``max_running`` (None: none) and the planner's batch for the next waiting sequence."""
        q = self.waiting[0] if self.waiting else None
        cap = self.max_running or 0
        if q is not None:
            key = (len(q.prompt), q.max_new)
            if key not in self._caps:
                self._caps[key] = self.engine.timing.max_running(*key)
            cap = min(cap, self._caps[key]) if cap else self._caps[key]
        if not cap:  # nothing waits and no bound given: the batch of the sequences seen last, or of a 1-token prompt
            cap = min(self._caps.values()) if self._caps else self.engine.timing.max_running(1, self.params.max_new_tokens)
        return cap

    @property
    def num_active(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def num_free(self) -> int:
        return max(self._rows() - len(self.running) - len(self.waiting), 0)

    def add(self, prompts: Sequence[Sequence[int]], n: int | None = None, max_new_tokens: int | None = None) -> list[int]:
        n = self.params.n if n is None else n
        max_new = self.params.max_new_tokens if max_new_tokens is None else max_new_tokens
        if n < 1 or max_new < 1:
            raise ValueError(f"n = {n} and max_new_tokens = {max_new} must be >= 1")
        for p, prompt in enumerate(prompts):
            if len(prompt) == 0:
                raise ValueError(f"prompt {p} is empty; a prompt needs at least one token")
        indices = []
        for prompt in prompts:
            for s in range(n):
                self.waiting.append(_Seq(self.num_prompts, s, list(prompt), max_new))
            indices.append(self.num_prompts)
            self.num_prompts += 1
        return indices

    def _emit(self, q: _Seq) -> None:
        """``q``'s next token, its log-prob and version under the weights held now."""
        version = self.engine.version
        logp, q.h = emulated_model.next_logp(q.h, q.ids[len(q.out_logps)], version)
        q.out_logps.append(logp)
        q.out_versions.append(version)

    def step(self) -> list[Completion]:
        engine, stats = self.engine, self.stats
        mark = getattr(engine.sleep, "mark", None)
        if mark is not None:  # the host work below happens during the step's device time
            mark()
        admitted: list[_Seq] = []
        while self.waiting and len(self.running) + len(admitted) < self._rows():
            q = self.waiting.popleft()
            params = msgspec_replace(self.params, max_new_tokens=q.max_new)
            q.ids, q.finish = engine._sample(q.prompt, q.sample_index, params, self.ordinary)
            q.h = emulated_model.context_hash(q.prompt)
            self._emit(q)  # the prefill samples the first token
            admitted.append(q)
        seconds = 0.0
        done: list[_Seq] = []
        if admitted:
            if self.running:
                stats.admitted_while_running += len(admitted)
            stats.num_prefills += 1
            seconds += engine.timing.prefill_s([len(q.prompt) for q in admitted])
            self.running.extend(self._finish_check(admitted, done))
        stats.max_running = max(stats.max_running, len(self.running))
        if self.running:
            # the last token of each is fed at its position: the context is the prompt and the tokens so far
            context = sum(len(q.prompt) + len(q.out_logps) for q in self.running) / len(self.running)
            seconds += engine.timing.decode_s(len(self.running), context)
            for q in self.running:
                self._emit(q)
            stats.num_steps += 1
            stats.decode_rows += len(self.running)
            self.running = self._finish_check(self.running, done)
        engine.sleep(seconds)
        return [
            Completion(q.prompt_index, q.sample_index, q.ids, q.out_logps, q.finish, q.out_versions[0], q.out_versions)
            for q in done
        ]

    @staticmethod
    def _finish_check(seqs: list[_Seq], done: list[_Seq]) -> list[_Seq]:
        still: list[_Seq] = []
        for q in seqs:
            (done if len(q.out_logps) >= len(q.ids) else still).append(q)
        return still

    def close(self) -> None:
        self.running = []
        self.waiting.clear()
