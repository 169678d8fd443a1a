"""The engine interfaces the RL logic talks to, and their result types.

Actors hold a ``RolloutEngine``, a ``TrainEngine`` or a ``RewardScorer`` built by
``asyncflow.engines.factory``; they never import a concrete engine.

Shape legend: B sequences in a batch, T tokens (padded), L response tokens.

Invariants:
- Token ids and log-probs travel as plain Python lists per sample on the rollout side
  (ragged, ready for the queue) and as right-padded tensors on the training side.
- ``logp_BT[b, t]`` is ``log p(ids[b, t] | ids[b, :t])``; column 0 has no context and
  is 0. Only positions where ``response_mask_BT`` is 1 carry meaning for losses.
- A rollout engine's ``version`` is the policy version of the weights it generates
  with; it changes only in ``load_weights``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch

from asyncflow.engines.config import SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Completion:
    """One sampled response to one prompt."""

    prompt_index: int
    """Index of the prompt in the ``generate`` call."""
    sample_index: int
    """0..n-1 within the prompt's group."""
    response_ids: list[int]
    """Generated tokens, the stop token included when finish_reason is 'stop'."""
    logprobs: list[float]
    """Log-prob of each response token under the generating policy (same length)."""
    finish_reason: FinishReason
    """'stop': a stop token was sampled; 'length': max_new_tokens reached."""
    version: int
    """Policy version of the weights that generated it (with a stream whose weights
    changed mid-sequence: the version of its first token, the oldest)."""
    token_versions: list[int] | None = None
    """Policy version that produced each response token (same length as
    ``response_ids``; non-decreasing), where the engine records it."""


class RolloutStream(abc.ABC):
    """A generation that prompts join and completions leave while it runs
    (``RolloutEngine.open_stream``): partial rollout. Between two ``step`` calls the
    caller may load new weights into the engine; in-flight sequences keep the tokens
    (and KV) they have and go on with the new weights, each token recording the
    version that produced it (``Completion.token_versions``)."""

    @abc.abstractmethod
    def add(self, prompts: Sequence[Sequence[int]], n: int | None = None, max_new_tokens: int | None = None) -> list[int]:
        """Queue ``n`` samples of each prompt (None: the stream's ``params.n``), each of at
        most ``max_new_tokens`` (None: the stream's); returns the stream-wide prompt index
        of each (the completions' ``prompt_index``)."""

    @abc.abstractmethod
    def step(self) -> list[Completion]:
        """Admit what fits, decode one token for every running sequence; returns the
        completions that finished in this step."""

    @property
    @abc.abstractmethod
    def num_active(self) -> int:
        """Sequences queued or running."""

    @property
    @abc.abstractmethod
    def num_free(self) -> int:
        """Sequences that could still be admitted now (free batch rows not claimed by
        queued sequences)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop every unfinished sequence and free its cache."""


def run_stream(stream: RolloutStream, prompts: Sequence[Sequence[int]]) -> list[Completion]:
    """``prompts`` through ``stream`` to the last completion, then the stream closed (also on
    an error, so no reservation leaks); the completions ordered by (prompt, sample): a whole
    ``generate`` call of an engine that generates by streams."""
    try:
        stream.add(prompts)
        done: list[Completion] = []
        while stream.num_active:
            done.extend(stream.step())
    finally:
        stream.close()
    done.sort(key=lambda c: (c.prompt_index, c.sample_index))
    return done


class RolloutEngine(abc.ABC):
    """Generates responses; swaps weights between calls."""

    @abc.abstractmethod
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        """Sample ``params.n`` responses per prompt. Returns ``len(prompts) * n``
        completions ordered by (prompt_index, sample_index)."""

    def open_stream(self, params: SamplingParams, max_running: int | None = None) -> RolloutStream:
        """A ``RolloutStream`` sampling with ``params`` (partial rollout), decoding at
        most ``max_running`` sequences at once (None: as many as the engine can); engines
        that cannot swap weights between decode steps do not have one."""
        raise NotImplementedError(
            f"the {type(self).__name__} rollout engine cannot continue sequences across a weight swap; "
            'set workflow.partial_rollout = false or use rollout.engine.type = "auto" (native, or hf)'
        )

    @abc.abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy weights (Hugging Face parameter names, any device) into the model in
        place and set ``version``. Names not given keep their values."""

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Policy version of the weights held."""

    def weights_digest(self) -> int | None:
        """``engines/digest.py``'s digest of the weights held, read back from the
        model itself; None where the engine cannot read them cheaply (the replica then
        stamps the digest of the tensors it loaded)."""
        return None

    def close(self) -> None:  # noqa: B027  (optional: an engine with nothing to free keeps this no-op)
        """Free the model and cache."""


@dataclass
class TokenBatch:
    """A right-padded batch for training. Every field is [B, T] (or None)."""

    input_ids: torch.Tensor
    """int64 [B, T]: prompt then response then padding."""
    attention_mask: torch.Tensor
    """int64/bool [B, T]: 1 on real tokens."""
    response_mask: torch.Tensor
    """float [B, T]: 1 on response tokens that count in losses."""
    rollout_logp: torch.Tensor | None = None
    """float [B, T]: behaviour log-probs, from the rollout engine that sampled the
    tokens (possibly several policy versions old)."""
    prox_logp: torch.Tensor | None = None
    """float [B, T]: proximal log-probs, recomputed by the trainer before this update
    (needed only when one batch feeds several optimizer steps)."""
    ref_logp: torch.Tensor | None = None
    """float [B, T]: reference policy log-probs (KL)."""
    advantages: torch.Tensor | None = None
    """float [B, T]: per-token advantages."""
    returns: torch.Tensor | None = None
    """float [B, T]: value targets (PPO critic)."""
    old_values: torch.Tensor | None = None
    """float [B, T]: values at rollout time (value clipping)."""
    extra: dict[str, torch.Tensor] = field(default_factory=dict)
    """Any other [B, ...] tensors a custom loss needs."""

    @property
    def batch_size(self) -> int:
        return self.input_ids.shape[0]

    def split(self, micro_batch_size: int) -> list[TokenBatch]:
        """Micro-batches along dim 0, each trimmed to its longest real sequence."""
        return [self.select(slice(start, start + micro_batch_size)) for start in range(0, self.batch_size, micro_batch_size)]

    def select(self, rows: slice | Sequence[int]) -> TokenBatch:
        """These rows (a slice, or indices in the order given), trimmed to their
        longest real sequence."""
        index: slice | torch.Tensor = rows if isinstance(rows, slice) else torch.as_tensor(list(rows), dtype=torch.long)
        width = max(int(self.attention_mask[index].sum(dim=1).max().item()), 1)

        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None:
                return None
            x = x[index]
            return x[:, :width] if x.dim() >= 2 and x.shape[1] == self.input_ids.shape[1] else x

        kw: dict[str, Any] = {f.name: cut(getattr(self, f.name)) for f in fields(self) if f.name != "extra"}
        extra: dict[str, Any] = {k: cut(v) for k, v in self.extra.items()}
        return replace(self, **kw, extra=extra)

    def to(self, device: torch.device | str) -> TokenBatch:
        kw: dict[str, Any] = {
            f.name: (getattr(self, f.name).to(device) if getattr(self, f.name) is not None else None)
            for f in fields(self)
            if f.name != "extra"
        }
        return replace(self, **kw, extra={k: v.to(device) for k, v in self.extra.items()})


@dataclass
class ForwardOutput:
    """What a training forward gives a loss function."""

    logp: torch.Tensor
    """float [B, T]: log p(ids[t] | ids[<t]) under the current policy (0 at t=0)."""
    entropy: torch.Tensor | None = None
    """float [B, T]: entropy of the predictive distribution for position t."""
    values: torch.Tensor | None = None
    """float [B, T]: critic value of the state in which token t is chosen (computed
    from ids[:t]); column 0 is 0."""


@dataclass
class LossContext:
    """Totals over the whole step (all micro-batches, all data-parallel ranks), so a
    micro-batch loss divided by them sums to the step's mean."""

    num_tokens: float
    """Sum of response_mask over the step."""
    num_seqs: float
    """Sequences with at least one response token over the step."""
    dp_size: int = 1
    """Data-parallel ranks whose gradients get averaged (losses multiply by it)."""


LossFn = Callable[[ForwardOutput, TokenBatch, LossContext], tuple[torch.Tensor, dict[str, float]]]
"""``loss_fn(out, micro_batch, ctx) -> (loss, metrics)``. The engine sums the returned
losses over micro-batches before one optimizer step, so a loss must already be
normalised by the step totals in ``ctx`` (see ``asyncflow.algorithms.losses.aggregate``).
Metrics are floats summed over micro-batches by the engine."""


@dataclass
class TrainStepResult:
    """What one optimizer step did."""

    loss: float
    """The step loss: sum of micro-batch losses (over all ranks, divided by dp_size)."""
    grad_norm: float
    """Global grad norm before clipping."""
    num_tokens: int
    """Response tokens trained on (all ranks)."""
    metrics: dict[str, float]
    """Loss function metrics, summed over micro-batches (and ranks, divided by dp_size)."""
    step: int
    """Optimizer steps taken so far (1 after the first)."""
    num_fed_tokens: int = 0
    """Tokens, real and padding, that this rank's forwards ran on (padding shrinks with
    sequence packing: ``train.engine.packing``)."""


@dataclass
class Accumulated:
    """What ``TrainEngine.accumulate`` added to the gradients: this rank's figures, not reduced."""

    loss: float
    """Sum of the micro-batch losses (normalised by the ``LossContext`` it was given)."""
    metrics: dict[str, float]
    """Loss function metrics, summed over micro-batches."""
    num_fed_tokens: int = 0
    """Tokens, real and padding, that the forwards ran on."""


class TrainEngine(abc.ABC):
    """Computes log-probs/values and updates a policy (or critic)."""

    @abc.abstractmethod
    def forward(
        self, batch: TokenBatch, temperature: float = 1.0, with_entropy: bool = False, top_k: int = 0, top_p: float = 1.0
    ) -> ForwardOutput:
        """Log-probs (and entropy, values) without gradients, micro-batched. The
        log-probs are under the rollout's sampling rule: ``temperature``, and the
        ``top_k``/``top_p`` truncation when set (``engines/sampling.py``); the entropy is
        that of the whole tempered distribution."""

    @abc.abstractmethod
    def train_step(
        self, batch: TokenBatch, loss_fn: LossFn, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
    ) -> TrainStepResult:
        """One optimizer step over ``batch`` split into micro-batches (log-probs as ``forward``'s)."""

    def accumulate(
        self,
        batch: TokenBatch,
        loss_fn: LossFn,
        ctx: LossContext,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
    ) -> Accumulated:
        """Forward and backward ``batch`` (micro-batched) with the loss normalised by ``ctx``,
        adding to the gradients; no optimizer step (``apply_gradients`` takes it). A step
        streamed in parts (``workflow.stream_step``) calls it once per part."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream a step in parts: set workflow.stream_step = false")

    def apply_gradients(self, grad_scale: float = 1.0) -> tuple[float, float]:
        """One optimizer step on the accumulated gradients, first multiplied by
        ``grad_scale`` (before clipping); returns (grad norm before clipping, lr)."""
        raise NotImplementedError(f"{type(self).__name__} cannot stream a step in parts: set workflow.stream_step = false")

    @abc.abstractmethod
    def export_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights as (Hugging Face name, cpu tensor), one at a time.
        With FSDP every rank must drain the iterator (gathers are collective)."""

    def published_digest(self, snapshot: list[tuple[str, torch.Tensor]], dtype: torch.dtype) -> int:
        """The weights digest (``engines/digest.py``) of what a rollout engine holds
        after loading ``snapshot`` (this engine's ``export_weights``), its elements in
        the rollout's ``dtype``. The default: the snapshot is the full weights."""
        from asyncflow.engines.digest import weights_digest

        return weights_digest(snapshot, dtype)

    @abc.abstractmethod
    def save_checkpoint(self, path: str, with_optimizer: bool = True) -> None:
        """Write a Hugging Face directory (config, safetensors, tokenizer) that
        transformers and vLLM load as is; optimizer state beside it."""

    @abc.abstractmethod
    def load_checkpoint(self, path: str, with_optimizer: bool = True) -> None:
        """Load weights (and optimizer state when present) saved by save_checkpoint."""

    @property
    @abc.abstractmethod
    def version(self) -> int:
        """Optimizer steps taken (the policy version the trained weights carry)."""


class RewardScorer(abc.ABC):
    """Scores responses with a model (a reward model's classifier head, or a judge's
    generated verdict): one float per (prompt, response) pair."""

    @abc.abstractmethod
    def score(self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
        """The score of each response (decoded text) to its prompt (``answers``: the
        data's reference answers, which a judge's template may show)."""


def chunk_by_bytes(
    named_tensors: Iterable[tuple[str, torch.Tensor]], chunk_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into lists of at most ``chunk_bytes`` (a tensor
    larger than that travels alone)."""
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in named_tensors:
        nbytes = t.numel() * t.element_size()
        if chunk and size + nbytes > chunk_bytes:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, t))
        size += nbytes
    if chunk:
        yield chunk
