"""LoRA for the vLLM rollout engine, through vLLM's own LoRA support.

UNTESTED HERE (no GPU): written against vLLM's documented offline API, ``LLM(...,
enable_lora=True, max_lora_rank=R, max_loras=1)`` and ``LLM.generate(...,
lora_request=LoRARequest(name, int_id, path))``; its test is marked ``gpu``.

The adapters of a weight version (``engines/lora.py``'s wire form) are written as a
peft adapter directory (vLLM loads adapters from disk) and become a new
``LoRARequest`` with an id of its own; every ``generate`` after that passes it. vLLM
applies the adapter un-merged, in its LoRA kernels, on top of the base weights it
loaded from ``model_dir``: the base never changes, so a new adapter replaces the old
one. vLLM loads an adapter at the first request that names it, so the two newest
directories are kept; older ones are deleted (vLLM's own LRU cache, ``max_loras=1``,
evicts their weights).

Invariant: with ``max_lora_rank = 0`` nothing here changes how the engine runs.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from asyncflow.engines.lora import ADAPTER_DIR, Adapter, load_adapter, save_adapter, split

VLLM_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""
NUM_KEPT = 2


def llm_kwargs(max_lora_rank: int) -> dict[str, Any]:
    """Extra ``vllm.LLM`` arguments for adapters up to ``max_lora_rank`` (none for 0)."""
    if max_lora_rank == 0:
        return {}
    slots = next((r for r in VLLM_RANKS if r >= max_lora_rank), None)
    if slots is None:
        raise ValueError(f"rollout.engine.max_lora_rank = {max_lora_rank}: vLLM supports LoRA ranks up to {VLLM_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": slots, "max_loras": 1}


class VLLMAdapters:
    """The adapter a vLLM engine generates with: ``request`` (None: the base model)."""

    def __init__(self, model_dir: str | Path, max_lora_rank: int):
        self.max_lora_rank = max_lora_rank
        self.model_dir = Path(model_dir)
        self.request: Any = None  # vllm.lora.request.LoRARequest
        self._dirs: list[Path] = []
        self._num_made = 0
        self._root: Path | None = None
        start = self.model_dir / ADAPTER_DIR
        if (start / "adapter_model.safetensors").is_file():  # a LoRA checkpoint: base weights + adapter
            self._use(load_adapter(start), version=0)

    def take(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> list[tuple[str, torch.Tensor]]:
        """Make the adapters among ``named_tensors`` the ones generated with; the
        other (full) tensors, for the engine's own ``load_weights``."""
        full, adapters = split(named_tensors)
        if adapters:
            self._use(adapters, version)
        return full

    def _use(self, adapters: dict[str, Adapter], version: int) -> None:
        from vllm.lora.request import LoRARequest

        first = next(iter(adapters.values()))
        rank = first.A_RI.shape[0]
        if rank > self.max_lora_rank:
            raise ValueError(
                f"an adapter of rank {rank} arrived but vLLM was started for ranks up to {self.max_lora_rank}: "
                "set rollout.engine.max_lora_rank >= train.engine.lora.rank"
            )
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="asyncflow-vllm-lora-"))
        targets = {module.rsplit(".", 1)[-1] for module in adapters}
        alpha = float(first.scaling) * rank
        path = save_adapter(self._root / f"v{version}", adapters, rank, alpha, 0.0, targets, str(self.model_dir))
        self._dirs.append(path)
        self._num_made += 1
        # a fresh id per adapter: vLLM caches adapters by id, so a reused id would keep the old weights
        self.request = LoRARequest(f"asyncflow-v{version}-{self._num_made}", self._num_made, str(path))
        for old in self._dirs[:-NUM_KEPT]:
            shutil.rmtree(old, ignore_errors=True)
        self._dirs = self._dirs[-NUM_KEPT:]

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
