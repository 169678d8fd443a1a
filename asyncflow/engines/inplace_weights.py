"""What every rollout engine that runs a Hugging Face model in this process shares (the
native and the hf engines): its weights replaced in place, LoRA adapters merged onto a
kept base, the digest read back from the model, and the KV budget from the config.

Invariants:
- Weights are the model's own parameters (``named_parameters``), copied into in place:
  a forward that holds references to them computes with the new values, no refresh.
- A tied alias (``lm_head.weight`` tied to the embeddings: a name
  ``named_parameters`` drops because its tensor is another's) is skipped; an unknown
  name is a KeyError naming it, a shape mismatch a ValueError; nothing before the bad
  tensor is undone (the caller's version does not change).
- Each adapter is merged onto the base weight kept aside the first time a layer is
  adapted, so adapters replace one another and never accumulate; a full tensor for an
  adapted weight replaces its base and drops the adapter.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from asyncflow.engines.config import RolloutEngineConfig
from asyncflow.engines.device import free_memory_bytes
from asyncflow.engines.lora import ADAPTER_DIR, Adapter, load_adapter, merge, split

DEFAULT_KV_CACHE_BYTES = 64 * 2**20
"""The KV budget when the config gives neither ``kv_cache_bytes`` nor a fraction."""


def kv_budget_bytes(cfg: RolloutEngineConfig, device: torch.device) -> int:
    """``kv_cache_bytes``, or ``kv_cache_fraction`` of the device's free memory, or the default."""
    if cfg.kv_cache_bytes is not None and cfg.kv_cache_fraction is not None:
        raise ValueError("set kv_cache_bytes or kv_cache_fraction, not both")
    if cfg.kv_cache_fraction is not None:
        if not 0.0 < cfg.kv_cache_fraction <= 1.0:
            raise ValueError(f"kv_cache_fraction={cfg.kv_cache_fraction} must be in (0, 1]")
        return int(free_memory_bytes(device) * cfg.kv_cache_fraction)
    return cfg.kv_cache_bytes if cfg.kv_cache_bytes is not None else DEFAULT_KV_CACHE_BYTES


class InPlaceWeights:
    """The parameters of ``model`` by name, loaded into in place (module docstring)."""

    def __init__(self, model: torch.nn.Module, model_dir: str | Path):
        self.params = dict(model.named_parameters())
        self.aliases = {n for n, _ in model.named_parameters(remove_duplicate=False)} - set(self.params)
        self._lora_base: dict[str, torch.Tensor] = {}  # adapted weight -> its base (before any adapter)
        adapter_dir = Path(model_dir) / ADAPTER_DIR
        if (adapter_dir / "adapter_model.safetensors").is_file():  # a LoRA checkpoint: base weights + adapter
            self.merge(load_adapter(adapter_dir))

    def digest(self) -> int:
        from asyncflow.engines.digest import weights_digest

        return weights_digest(self.params.items())

    @torch.inference_mode()
    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        full, adapters = split(named_tensors)
        for name, tensor in full:
            self._lora_base.pop(name, None)
            param = self.params.get(name)
            if param is None:
                if name in self.aliases:
                    continue  # tied to another parameter, which arrives under its own name
                raise KeyError(
                    f"weight {name!r} is not a parameter of the rollout model; do both engines load the same model_dir?"
                )
            if param.shape != tensor.shape:
                raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)} != model's {tuple(param.shape)}")
            param.copy_(tensor)
        self.merge(adapters)

    @torch.inference_mode()
    def merge(self, adapters: dict[str, Adapter]) -> None:
        """Each adapted weight := its base + the adapter (``lora.merge``)."""
        for module, adapter in adapters.items():
            name = module + ".weight"
            param = self.params.get(name)
            if param is None:
                raise KeyError(f"adapter for {module!r}: the rollout model has no weight {name!r}; same model_dir on both sides?")
            shape = (adapter.B_OR.shape[0], adapter.A_RI.shape[1])
            if tuple(param.shape) != shape:
                raise ValueError(f"adapter for {module!r} makes a {shape} update of a {tuple(param.shape)} weight")
            base = self._lora_base.setdefault(name, param.detach().clone())
            param.copy_(merge(base, adapter, param.dtype))
