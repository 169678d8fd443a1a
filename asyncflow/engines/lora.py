"""LoRA adapters as they travel and as a rollout engine applies them.

Shape legend: O output features, I input features, R adapter rank.

With ``train.engine.lora.rank > 0`` the trainer publishes only the adapters: for each
adapted linear layer ``M`` (a Hugging Face module name such as
``model.layers.0.self_attn.q_proj``) three tensors,

- ``M.lora_A.weight`` [R, I] and ``M.lora_B.weight`` [O, R] (peft's names, without
  the adapter name), and
- ``M.lora_scaling``, a 0-d float32 tensor (``alpha / rank``, peft's ``scaling``),

and a replica's effective weight is ``merge(base, A, B, scaling)``: its own base
weight plus ``scaling * B @ A``. The base copy is kept, so a new adapter replaces the
previous one instead of accumulating.

Invariants:
- ``merge`` is computed element by element in float32 (one multiply and one add per
  rank, in rank order), never by a matrix product, so ``merged_sample`` (the same
  arithmetic on the digest's sampled positions only) gives bit-identical values: the
  trainer computes the digest of a replica's merged weights from the base samples it
  cached and the adapter it published, without the full base weights
  (``engines/digest.py``, ``workflow.verify_weights``).
- An adapter whose B is zero (peft's initialisation) merges to the base weight
  exactly, so version 0 of a LoRA run has the base model's digest.
- The peft layout on disk (``adapter_config.json`` + ``adapter_model.safetensors``
  with keys ``base_model.model.M.lora_A.weight``) is what ``peft.PeftModel.from_pretrained``
  and vLLM's ``LoRARequest`` load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asyncflow.engines.config import LINEAR_MODULES  # noqa: F401 (re-exported: the layers LoRA may adapt)

LORA_A = ".lora_A.weight"
LORA_B = ".lora_B.weight"
LORA_SCALING = ".lora_scaling"
SUFFIXES = (LORA_A, LORA_B, LORA_SCALING)
PEFT_PREFIX = "base_model.model."
ADAPTER_DIR = "adapter"
"""A checkpoint's adapter, in peft's layout, beside its base weights (``step_N/model/adapter``)."""
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

"""The linear layers of a decoder block that adapters may target (the native engine
computes each with its ``weight``)."""


FUSED_PROJECTIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""Linear layers some families fuse (Phi-3): adapted when any of their parts is named."""


def language_model(lm: Any) -> str:
    """The name of the module that is the language model (``get_decoder``): ``model`` of
    ``LlamaForCausalLM``, ``transformer`` of GPT-2, ``model.language_model`` of a multimodal
    Gemma 3, whose vision tower trains on no token here."""
    decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else None
    return next((name for name, m in lm.named_modules() if m is decoder), "")


def within(name: str, prefix: str) -> bool:
    """Module ``name`` is ``prefix``'s or below it (any module for an empty prefix)."""
    return not prefix or name.startswith(prefix + ".")


def lora_targets(lm: torch.nn.Module, requested: Iterable[str]) -> list[str]:
    """``lora.target_modules`` as this model names its linear layers: a fused layer
    (``qkv_proj``, ``gate_up_proj``) stands for the parts it holds where the model has no
    separate ones."""
    requested = list(requested)
    linear = {name.rsplit(".", 1)[-1] for name, m in lm.named_modules() if isinstance(m, torch.nn.Linear)}
    targets = list(requested)
    for fused, parts in FUSED_PROJECTIONS.items():
        named = [p for p in parts if p in requested]
        if fused in linear and named and not any(p in linear for p in parts):
            targets = [t for t in targets if t not in parts] + [fused]
    return targets


def target_refusal(lm: torch.nn.Module, requested: Iterable[str]) -> str | None:
    """Why ``lora.target_modules`` adapt no layer of the language model of ``lm`` (built on
    the meta device will do: only names are read), or None."""
    targets = lora_targets(lm, requested)
    decoder = language_model(lm)
    linear = [
        n
        for n, m in lm.named_modules()
        if (isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D") and within(n, decoder)  # GPT-2's Conv1D
    ]
    if any(n.rsplit(".", 1)[-1] in targets for n in linear):
        return None
    names = sorted({n.rsplit(".", 1)[-1] for n in linear})
    model_type = getattr(getattr(lm, "config", None), "model_type", "?")
    return (
        f"no layer of the model ({model_type!r}) has these names (its linear layers: {', '.join(names) or 'none'}), and LoRA "
        "here adapts layers named as Llama's (or Phi-3's fused qkv_proj, gate_up_proj); set train.engine.lora.rank = 0 to "
        "train every weight"
    )


@dataclass
class Adapter:
    """One layer's adapter: ``weight += scaling * B_OR @ A_RI``."""

    A_RI: torch.Tensor
    B_OR: torch.Tensor
    scaling: torch.Tensor
    """0-d float32."""

    def tensors(self, module: str) -> list[tuple[str, torch.Tensor]]:
        """The wire form: three named tensors."""
        return [(module + LORA_A, self.A_RI), (module + LORA_B, self.B_OR), (module + LORA_SCALING, self.scaling)]


def is_adapter_name(name: str) -> bool:
    return name.endswith(SUFFIXES)


def split(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Adapter]]:
    """Full tensors, and the adapters (by module) among ``named_tensors``; an adapter
    that lacks one of its three tensors is an error naming it."""
    full: list[tuple[str, torch.Tensor]] = []
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            full.append((name, tensor))
        else:
            parts.setdefault(name.removesuffix(suffix), {})[suffix] = tensor
    adapters = {}
    for module, got in parts.items():
        missing = [s for s in SUFFIXES if s not in got]
        if missing:
            raise ValueError(f"adapter of {module!r} arrived without {missing}: a weight version carries all three tensors")
        adapters[module] = Adapter(got[LORA_A], got[LORA_B], got[LORA_SCALING].reshape(()).to(torch.float32))
    return full, adapters


def _scaled_B(adapter: Adapter, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    scaling = adapter.scaling.to(device=device, dtype=torch.float32)
    return adapter.A_RI.to(device=device, dtype=torch.float32), adapter.B_OR.to(device=device, dtype=torch.float32) * scaling


def merge(base_OI: torch.Tensor, adapter: Adapter, dtype: torch.dtype) -> torch.Tensor:
    """``base + scaling * B @ A`` in ``dtype``, computed element by element in float32
    (see the module's invariants)."""
    A_RI, sB_OR = _scaled_B(adapter, base_OI.device)
    acc_OI = base_OI.to(dtype).to(torch.float32)
    for k in range(A_RI.shape[0]):
        acc_OI = acc_OI + sB_OR[:, k : k + 1] * A_RI[k : k + 1, :]
    return acc_OI.to(dtype)


def merged_sample(base_sample: torch.Tensor, index: torch.Tensor | None, adapter: Adapter, dtype: torch.dtype) -> torch.Tensor:
    """``merge(...)``'s elements at the flat positions ``index`` (None: all) of the
    weight, from the base's elements there: the same arithmetic, in float32."""
    A_RI, sB_OR = _scaled_B(adapter, base_sample.device)
    num_in = A_RI.shape[1]
    flat = torch.arange(sB_OR.shape[0] * num_in, device=base_sample.device) if index is None else index
    rows, cols = flat // num_in, flat % num_in
    acc = base_sample.to(dtype).to(torch.float32)
    for k in range(A_RI.shape[0]):
        acc = acc + sB_OR[rows, k] * A_RI[k, cols]
    return acc


# -- peft's layout on disk -----------------------------------------------------------


def save_adapter(
    out: str | Path,
    adapters: dict[str, Adapter],
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: Iterable[str],
    base_model: str,
    exclude_modules: Iterable[str] = (),
) -> Path:
    """Write ``adapters`` as a peft adapter directory (``adapter_config.json`` +
    ``adapter_model.safetensors``); returns it. ``exclude_modules``: layers of the target
    names that were not adapted (a multimodal model's vision tower)."""
    import safetensors.torch
    from peft import LoraConfig

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates int; it takes any number (alpha / r)
        lora_dropout=dropout,
        target_modules=sorted(target_modules),
        exclude_modules=sorted(exclude_modules) or None,
        base_model_name_or_path=base_model,
        task_type="CAUSAL_LM",
    ).save_pretrained(str(path))
    tensors = {}
    for module, a in adapters.items():
        tensors[PEFT_PREFIX + module + LORA_A] = a.A_RI.detach().to("cpu").contiguous()
        tensors[PEFT_PREFIX + module + LORA_B] = a.B_OR.detach().to("cpu").contiguous()
    safetensors.torch.save_file(tensors, path / WEIGHTS_FILE, metadata={"format": "pt"})
    return path


def load_adapter(path: str | Path) -> dict[str, Adapter]:
    """The adapters of a peft adapter directory (by Hugging Face module name), with
    the scaling its config gives (``lora_alpha / r``; rsLoRA: ``/ sqrt(r)``)."""
    import safetensors.torch

    src = Path(path)
    config = json.loads((src / CONFIG_FILE).read_text())
    rank = int(config["r"])
    alpha = float(config["lora_alpha"])
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    tensors = safetensors.torch.load_file(src / WEIGHTS_FILE)
    named: list[tuple[str, torch.Tensor]] = []
    for key, t in tensors.items():
        name = key.removeprefix(PEFT_PREFIX)
        if name.endswith(LORA_A):
            named.append((name, t))
            named.append((name.removesuffix(LORA_A) + LORA_SCALING, torch.tensor(scaling, dtype=torch.float32)))
        elif name.endswith(LORA_B):
            named.append((name, t))
        else:
            raise ValueError(f"{src / WEIGHTS_FILE}: {key!r} is not a LoRA A or B tensor")
    return split(named)[1]
