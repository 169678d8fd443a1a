"""Partial rollout in the native engine: a stream continues its sequences across a
weight swap between two decode steps (engines/native_rollout.py, NativeStream)."""

import torch
from transformers import AutoModelForCausalLM

from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.factory import build_rollout_engine

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5]]


def _engine(model_dir):
    return build_rollout_engine(RolloutEngineConfig(max_batch_size=8, kv_cache_bytes=1 << 20), model_dir, version=3)


def _model(model_dir, weights=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(dict(weights), strict=False)
    return model


def _perturbed(model_dir):
    """The model's weights with noise: another policy version."""
    g = torch.Generator().manual_seed(1)
    return [(n, t + 0.3 * torch.randn(t.shape, generator=g)) for n, t in _model(model_dir).named_parameters()]


@torch.no_grad()
def _logps(model, prompt, response):
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    return logp[torch.arange(len(prompt) - 1, ids.shape[1] - 1), torch.tensor(response)]


def test_a_stream_continues_its_sequences_across_a_swap_with_each_token_from_its_own_weights(qwen2_dir):
    engine = _engine(qwen2_dir)
    new_weights = _perturbed(qwen2_dir)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=12, stop_token_ids=(), seed=7))
    stream.add(PROMPTS)
    done = []
    for _ in range(4):  # step 1 prefills (token 0) and decodes (token 1); 3 more: tokens 0..4 under v3
        done += stream.step()
    engine.load_weights(new_weights, version=4)  # between two decode steps
    while stream.num_active:
        done += stream.step()
    stream.close()
    assert len(done) == 4 and engine.pool.used_bytes == 0
    old, new = _model(qwen2_dir), _model(qwen2_dir, new_weights)
    for c in done:
        assert c.token_versions == [3] * 5 + [4] * 7  # the tokens before the swap kept, each version recorded
        assert c.version == 3  # a completion's version: its oldest token's
        prompt = PROMPTS[c.prompt_index]
        got = torch.tensor(c.logprobs)
        lp_old, lp_new = _logps(old, prompt, c.response_ids), _logps(new, prompt, c.response_ids)
        # tokens 0..4 were sampled by the old weights: their log-probs are the old model's
        assert torch.allclose(got[:5], lp_old[:5], atol=1e-4)
        assert not torch.allclose(got[:5], lp_new[:5], atol=1e-2)
        # later ones by the new weights, attending to the KV kept from the old weights: exactly what the
        # new model computes on top of the old model's cache of the prompt and tokens 0..3 (token 4 is
        # fed after the swap), and not the new model's full recompute of the prefix
        kept = _logps_on_kept_kv(old, new, prompt, c.response_ids, fed_before_swap=4)
        assert torch.allclose(got[5:], kept, atol=1e-4)
        assert not torch.allclose(got[5:], lp_new[5:], atol=1e-2)


@torch.no_grad()
def _logps_on_kept_kv(old, new, prompt, response, fed_before_swap):
    """Log-probs of ``response[fed_before_swap + 1:]`` under ``new`` continuing from
    ``old``'s KV cache of the prompt and the first ``fed_before_swap`` response tokens."""
    cache = old(torch.tensor([prompt + response[:fed_before_swap]]), use_cache=True).past_key_values
    rest = response[fed_before_swap:]
    logits = new(torch.tensor([rest[:-1]]), past_key_values=cache, use_cache=True).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[torch.arange(len(rest) - 1), torch.tensor(rest[1:])]


def test_a_prompt_joins_a_running_stream_and_everything_is_freed_at_the_end(qwen2_dir):
    engine = _engine(qwen2_dir)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=6, stop_token_ids=(), seed=3))
    assert stream.add(PROMPTS[:1]) == [0]
    got = stream.step()
    assert stream.add(PROMPTS[1:]) == [1]  # joins while prompt 0's samples decode
    while stream.num_active:
        got += stream.step()
    assert engine.stats.admitted_while_running == 0  # generate's stats untouched by a stream
    assert stream.stats.admitted_while_running == 2
    assert sorted((c.prompt_index, c.sample_index) for c in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(len(c.response_ids) == 6 and c.token_versions == [3] * 6 for c in got)
    assert engine.pool.used_bytes == 0


def test_a_stream_never_decodes_more_than_max_running_sequences(qwen2_dir):
    engine = _engine(qwen2_dir)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=5, stop_token_ids=(), seed=3), max_running=3)
    stream.add(PROMPTS)
    assert stream.num_free == 0  # 4 samples wait for 3 rows
    got = []
    while stream.num_active:
        got += stream.step()
    assert len(got) == 4 and stream.stats.max_running == 3


def test_a_prompt_added_with_its_own_count_and_length_is_sampled_so_beside_the_streams_own(qwen2_dir):
    engine = _engine(qwen2_dir)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=6, stop_token_ids=(), seed=3))
    stream.add(PROMPTS[:1])
    stream.add(PROMPTS[1:], n=1, max_new_tokens=3)  # one sample of 3 tokens (a gateway request in the stream)
    got = []
    while stream.num_active:
        got += stream.step()
    lengths = sorted((c.prompt_index, c.sample_index, len(c.response_ids)) for c in got)
    assert lengths == [(0, 0, 6), (0, 1, 6), (1, 0, 3)]
    assert engine.pool.used_bytes == 0
