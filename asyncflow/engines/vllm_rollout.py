"""The vLLM rollout engine, on vLLM's interface for RL frameworks: vLLM on CUDA GPUs
(``type = "vllm"``) and vLLM with the vllm-ascend plugin on Ascend NPUs
(``type = "vllm_ascend"``). docs/vllm.md says how it works and how to check it.

UNTESTED HERE: this machine has no GPU or NPU. Written against vLLM's documented RL
interface (docs/training: weight_transfer, async_rl) and checked against the source of
the release ``scripts/gpu_check.sh`` pins (0.33.0), which runs the ``gpu``-marked tests.

How it maps the interface (engines/base.py):
- One ``vllm.AsyncLLM`` (vLLM's V1 async engine) runs on an asyncio loop in a thread
  of its own; ``generate`` submits every request to it and waits. Prompts and
  responses are token ids (``TokensPrompt``, ``detokenize=False``, no tokenizer
  loaded): a multi-turn continuation is the exact ids, and prefix caching reuses the
  KV of the turns before. Requests from several threads run batched together.
- ``load_weights`` goes through vLLM's weight-transfer API: a trainer-side
  ``TrainerWeightTransferEngine`` in this process (vLLM's
  ``WeightTransferTrainerFactory.trainer_init`` with ``IPCTrainerInitInfo``) hands the
  tensors the replica received, on this GPU, to vLLM's worker as CUDA IPC handles
  (``weight_transfer = "ipc"``), through a ``VLLMWeightSyncClient`` over the
  in-process engine (``start_weight_update`` / ``update_weights`` /
  ``finish_weight_update``, then ``update_weight_version(str(version))``). With the
  ``collective`` weight transport the trainer's NCCL broadcast lands on this GPU, so
  the bytes never pass through host memory. With tensor parallelism and on Ascend
  (``"rpc"``) the tensors go by ``collective_rpc`` to the worker extension in
  ``vllm_worker.py``, which calls the model's own ``load_weights`` (vLLM's NCCL engine
  is not used within a replica: this process shares its GPU with worker 0, and NCCL
  refuses two ranks on one device).
- Partial rollout: ``load_weights`` may be called while requests are in flight (from
  ``generate``'s ``between_steps`` hook or another thread). It pauses generation with
  ``pause_generation(mode="keep")``, which freezes every request with its tokens,
  loads the weights, labels them with the version and resumes: the requests go on
  under the new weights. ``partial_kv`` says whether their KV cache is kept (stale by
  one version for the context so far; no recomputation) or dropped (vLLM recomputes
  the prefix under the new weights). Each token's version comes from vLLM's
  ``weight_versions`` spans, or where the installed vLLM has none, from the number of
  tokens each request had returned when generation paused.
- KV budget: ``kv_cache_fraction`` becomes ``gpu_memory_utilization``;
  ``kv_cache_bytes`` becomes ``kv_cache_memory_bytes``.
- LoRA (``max_lora_rank > 0``): adapters go to vLLM's LoRA support
  (``engines/vllm_lora.py``), named in every request; the full tensors of a version,
  if any, load as above.

Invariants:
- vllm, vllm_ascend and torch_npu are imported only when this engine is built, never
  by ``asyncflow.engines.factory`` itself.
- Weights change only inside ``load_weights``, with no request running (paused or
  none in flight); ``version`` changes with them, and every request that spans a
  change reports per-token versions.
- A failure on the engine's loop reaches the caller of ``generate`` or
  ``load_weights`` as an exception; generation is resumed even when a load fails.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from asyncflow.engines.base import Completion, RolloutEngine, chunk_by_bytes
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.vllm_lora import VLLMAdapters, llm_kwargs
from asyncflow.engines.vllm_requests import (
    Boundary,
    engine_kwargs,
    finish_reason,
    sampled_logprobs,
    samples_per_request,
    sampling_kwargs,
    token_prompt,
    token_versions,
    weight_transfer_backend,
)
from asyncflow.engines.vllm_worker import WeightSyncExtension

T = TypeVar("T")

WEIGHT_CHUNK_BYTES = 256 * 2**20
"""rpc path: tensors per ``collective_rpc`` call."""
POLL_S = 0.05
"""How often ``generate`` calls its ``between_steps`` hook while requests run."""
CALL_TIMEOUT_S = 600.0
"""Longest wait for one engine call (a weight update, a pause) before it is an error."""
WORKER_EXTENSION = f"{WeightSyncExtension.__module__}.{WeightSyncExtension.__qualname__}"
"""vLLM's ``worker_extension_cls``: a dotted qualified name (vLLM resolves it with
``rsplit(".", 1)``; a ``module:Class`` path would not resolve), made from the class."""


def _require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(
            f"rollout engine needs {module!r}: pip install -e '.[{extra}]' (in the asyncflow checkout), or set type = \"auto\""
        )


class _Loop:
    """An asyncio loop in a daemon thread; ``run`` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-engine-loop", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = CALL_TIMEOUT_S) -> T:
        return self.submit(coro).result(timeout=timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class _EngineClient:
    """vLLM's ``VLLMWeightSyncClient`` protocol (four methods, structural) over the
    ``AsyncLLM`` in this process: what vLLM's Ray and HTTP clients do for a remote one."""

    def __init__(self, loop: _Loop, llm: Any):
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest

        self.loop, self.llm = loop, llm
        self._init_request, self._update_request = WeightTransferInitRequest, WeightTransferUpdateRequest

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.loop.run(self.llm.init_weight_transfer_engine(self._init_request(init_info=init_info)))

    def start_weight_update(self) -> None:
        self.loop.run(self.llm.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        self.loop.run(self.llm.update_weights(self._update_request(update_info=update_info)))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.loop.run(self.llm.finish_weight_update())
        if weight_version is not None:
            self.loop.run(self.llm.update_weight_version(weight_version))


def _received_weights_source(named: list[tuple[str, torch.Tensor]]) -> Any:
    """A vLLM ``WeightSource`` over one version's tensors (all of the model's, or the
    subset a load gives): ``metadata`` (vLLM wants it a cached property) and
    ``iter_full`` describe the same list, so they agree by construction."""
    from functools import cached_property

    from vllm.distributed.weight_transfer import ParamMeta, WeightSource

    class ReceivedWeights(WeightSource):  # vllm is untyped here (ignore_missing_imports): WeightSource is Any
        @cached_property
        def metadata(self) -> list:
            return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in named]

        def iter_full(self):
            return iter(named)

    return ReceivedWeights()


@dataclass
class _Request:
    """One request in flight: what its samples had returned, and the swaps it saw."""

    num_samples: int
    counts: list[int] = field(default_factory=list)
    boundaries: list[list[Boundary]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.counts = [0] * self.num_samples
        self.boundaries = [[] for _ in range(self.num_samples)]


class VLLMRolloutEngine(RolloutEngine):
    def __init__(self, cfg: RolloutEngineConfig, model_dir: str | Path, version: int = 0):
        if cfg.type == "vllm_ascend":
            _require("torch_npu", "npu")
            _require("vllm_ascend", "npu")
            importlib.import_module("torch_npu")  # registers the npu device before vLLM's platform detection
        _require("vllm", "gpu")
        # the replica process runs threads (the actor's listener, the weight fetcher): vLLM
        # must start its engine process by spawn, since a fork of a threaded process can
        # inherit a lock held by another thread and hang
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        self.cfg = cfg
        self.backend = weight_transfer_backend(cfg)
        # where the replica's weight receiver puts tensors: the GPU vLLM's IPC transfer
        # reads from; host memory for the rpc path (pickled to the workers)
        self.device = torch.device("cuda", cfg.device_index) if self.backend == "ipc" else torch.device("cpu")
        self._version = version
        self._lock = threading.Lock()  # one weight update at a time; no submission during one
        self._requests: dict[str, _Request] = {}  # on the loop's thread only
        self._stale_prefix_cache = False  # a swap kept KV of old weights: reset when idle
        # LoRA (max_lora_rank > 0): adapters go to vLLM's own LoRA support (vllm_lora.py)
        self.adapters = VLLMAdapters(model_dir, cfg.max_lora_rank)
        self._loop = _Loop()
        if self.backend == "ipc":
            # CUDA IPC handles are tuples vLLM's msgpack channel to its engine process
            # carries only as pickles; that channel is local to this process and the
            # engine process it starts (vLLM's own examples set the same)
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            self.llm = self._loop.run(self._start(model_dir))
            self._loop.run(self.llm.update_weight_version(str(version)))
        except BaseException:
            self._loop.close()
            raise

    async def _start(self, model_dir: str | Path) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_kwargs(self.cfg, model_dir, WORKER_EXTENSION) | llm_kwargs(self.cfg.max_lora_rank)
        if self.backend == "ipc":
            from vllm.config import WeightTransferConfig

            kwargs["weight_transfer_config"] = WeightTransferConfig(backend=self.backend)
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

    def _trainer_side(self, source: Any) -> Any:
        """vLLM's trainer-side IPC transfer engine, this process as the sender (rank 0),
        on the current CUDA device (vLLM reads it at construction)."""
        from vllm.distributed.weight_transfer import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return WeightTransferTrainerFactory.trainer_init(
            init_info=IPCTrainerInitInfo(rank=0), client=_EngineClient(self._loop, self.llm), source=source
        )

    @property
    def version(self) -> int:
        return self._version

    # -- generation ------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, between_steps: Callable[[], None] | None = None
    ) -> list[Completion]:
        """As ``RolloutEngine.generate``; ``between_steps`` (optional) is called in this
        thread every ``POLL_S`` while requests run, e.g. to swap in weights that
        arrived (partial rollout): completions then carry ``token_versions``."""
        from vllm import SamplingParams as VSamplingParams

        vparams = VSamplingParams(**sampling_kwargs(params))
        with self._lock:  # not while weights are being loaded
            start = self._version
            n = samples_per_request(params)
            futures = [self._loop.submit(self._one(token_prompt(p), vparams, n)) for p in prompts]
        pending = set(futures)
        while pending:
            _, pending = wait(pending, timeout=POLL_S)
            if pending and between_steps is not None:
                between_steps()
        completions = []
        for p, fut in enumerate(futures):
            samples, req = fut.result()
            if len(samples) < params.n:  # greedy: one answer, repeated (samples_per_request)
                samples, req.boundaries = samples * params.n, req.boundaries * params.n
            for s, sample in enumerate(samples):
                ids = [int(t) for t in sample.token_ids]
                if sample.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vLLM ended a request with finish_reason {sample.finish_reason!r}")
                versions = token_versions(len(ids), getattr(sample, "weight_versions", None), req.boundaries[s], start)
                completions.append(
                    Completion(
                        prompt_index=p,
                        sample_index=s,
                        response_ids=ids,
                        logprobs=sampled_logprobs(ids, sample.logprobs),
                        finish_reason=finish_reason(ids, params.stop_token_ids),
                        version=min(versions, default=start),
                        token_versions=versions,
                    )
                )
        return completions

    async def _one(self, prompt: dict, vparams: Any, n: int) -> tuple[list[Any], _Request]:
        """One prompt's request on the loop: the final output of each of its ``n``
        samples (index order), and the swaps it saw. Outputs stream cumulatively; with
        n > 1 vLLM may put one sample in each, so the latest of each index is kept."""
        rid = uuid.uuid4().hex
        req = self._requests[rid] = _Request(n)
        latest: dict[int, Any] = {}
        try:
            async for out in self.llm.generate(prompt, vparams, request_id=rid, lora_request=self.adapters.request):
                for sample in out.outputs:
                    latest[sample.index] = sample
                    req.counts[sample.index] = len(sample.token_ids)
        finally:
            del self._requests[rid]
            if not self._requests and self._stale_prefix_cache:
                self._stale_prefix_cache = not await self.llm.reset_prefix_cache()
        if sorted(latest) != list(range(n)):
            raise RuntimeError(f"vLLM returned samples {sorted(latest)} for a request of n={n}")
        return [latest[i] for i in range(n)], req

    def num_tokens_in_flight(self) -> int:
        """Response tokens the requests now running have returned so far (0 when none
        runs): lets a ``between_steps`` hook see that generation is under way."""
        return self._loop.run(self._count())

    async def _count(self) -> int:
        return sum(sum(req.counts) for req in self._requests.values())

    # -- weights ---------------------------------------------------------------------

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load the weights into vLLM's workers; in the middle of a generation, pause
        the running requests (keeping their tokens), load, and resume them."""
        with self._lock:
            named_tensors = self.adapters.take(named_tensors, version)  # LoRA adapters: vLLM's LoRA support
            paused = self._loop.run(self._pause())
            try:
                if paused:
                    self._loop.run(self._mark_boundaries(version))
                self._transfer(named_tensors, version)
                self._version = version
            finally:
                if paused:
                    self._loop.run(self.llm.resume_generation())
            if not paused:  # cached prefixes were computed by the old weights
                self._loop.run(self.llm.reset_prefix_cache())

    async def _pause(self) -> bool:
        if not self._requests:
            return False
        recompute = self.cfg.partial_kv == "recompute"
        await self.llm.pause_generation(mode="keep", clear_cache=recompute)
        self._stale_prefix_cache = not recompute
        return True

    async def _mark_boundaries(self, version: int) -> None:
        """Record, per request in flight, how many tokens came before ``version``."""
        await asyncio.sleep(0)  # let outputs already produced reach their requests
        for req in self._requests.values():
            for s, count in enumerate(req.counts):
                req.boundaries[s].append(Boundary(count, version))

    def _transfer(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int) -> None:
        if not named_tensors:  # an adapter-only version (LoRA): nothing for the base weights
            pass
        elif self.backend == "rpc":
            for chunk in chunk_by_bytes(((n, t.detach().cpu()) for n, t in named_tensors), WEIGHT_CHUNK_BYTES):
                self._loop.run(self.llm.collective_rpc("asyncflow_load_weights", args=(chunk,)))
        else:
            torch.cuda.set_device(self.device)  # per thread: the actor's or the fetcher's
            named = [(n, t.detach().to(self.device).contiguous()) for n, t in named_tensors]
            # a trainer-side engine per load: IPC has no rendezvous (its init only tells the
            # worker the wire format), and a fresh source may hold any subset of the names
            sender = self._trainer_side(_received_weights_source(named))
            try:
                sender.send_weights()  # start_weight_update, update_weights (the handles), finish_weight_update
                torch.cuda.synchronize(self.device)
            finally:
                sender.shutdown()
                del named
        self._loop.run(self.llm.update_weight_version(str(version)))

    def close(self) -> None:
        try:
            self.llm.shutdown()
        finally:
            self._loop.close()
            self.adapters.close()
