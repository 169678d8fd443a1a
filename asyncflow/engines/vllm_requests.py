"""What the vLLM adapter asks of vLLM, built without vLLM: engine arguments, sampling
arguments, token-id prompts, the weight-transfer choice, and the per-token policy
versions read back from a finished request.

Kept apart from ``vllm_rollout.py`` so that every rule here runs in the default test
suite on a machine with no GPU and no vLLM (tests/engines/test_vllm_requests.py);
``vllm_rollout.py`` only hands these dicts to vLLM's constructors.

Invariants:
- Prompts are token ids (``{"prompt_token_ids": [...]}``, vLLM's ``TokensPrompt``) and
  responses are token ids (``detokenize=False``): nothing is re-tokenised, so a
  multi-turn continuation is exactly the ids the model saw and produced.
- ``token_versions`` has one entry per response token, and each entry is the version
  of the weights that sampled it: from vLLM's own ``weight_versions`` spans when the
  installed vLLM reports them, else from the boundaries the adapter recorded at each
  swap (``Boundary``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from asyncflow.engines.config import RolloutEngineConfig, SamplingParams

WeightTransfer = Literal["ipc", "rpc"]

DEFAULT_GPU_MEMORY_UTILIZATION = 0.85


def weight_transfer_backend(cfg: RolloutEngineConfig) -> WeightTransfer:
    """The way new weights reach vLLM's workers for ``cfg`` (``weight_transfer =
    "auto"`` resolved): vLLM's CUDA IPC transfer engine when the one worker shares this
    process's GPU; else ``collective_rpc`` into the model's ``load_weights`` (tensor
    parallelism, where one process's buffers are on one GPU only; and Ascend, where
    vLLM's transfer engines are CUDA's).

    Not vLLM's NCCL engine: within a replica this process and the worker share a GPU,
    and NCCL refuses two ranks on one device. The trainer-to-replica hop goes over
    NCCL already (``[workflow] weight_transport = "collective"``, onto this GPU)."""
    if cfg.weight_transfer != "auto":
        return cfg.weight_transfer
    return "ipc" if cfg.type == "vllm" and cfg.tensor_parallel_size == 1 else "rpc"


def memory_kwargs(cfg: RolloutEngineConfig) -> dict[str, float | int]:
    """vLLM's KV budget: ``kv_cache_memory_bytes`` (exact) or ``gpu_memory_utilization``."""
    if cfg.kv_cache_bytes is not None and cfg.kv_cache_fraction is not None:
        raise ValueError("set kv_cache_bytes or kv_cache_fraction, not both")
    if cfg.kv_cache_bytes is not None:
        return {"kv_cache_memory_bytes": cfg.kv_cache_bytes}
    fraction = cfg.kv_cache_fraction if cfg.kv_cache_fraction is not None else DEFAULT_GPU_MEMORY_UTILIZATION
    return {"gpu_memory_utilization": fraction}


def engine_kwargs(cfg: RolloutEngineConfig, model_dir: str | Path, worker_extension: str) -> dict[str, Any]:
    """Keyword arguments of ``vllm.AsyncEngineArgs`` for ``cfg``, less
    ``weight_transfer_config`` (a vLLM object: ``vllm_rollout.py`` adds it from
    ``weight_transfer_backend``, except for ``rpc``)."""
    return {
        "model": str(model_dir),
        "skip_tokenizer_init": True,  # token ids in and out: the tokenizer is never used
        "dtype": cfg.dtype,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "max_num_seqs": cfg.max_batch_size,
        "seed": cfg.seed,
        "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": True,  # a multi-turn continuation reuses its prefix's KV blocks
        "logprobs_mode": "processed_logprobs",  # after temperature, like the native engine's
        "worker_extension_cls": worker_extension,
        **memory_kwargs(cfg),
    }


def samples_per_request(params: SamplingParams) -> int:
    """vLLM's ``n`` for ``params``: vLLM refuses n > 1 with greedy sampling
    (temperature 0), so a greedy request asks one sample and the adapter repeats it
    ``params.n`` times (greedy samples are the same answer)."""
    return 1 if params.temperature == 0 else params.n


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` that give the native engine's
    semantics: stop only on ``stop_token_ids`` (kept in the response, with its
    log-prob), the sampled token's log-prob (``logprobs=0``), token ids only."""
    return {
        "n": samples_per_request(params),
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_new_tokens,
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": True,  # the stop tokens above are the only stop
        "logprobs": 0,
        "seed": params.seed,
        "detokenize": False,
        "skip_special_tokens": False,
    }


def token_prompt(ids: Sequence[int]) -> dict[str, list[int]]:
    """vLLM's ``TokensPrompt`` for ``ids``: the model sees exactly these ids."""
    if not ids:
        raise ValueError("a prompt needs at least one token id")
    return {"prompt_token_ids": [int(t) for t in ids]}


def finish_reason(ids: Sequence[int], stop_token_ids: Sequence[int]) -> Literal["stop", "length"]:
    """'stop' when the response ends with one of the stop tokens, else 'length'."""
    return "stop" if ids and ids[-1] in set(stop_token_ids) else "length"


def sampled_logprobs(ids: Sequence[int], steps: Sequence[dict[int, Any]] | None) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-step ``{token_id: Logprob}``."""
    if steps is None or len(steps) != len(ids):
        raise RuntimeError(
            f"vLLM returned {0 if steps is None else len(steps)} log-prob steps for {len(ids)} tokens: the request must "
            "ask logprobs=0"
        )
    return [float(step[t].logprob) for t, step in zip(ids, steps)]


@dataclass(frozen=True)
class Boundary:
    """A swap seen by one request: the first ``num_tokens`` of its response (as the
    adapter had received them when generation paused) came from weights older than
    ``version``, the ones after from ``version`` on."""

    num_tokens: int
    version: int


def versions_from_spans(num_tokens: int, spans: Sequence[Any], start_version: int) -> list[int]:
    """Per-token versions from vLLM's ``weight_versions`` spans (``.start``, ``.end``,
    ``.version``: the label the adapter set, ``str(version)``). A span's version holds
    from its start until the next span's; tokens before the first labelled span keep
    ``start_version``; a span without a label (None) changes nothing."""
    out = [start_version] * num_tokens
    for span in sorted(spans, key=lambda s: int(s.start)):
        if span.version is None:
            continue
        label = str(span.version)
        if not label.lstrip("-").isdigit():
            raise RuntimeError(f"weight version label {label!r} is not an asyncflow policy version")
        start = min(max(int(span.start), 0), num_tokens)
        out[start:] = [int(label)] * (num_tokens - start)
    return out


def versions_from_boundaries(num_tokens: int, boundaries: Sequence[Boundary], start_version: int) -> list[int]:
    """Per-token versions from the swaps a request saw, in order."""
    out = [start_version] * num_tokens
    for b in sorted(boundaries, key=lambda b: b.num_tokens):
        start = min(max(b.num_tokens, 0), num_tokens)
        out[start:] = [b.version] * (num_tokens - start)
    return out


def token_versions(num_tokens: int, spans: Sequence[Any] | None, boundaries: Sequence[Boundary], start_version: int) -> list[int]:
    """Each response token's policy version: vLLM's spans where it gives them, else the
    adapter's boundaries."""
    if spans:
        return versions_from_spans(num_tokens, spans, start_version)
    return versions_from_boundaries(num_tokens, boundaries, start_version)
