"""The compiled decode step (``rollout.engine.compile``, engines/compiled_decode.py) against
the eager one: the same greedy tokens and float32 log-probs within 1e-5, one graph per key
(no recompile), and a graph kept across a weight sync computes with the new weights.

Each graph compiles on first use (seconds on the tiny model, more at SmolLM2's width: that
test is marked slow)."""

from __future__ import annotations

import os
import sys

import msgspec
import pytest
import torch

from asyncflow.core.schema import Refused
from asyncflow.engines.compiled_decode import AUTO_DEVICES, GraphKey, bucket_of, buckets, resolve_compile
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams
from asyncflow.engines.factory import build_rollout_engine
from asyncflow.engines.native_model import NativeDecoder

sys.path.insert(0, os.path.dirname(__file__))
from families import make_family_model  # noqa: E402

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5], [4] + [9, 10, 11] * 6 + [5], [4, 30, 31, 5], [4, 7, 5], [4, 8, 8, 5]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def engines(model_dir, **kw):
    """An eager engine and a compiled one on the same model."""
    cfg = dict(max_batch_size=16, kv_cache_bytes=1 << 22, prefix_cache=False, **kw)
    eager = build_rollout_engine(RolloutEngineConfig(compile="off", **cfg), model_dir)
    compiled = build_rollout_engine(RolloutEngineConfig(compile="on", **cfg), model_dir)
    return eager, compiled


def shrinking_run(engine, prompts=PROMPTS, params=GREEDY):
    """Every prompt through one stream, their max_new_tokens staggered so that the batch
    shrinks from 6 rows to 1 as they finish; completions by prompt."""
    stream = engine.open_stream(params)
    for p, prompt in enumerate(prompts):
        stream.add([prompt], max_new_tokens=3 + 3 * p)
    done = []
    while stream.num_active:
        done.extend(stream.step())
    stream.close()
    return sorted(done, key=lambda c: c.prompt_index)


def assert_same(eager_out, compiled_out, atol: float = 1e-5) -> None:
    assert [c.response_ids for c in compiled_out] == [c.response_ids for c in eager_out]
    for e, c in zip(eager_out, compiled_out):
        gap = (torch.tensor(c.logprobs, dtype=torch.float32) - torch.tensor(e.logprobs, dtype=torch.float32)).abs().max()
        assert gap <= atol, f"prompt {e.prompt_index}: log-probs differ by {gap:.3g}"


def test_buckets_cover_every_size_up_to_the_limit_in_powers_of_two():
    assert buckets(64, 8) == (8, 16, 32, 64)
    assert buckets(48, 8) == (8, 16, 32, 48)
    assert buckets(4, 8) == (4,)
    sizes = buckets(100, 8)
    assert [bucket_of(n, sizes) for n in (1, 8, 9, 33, 64, 65, 100)] == [8, 8, 16, 64, 64, 100, 100]
    with pytest.raises(ValueError, match="past the largest bucket"):
        bucket_of(101, sizes)


def test_compile_auto_is_on_only_where_it_measured_faster_and_on_is_refused_for_a_mixture_of_experts(tmp_path, llama_dir):
    from asyncflow.engines.hf import load_model

    dense = NativeDecoder(load_model(llama_dir, dtype=torch.float32, device=torch.device("cpu")))
    assert resolve_compile("auto", torch.device("cpu"), dense) is False  # measured no faster on the CPU
    assert resolve_compile("auto", torch.device("cuda"), dense) is ("cuda" in AUTO_DEVICES)
    assert resolve_compile("on", torch.device("cpu"), dense) is True
    moe = NativeDecoder(
        load_model(make_family_model(tmp_path / "moe", "qwen3_moe"), dtype=torch.float32, device=torch.device("cpu"))
    )
    assert resolve_compile("auto", torch.device("cpu"), moe) is False
    with pytest.raises(ValueError, match="rollout.engine.compile = 'on'.*set it to 'off'"):
        resolve_compile("on", torch.device("cpu"), moe)


def test_compile_on_is_refused_for_the_engines_that_do_not_compile_a_decode_step():
    for kind in ("hf", "vllm"):
        cfg = msgspec.convert({"type": kind, "compile": "on"}, RolloutEngineConfig)
        with pytest.raises(Refused) as refused:
            cfg.check(None)
        assert refused.value.key == "compile"
    msgspec.convert({"type": "native", "compile": "on"}, RolloutEngineConfig).check(None)


@pytest.mark.timeout(600)
def test_compiled_decode_gives_eagers_greedy_tokens_and_logprobs_with_one_graph_per_key(llama_dir):
    eager, compiled = engines(llama_dir)
    expected = shrinking_run(eager)
    out = shrinking_run(compiled)
    assert_same(expected, out)
    graphs = compiled.compiled
    # 6 rows shrinking to 1: all in the rows bucket of 8; positions under 64: one keys bucket
    assert set(graphs.compile_s) == {GraphKey(rows=8, keys=64)}
    assert graphs.recompiles == 0
    # again, with 12 rows (bucket 16) then fewer (bucket 8): one more graph, the old one reused
    again = shrinking_run(compiled, PROMPTS + PROMPTS)
    assert_same(shrinking_run(eager, PROMPTS + PROMPTS), again)
    assert set(graphs.compile_s) == {GraphKey(rows=8, keys=64), GraphKey(rows=16, keys=64)}
    assert graphs.recompiles == 0


@pytest.mark.timeout(600)
def test_a_compiled_graph_survives_a_weight_sync_and_computes_with_the_new_weights(llama_dir):
    eager, compiled = engines(llama_dir)
    before = shrinking_run(compiled)
    assert_same(shrinking_run(eager), before)
    num_graphs = compiled.compiled.num_graphs
    assert compiled.compiled.compile_s  # its decode steps ran through a graph
    g = torch.Generator().manual_seed(7)
    # other weights altogether (norms around 1, matrices N(0, 0.1)), so that the greedy tokens change
    new = [(n, (p.dim() == 1) + 0.1 * torch.randn(p.shape, generator=g)) for n, p in eager.model.named_parameters()]
    eager.load_weights(new, version=1)
    compiled.load_weights(new, version=1)
    after = shrinking_run(compiled)
    assert [c.response_ids for c in after] != [c.response_ids for c in before]  # the new weights are in use
    assert_same(shrinking_run(eager), after)
    assert compiled.compiled.num_graphs == num_graphs and compiled.compiled.recompiles == 0  # the same graph


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_decode_matches_eager_at_smollm2_width(tmp_path):
    """SmolLM2-135M's width (vocabulary 49,152, hidden 576, 9 heads of 64, 3 key/value heads,
    MLP 1,536), 2 of its 30 layers, random weights: a graph compiles in a minute or more here."""
    from asyncflow.toy.tiny import make_tiny_model

    model_dir = make_tiny_model(
        tmp_path / "smol",
        arch="llama",
        vocab_size=49_152,
        hidden_size=576,
        num_layers=2,
        num_heads=9,
        num_kv_heads=3,
        intermediate_size=1_536,
        max_position_embeddings=2_048,
    )
    eager, compiled = engines(model_dir)
    assert_same(shrinking_run(eager), shrinking_run(compiled))
    assert compiled.compiled.recompiles == 0


SMOLLM2_135M = dict(
    vocab_size=49_152,
    hidden_size=576,
    intermediate_size=1_536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8_192,
    rms_norm_eps=1e-5,
    rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
    tie_word_embeddings=True,
)
"""SmolLM2-135M's config.json (models/smollm2-135m: ``afctl model import-gguf smollm2``), its shapes
and numbers, so that no download is needed."""


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_compiled_decode_matches_eager_at_smollm2s_full_depth(tmp_path):
    """All 30 of SmolLM2-135M's layers, random weights (N(0, 0.05) matrices: log-probs spread over
    several nats, as a trained model's are): the graph's rounding, if it differed from eager's,
    would compound over the depth. It once did, by 3e-5: RMSNorm's reduction fused in another
    order, and keys padded to the graph's bucket, which the eager step did not pad."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from asyncflow.toy.tiny import build_char_tokenizer

    config = LlamaConfig(**SMOLLM2_135M, initializer_range=0.05)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(tmp_path / "smol")
    build_char_tokenizer().save_pretrained(tmp_path / "smol")
    eager, compiled = engines(tmp_path / "smol")
    expected = shrinking_run(eager)
    assert max(-lp for c in expected for lp in c.logprobs) > 1.0  # not a near-uniform or near-certain model
    assert_same(expected, shrinking_run(compiled))
    assert compiled.compiled.recompiles == 0
