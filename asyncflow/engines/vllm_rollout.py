"""The vLLM rollout engine: vLLM on CUDA GPUs (``type = "vllm"``) and vLLM with the
vllm-ascend plugin on Ascend NPUs (``type = "vllm_ascend"``).

UNTESTED HERE: this machine has no GPU or NPU. The adapter is written against
vLLM's documented offline API (``vllm.LLM``, ``SamplingParams(logprobs=0)``,
``LLM.collective_rpc`` with a ``worker_extension_cls``, ``LLM.reset_prefix_cache``);
its tests are marked ``gpu`` / ``npu``.

How it maps the interface:
- ``generate``: token-id prompts, ``n`` samples each, ``logprobs=0`` returns the
  sampled token's log-prob; ``ignore_eos=True`` with explicit ``stop_token_ids``
  gives the native engine's stop semantics (stop only on the listed tokens, the stop
  token kept in the response). Log-probs use ``logprobs_mode="processed_logprobs"``
  so that they are taken after temperature scaling, like the native engine's
  (identical when top-k/top-p are off).
- ``load_weights``: (name, tensor) pairs go to every worker through
  ``collective_rpc("asyncflow_load_weights")`` and the model's own ``load_weights``
  (Hugging Face names, tensor-parallel sharding handled by vLLM), in chunks of
  ``WEIGHT_CHUNK_BYTES``; then the prefix cache is reset, since cached KV blocks
  were computed by the old weights.
- LoRA (``max_lora_rank > 0``): adapters go to vLLM's LoRA support
  (``engines/vllm_lora.py``); the full tensors of a version, if any, load as above.
- KV budget: ``kv_cache_fraction`` becomes ``gpu_memory_utilization`` (vLLM admits
  sequences only while their KV blocks fit, and preempts rather than running out);
  ``kv_cache_bytes`` becomes ``kv_cache_memory_bytes``.

Invariant: vllm, vllm_ascend and torch_npu are imported only when this engine is
built, never by ``asyncflow.engines.factory`` itself.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import torch

from asyncflow.engines.base import Completion, RolloutEngine, chunk_by_bytes
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.vllm_lora import VLLMAdapters, llm_kwargs
from asyncflow.engines.vllm_worker import WeightSyncExtension

WEIGHT_CHUNK_BYTES = 256 * 2**20
WORKER_EXTENSION = f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}"
"""vLLM's ``worker_extension_cls``: a dotted qualified name (vLLM resolves it with
``rsplit(".", 1)``; a ``module:Class`` path would not resolve), made from the class."""


def _require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(
            f"rollout engine needs {module!r}: pip install -e '.[{extra}]' (in the asyncflow checkout), or set type = \"native\""
        )


class VLLMRolloutEngine(RolloutEngine):
    def __init__(self, cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0):
        if cfg.type == "vllm_ascend":
            _require("torch_npu", "npu")
            _require("vllm_ascend", "npu")
            importlib.import_module("torch_npu")  # registers the npu device before vLLM's platform detection
        _require("vllm", "gpu")
        from vllm import LLM

        if cfg.kv_cache_bytes is not None and cfg.kv_cache_fraction is not None:
            raise ValueError("set kv_cache_bytes or kv_cache_fraction, not both")
        memory: dict[str, float] = {}
        if cfg.kv_cache_bytes is not None:
            memory["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
        else:
            memory["gpu_memory_utilization"] = cfg.kv_cache_fraction if cfg.kv_cache_fraction is not None else 0.85
        self.cfg = cfg
        self.llm = LLM(
            model=str(model_dir),
            dtype=cfg.dtype,
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_num_seqs=cfg.max_batch_size,
            seed=cfg.seed,
            enforce_eager=cfg.enforce_eager,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode="processed_logprobs",
            **memory,
            **llm_kwargs(cfg.max_lora_rank),
        )
        self._version = version
        self.adapters = VLLMAdapters(model_dir, cfg.max_lora_rank)

    @property
    def version(self) -> int:
        return self._version

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        from vllm import SamplingParams as VSamplingParams

        vparams = VSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,
            logprobs=0,
            seed=params.seed,
            detokenize=False,
        )
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, vparams, use_tqdm=False, lora_request=self.adapters.request)
        stop = set(params.stop_token_ids)
        completions = []
        for p, out in enumerate(outputs):
            for s, sample in enumerate(out.outputs):
                ids = list(sample.token_ids)
                logps = [step[t].logprob for t, step in zip(ids, sample.logprobs)]
                reason: Literal["stop", "length"] = "stop" if ids and ids[-1] in stop else "length"
                completions.append(Completion(p, s, ids, logps, reason, self._version))
        return completions

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        named_tensors = self.adapters.take(named_tensors, version)
        for chunk in chunk_by_bytes(named_tensors, WEIGHT_CHUNK_BYTES):
            self.llm.collective_rpc("asyncflow_load_weights", args=(chunk,))
        self.llm.reset_prefix_cache()
        self._version = version

    def close(self) -> None:
        self.adapters.close()
        del self.llm
