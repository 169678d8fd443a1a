"""Every family of ``engines/families`` on a tiny random model built with transformers'
own config class (``families.py``): the native engine computes the Hugging Face
forward's log-probs within 1e-4 in float32, over prompt and generated tokens, with
the prefix cache, across a weight swap mid-stream, in sliding-window layers past the
window, and through MoE layers whose experts differ."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.factory import build_rollout_engine

sys.path.insert(0, os.path.dirname(__file__))
from families import FAMILIES, MOE, WINDOW, WINDOWED, make_family_model  # noqa: E402
from test_partial_stream import _logps_on_kept_kv  # noqa: E402

PROMPTS = [[4, 9, 16, 10, 20, 5, 30, 31, 12, 13, 40, 41, 8, 5], [4, 12, 5], [4] + [9, 10, 11] * 5 + [5]]
"""Two of them longer than the window (8)."""

_dirs: dict[str, object] = {}


@pytest.fixture(params=FAMILIES)
def family(request, tmp_path_factory):
    name = request.param
    if name not in _dirs:
        _dirs[name] = make_family_model(tmp_path_factory.mktemp(name), name)
    return name, _dirs[name]


def _engine(model_dir, version: int = 0, **kw):
    cfg = dict(max_batch_size=8, kv_cache_bytes=1 << 20, kv_block_tokens=4)
    cfg.update(kw)
    return build_rollout_engine(RolloutEngineConfig(**cfg), model_dir, version=version)


def _hf(model_dir, weights=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(dict(weights), strict=False)
    return model


@torch.no_grad()
def _hf_logps(model, prompt, response) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    return logp[torch.arange(len(prompt) - 1, ids.shape[1] - 1), torch.tensor(response)]


def _assert_hf_logps(model, prompts, out) -> None:
    for c in out:
        want = _hf_logps(model, prompts[c.prompt_index], c.response_ids)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0), (c.prompt_index, c.sample_index)


@pytest.mark.timeout(120)
def test_the_native_forward_gives_the_hf_forwards_logprobs_at_every_prompt_and_generated_position(family):
    name, model_dir = family
    engine = _engine(model_dir)
    hf = _hf(model_dir)
    seq = PROMPTS[2] + [30, 31, 32, 5, 9, 40, 41, 42, 12, 7]  # 27 tokens: past the window several times
    with torch.no_grad():
        want_TV = torch.log_softmax(hf(torch.tensor([seq])).logits[0].float(), dim=-1)
    # a prefill of the first 5 tokens, then one token per step through the rest: both paths, every position
    pool, dec = engine.pool, engine.decoder
    blocks = pool.allocate(len(seq))
    slots_1K = pool.slots(blocks).unsqueeze(0)
    got = [dec.step(pool, torch.tensor([seq[:5]]), torch.arange(5).unsqueeze(0), None, slots_1K[:, :5], torch.tensor([4]))]
    for t in range(5, len(seq)):
        got.append(dec.step(pool, torch.tensor([[seq[t]]]), torch.tensor([[t]]), None, slots_1K[:, : t + 1], torch.tensor([0])))
    pool.free(blocks)
    got_TV = torch.log_softmax(torch.cat(got), dim=-1)
    assert torch.allclose(got_TV, want_TV[4:], atol=1e-4, rtol=0), (got_TV - want_TV[4:]).abs().max()


@pytest.mark.timeout(120)
def test_sampled_logprobs_equal_the_hf_forwards_and_a_second_turn_from_the_prefix_cache_does_too(family):
    name, model_dir = family
    engine = _engine(model_dir)
    hf = _hf(model_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=14, n=2, stop_token_ids=(), seed=1)
    out = engine.generate(PROMPTS, params)
    assert len(out) == 6
    _assert_hf_logps(hf, PROMPTS, out)
    # the next turn of each conversation starts with the first: its full blocks come from the cache
    turns = [PROMPTS[c.prompt_index] + c.response_ids + [4, 9] for c in out if c.sample_index == 0]
    second = engine.generate(turns, SamplingParams(temperature=1.0, max_new_tokens=6, n=1, stop_token_ids=(), seed=2))
    assert engine.stats.prefix_cached_tokens > 0
    _assert_hf_logps(hf, turns, second)


@pytest.mark.timeout(120)
def test_a_weight_swap_mid_stream_samples_each_token_from_its_own_weights(family):
    name, model_dir = family
    engine = _engine(model_dir, version=3)
    g = torch.Generator().manual_seed(5)
    new_weights = [(n, t + 0.05 * torch.randn(t.shape, generator=g)) for n, t in _hf(model_dir).named_parameters()]
    stream = engine.open_stream(SamplingParams(n=1, max_new_tokens=10, stop_token_ids=(), seed=7))
    stream.add(PROMPTS[:2])
    done = []
    for _ in range(4):  # tokens 0..4 under version 3
        done += stream.step()
    engine.load_weights(new_weights, version=4)
    while stream.num_active:
        done += stream.step()
    stream.close()
    old, new = _hf(model_dir), _hf(model_dir, new_weights)
    for c in done:
        assert c.token_versions == [3] * 5 + [4] * 5
        prompt = PROMPTS[c.prompt_index]
        got = torch.tensor(c.logprobs)
        assert torch.allclose(got[:5], _hf_logps(old, prompt, c.response_ids)[:5], atol=1e-4, rtol=0)
        kept = _logps_on_kept_kv(old, new, prompt, c.response_ids, fed_before_swap=4)
        assert torch.allclose(got[5:], kept, atol=1e-4, rtol=0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", WINDOWED)
def test_a_sliding_window_layer_attends_only_the_window_past_its_length(name, tmp_path):
    """The same weights with the window widened to the whole context compute other
    log-probs: the window is what the native engine matched, not a coincidence."""
    model_dir = _dirs.get(name) or make_family_model(tmp_path / name, name)
    engine = _engine(model_dir)
    out = engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12, n=1, stop_token_ids=(), seed=3))
    windowed = _hf(model_dir)
    _assert_hf_logps(windowed, PROMPTS, out)
    assert len(PROMPTS[0]) + 12 > 2 * WINDOW
    wide = _hf(model_dir)
    wide.config.sliding_window = 10_000
    for layer in wide.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 10_000
    assert not torch.allclose(torch.tensor(out[0].logprobs), _hf_logps(wide, PROMPTS[0], out[0].response_ids), atol=1e-3)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", MOE)
def test_every_moe_layer_routes_tokens_to_several_experts_that_compute_different_things(name, tmp_path):
    model_dir = _dirs.get(name) or make_family_model(tmp_path / name, name)
    engine = _engine(model_dir)
    moe_layers = [L for L in engine.decoder.layers if L.moe]
    assert moe_layers
    experts = moe_layers[0].module.mlp.experts
    assert not torch.allclose(experts.gate_up_proj[0], experts.gate_up_proj[1])
    hf = _hf(model_dir)
    seen: set[int] = set()
    first = next(layer for layer in hf.model.layers if hasattr(layer.mlp, "experts"))
    hook = first.mlp.gate.register_forward_hook(lambda _m, _i, out: seen.update(out[2].reshape(-1).tolist()))
    with torch.no_grad():
        hf(torch.tensor([PROMPTS[0]]))
    hook.remove()
    assert len(seen) > hf.config.num_experts_per_tok  # the tokens went to more experts than one token's top k
    out = engine.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=1, stop_token_ids=(), seed=4))
    _assert_hf_logps(hf, PROMPTS, out)


def test_every_family_the_native_engine_implements_has_a_row_in_the_models_page():
    from pathlib import Path

    from asyncflow.engines.families import FAMILIES

    page = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    assert [t for t in FAMILIES if f"`{t}`" not in page] == []
