"""The hf rollout engine (engines/hf_rollout.py): generation with the model's own
Hugging Face forward and KV cache, under the native engine's contract; and
``rollout.engine.type = "auto"``, which takes it for a model the native engine does not
implement (a tiny GPT-NeoX here)."""

from __future__ import annotations

import pytest
import torch
from tiny_neox import make_tiny_neox
from transformers import AutoModelForCausalLM

from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.digest import weights_digest
from asyncflow.engines.factory import build_rollout_engine, build_train_engine, resolve_rollout_type
from asyncflow.engines.lora import Adapter

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5], [4] + [9, 10, 11] * 6 + [5], [4, 30, 31, 5]]
EOS = 2


@pytest.fixture(scope="session")
def neox_dir(tmp_path_factory):
    return make_tiny_neox(tmp_path_factory.mktemp("neox"))


LAYOUTS = ["padded", "cohorts", "single"]
"""How sequences share caches (engines/hf_cache.py): both tiny models' caches allow all three."""


def hf_engine(model_dir, version: int = 0, layout: str | None = None, **kw):
    cfg = dict(type="hf", max_batch_size=8, kv_cache_bytes=1 << 20)
    cfg.update(kw)
    engine = build_rollout_engine(RolloutEngineConfig(**cfg), model_dir, version=version)
    assert engine.layout == "padded"  # plain key/value layers: every running sequence in one left-padded batch
    if layout is not None:
        engine.layout = layout  # what a sliding-window (cohorts) or state space (single) model's cache would take
    return engine


def _model(model_dir, weights=None):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
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


@torch.no_grad()
def _logps_on_kept_kv(old, new, prompt, response, fed_before_swap):
    """Log-probs of ``response[fed_before_swap + 1:]`` under ``new`` continuing from
    ``old``'s KV cache of the prompt and the first ``fed_before_swap`` response tokens."""
    cache = old(torch.tensor([prompt + response[:fed_before_swap]]), use_cache=True).cache
    rest = response[fed_before_swap:]
    logits = new(torch.tensor([rest[:-1]]), cache=cache, use_cache=True).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[torch.arange(len(rest) - 1), torch.tensor(rest[1:])]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("arch_dir", ["qwen2_dir", "neox_dir"])
def test_the_hf_engines_logprobs_are_the_training_engines_at_temperature_one_in_fp32(arch_dir, layout, request):
    model_dir = request.getfixturevalue(arch_dir)
    rollout = hf_engine(model_dir, layout=layout, max_batch_size=12)
    out = rollout.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=20, n=3, stop_token_ids=(EOS, 40, 41), seed=1))
    assert [(c.prompt_index, c.sample_index) for c in out] == [(p, s) for p in range(4) for s in range(3)]
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=5), model_dir)
    batch = make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch).logp
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        recomputed = logp_BT[b, start : start + len(c.response_ids)]
        assert torch.allclose(recomputed, torch.tensor(c.logprobs), atol=1e-4, rtol=0)
    # admitted together, the samples of a prompt share its prefill (one forward per prompt) and still draw their own tokens
    assert rollout.stats.prefill_rows == (12 if layout == "single" else 4)
    assert all(len({tuple(c.response_ids) for c in out if c.prompt_index == p}) > 1 for p in range(4))


def test_logprobs_under_temperature_and_top_k_are_the_training_engines_under_the_same_rule(neox_dir):
    rollout = hf_engine(neox_dir)
    out = rollout.generate(PROMPTS[:2], SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=10, n=2, seed=2))
    trainer = build_train_engine(TrainEngineConfig(), neox_dir)
    batch = make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch, temperature=0.7, top_k=20, top_p=0.9).logp
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        assert torch.allclose(logp_BT[b, start : start + 10], torch.tensor(c.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch_dir", ["qwen2_dir", "neox_dir"])
def test_greedy_generation_equals_transformers_greedy_generate(arch_dir, request):
    model_dir = request.getfixturevalue(arch_dir)
    out = hf_engine(model_dir).generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=12))
    model = _model(model_dir)
    for c in out:
        prompt = torch.tensor([PROMPTS[c.prompt_index]])
        ref = model.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert c.response_ids == ref[0, prompt.shape[1] :].tolist()


def test_stop_tokens_end_responses_and_length_caps_them(neox_dir):
    stops = tuple(range(6, 99, 9))
    out = hf_engine(neox_dir).generate(PROMPTS, SamplingParams(max_new_tokens=7, n=4, stop_token_ids=stops, seed=5))
    assert len(out) == 16
    for c in out:
        assert 1 <= len(c.response_ids) <= 7 and len(c.logprobs) == len(c.response_ids) == len(c.token_versions or [])
        if c.finish_reason == "stop":
            assert c.response_ids[-1] in stops and not set(c.response_ids[:-1]) & set(stops)
        else:
            assert len(c.response_ids) == 7 and not set(c.response_ids) & set(stops)
    assert {c.finish_reason for c in out} == {"stop", "length"}
    assert hf_engine(neox_dir).generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        hf_engine(neox_dir).generate([[4], []], SamplingParams())


def test_top_k_one_is_greedy_and_the_same_seed_repeats_samples(neox_dir):
    rollout = hf_engine(neox_dir)
    greedy = rollout.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    top1 = rollout.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8))
    assert [c.response_ids for c in greedy] == [c.response_ids for c in top1]
    a = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2, seed=9))
    b = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2, seed=9))
    assert [c.response_ids for c in a] == [c.response_ids for c in b]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_stream_continues_its_sequences_across_a_swap_with_each_token_from_its_own_weights(neox_dir, layout):
    """The native engine's semantics: a sequence keeps the KV cache its old weights computed;
    the tokens after the swap are sampled by the new weights attending to those old keys and
    values (the last token sampled before the swap is fed under the new weights)."""
    engine = hf_engine(neox_dir, version=3, layout=layout)
    new_weights = _perturbed(neox_dir)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=12, stop_token_ids=(), seed=7))
    stream.add(PROMPTS[:2])
    done = []
    for _ in range(4):  # step 1 prefills (token 0) and decodes (token 1); 3 more: tokens 0..4 under v3
        done += stream.step()
    engine.load_weights(new_weights, version=4)  # between two decode steps
    while stream.num_active:
        done += stream.step()
    stream.close()
    assert len(done) == 4 and engine.reserved_bytes == 0
    old, new = _model(neox_dir), _model(neox_dir, new_weights)
    for c in done:
        assert c.token_versions == [3] * 5 + [4] * 7 and c.version == 3
        prompt = PROMPTS[c.prompt_index]
        got = torch.tensor(c.logprobs)
        lp_old, lp_new = _logps(old, prompt, c.response_ids), _logps(new, prompt, c.response_ids)
        assert torch.allclose(got[:5], lp_old[:5], atol=1e-4)
        assert not torch.allclose(got[:5], lp_new[:5], atol=1e-2)
        kept = _logps_on_kept_kv(old, new, prompt, c.response_ids, fed_before_swap=4)
        assert torch.allclose(got[5:], kept, atol=1e-4)
        assert not torch.allclose(got[5:], lp_new[5:], atol=1e-2)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_prompt_joins_a_running_stream_with_its_own_count_and_length(neox_dir, layout):
    engine = hf_engine(neox_dir, version=3, layout=layout)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=6, stop_token_ids=(), seed=3))
    assert stream.add(PROMPTS[:1]) == [0]
    got = stream.step()
    assert stream.add(PROMPTS[1:2], n=1, max_new_tokens=3) == [1]  # joins while prompt 0's samples decode
    while stream.num_active:
        got += stream.step()
    assert stream.stats.admitted_while_running == 1
    lengths = sorted((c.prompt_index, c.sample_index, len(c.response_ids)) for c in got)
    assert lengths == [(0, 0, 6), (0, 1, 6), (1, 0, 3)]
    assert all(c.token_versions == [3] * len(c.response_ids) for c in got)
    assert engine.reserved_bytes == 0
    model = _model(neox_dir)  # the joiner (a shorter prompt, left-padded in the shared batch) scores as alone
    for c in got:
        assert torch.allclose(torch.tensor(c.logprobs), _logps(model, PROMPTS[c.prompt_index], c.response_ids), atol=1e-4)


def test_sequences_of_different_lengths_decode_together_in_one_forward(neox_dir):
    rollout = hf_engine(neox_dir, max_batch_size=16)
    forwards = []
    inner = rollout._forward

    def counted(ids, cache, pads=None):
        forwards.append((ids.shape[0], cache is None))
        return inner(ids, cache, pads)

    rollout._forward = counted
    out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=2, stop_token_ids=(), seed=1))
    assert len(out) == 8
    prefills, decodes = [f for f in forwards if f[1]], [f for f in forwards if not f[1]]
    assert len(prefills) == 4  # a prompt each, its two samples sharing it
    assert [rows for rows, _ in decodes] == [8] * 5  # 4 prompts of 3 to 20 tokens, 8 rows, one forward a token


def _tiny(tmp_path, config):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.15)
    model.save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "family,layout",
    [
        ("bloom", "cohorts"),  # alibi from the attention mask, no position ids: a prompt's samples share a cache, unpadded
        ("lfm2", "single"),  # convolution layers beside attention: a cache of one sequence each
    ],
)
def test_a_model_whose_cache_cannot_be_padded_shares_what_it_can_and_its_logprobs_hold(tmp_path, family, layout):
    import transformers

    common = dict(vocab_size=80, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if family == "bloom":
        config = transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, **common)
    else:
        config = transformers.Lfm2Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            layer_types=["conv", "full_attention"],
            **common,
        )
    model_dir = _tiny(tmp_path / family, config)
    assert resolve_rollout_type("auto", model_dir)[0] == "hf"
    rollout = build_rollout_engine(RolloutEngineConfig(max_batch_size=16, kv_cache_bytes=1 << 20), model_dir)
    assert rollout.layout == layout
    out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=10, n=2, stop_token_ids=(EOS, 40, 41), seed=1))
    assert len(out) == 8 and rollout.reserved_bytes == 0
    assert rollout.stats.prefill_rows == (4 if layout == "cohorts" else 8)
    model = _model(model_dir)
    for c in out:
        assert torch.allclose(torch.tensor(c.logprobs), _logps(model, PROMPTS[c.prompt_index], c.response_ids), atol=1e-4)


def test_a_stream_never_decodes_more_than_max_running_sequences(neox_dir):
    engine = hf_engine(neox_dir)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=5, stop_token_ids=(), seed=3), max_running=3)
    stream.add(PROMPTS[:2])
    assert stream.num_free == 0  # 4 samples wait for 3 rows
    got = []
    while stream.num_active:
        got += stream.step()
    assert len(got) == 4 and stream.stats.max_running == 3


def test_the_kv_budget_limits_how_many_sequences_run_and_a_prompt_that_never_fits_is_refused(neox_dir):
    probe = hf_engine(neox_dir)
    per_token = probe.kv_bytes_per_token
    assert per_token == 2 * 2 * 4 * 16 * 4  # keys and values, 2 layers, 4 heads of 16 dims, float32
    # room for two sequences of the longest prompt (21 tokens) + 19 new tokens, not three
    rollout = hf_engine(neox_dir, max_batch_size=16, kv_cache_bytes=per_token * 40 * 2 + 100)
    out = rollout.generate(PROMPTS[2:3], SamplingParams(max_new_tokens=20, n=4, stop_token_ids=(), seed=4))
    assert len(out) == 4 and rollout.stats.max_running == 2 and rollout.reserved_bytes == 0
    with pytest.raises(ValueError, match="raise kv_cache_bytes or lower max_new_tokens"):
        hf_engine(neox_dir, kv_cache_bytes=per_token * 10).generate([PROMPTS[0]], SamplingParams(max_new_tokens=40))


def test_a_prompt_past_max_position_embeddings_is_refused_naming_the_setting(tmp_path):
    short = make_tiny_neox(tmp_path / "short", max_position_embeddings=16)
    with pytest.raises(ValueError, match="max_position_embeddings=16; lower max_new_tokens"):
        hf_engine(short).generate([PROMPTS[0]], SamplingParams(max_new_tokens=12))


def test_an_error_mid_generation_releases_every_reservation(neox_dir):
    rollout = hf_engine(neox_dir, max_batch_size=4)
    calls = []

    def failing_forward(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("device lost")

    rollout._decode = failing_forward
    with pytest.raises(RuntimeError, match="device lost"):
        rollout.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2))
    assert calls and rollout.reserved_bytes == 0
    del rollout._decode
    assert len(rollout.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2))) == 1


def test_loaded_weights_are_generated_with_and_set_the_version(neox_dir):
    rollout = hf_engine(neox_dir)
    weights = _perturbed(neox_dir)
    rollout.load_weights(weights, version=7)
    out = rollout.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=6))
    assert rollout.version == 7 and all(c.version == 7 and c.token_versions == [7] * 6 for c in out)
    new = _model(neox_dir, weights)
    for c in out:
        prompt = torch.tensor([PROMPTS[c.prompt_index]])
        ref = new.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert c.response_ids == ref[0, prompt.shape[1] :].tolist()


def test_loading_an_unknown_name_or_a_wrong_shape_says_what_is_wrong(neox_dir, qwen2_dir):
    rollout = hf_engine(neox_dir)
    with pytest.raises(KeyError, match=r"'gpt_neox.layers.9.mlp.dense_h_to_4h.weight'.*same model_dir"):
        rollout.load_weights([("gpt_neox.layers.9.mlp.dense_h_to_4h.weight", torch.zeros(1))], version=1)
    with pytest.raises(ValueError, match=r"'lm_head.weight': shape \(3,\) != model's"):
        rollout.load_weights([("lm_head.weight", torch.zeros(3))], version=1)  # untied here: a parameter of its own
    assert rollout.version == 0
    # a tied lm_head (qwen2's tiny model ties it to embed_tokens) is skipped, as the native engine skips it
    tied = hf_engine(qwen2_dir)
    embed = tied.model.get_input_embeddings().weight
    tied.load_weights([("lm_head.weight", torch.zeros_like(embed))], version=2)
    assert tied.version == 2 and embed.abs().sum() > 0


def test_the_digest_changes_with_the_weights_and_is_the_digest_of_the_loaded_tensors(neox_dir):
    rollout = hf_engine(neox_dir)
    before = rollout.weights_digest()
    assert before == weights_digest(_model(neox_dir).named_parameters())
    weights = _perturbed(neox_dir)
    rollout.load_weights(weights, version=1)
    assert rollout.weights_digest() == weights_digest(weights) != before


def test_a_lora_adapter_merges_onto_the_base_and_the_next_one_replaces_it(neox_dir):
    rollout = hf_engine(neox_dir)
    module = "gpt_neox.layers.0.attention.dense"
    weight = dict(rollout.model.named_parameters())[module + ".weight"]
    base = weight.detach().clone()
    g = torch.Generator().manual_seed(0)

    def adapter() -> Adapter:
        return Adapter(torch.randn(4, 64, generator=g), torch.randn(64, 4, generator=g), torch.tensor(0.5))

    first, second = adapter(), adapter()
    rollout.load_weights(first.tensors(module), version=1)
    assert torch.allclose(weight, base + 0.5 * first.B_OR @ first.A_RI, atol=1e-5)
    rollout.load_weights(second.tensors(module), version=2)  # onto the base, not onto the first
    assert torch.allclose(weight, base + 0.5 * second.B_OR @ second.A_RI, atol=1e-5)
    with pytest.raises(KeyError, match="no weight 'gpt_neox.layers.0.attention.nope.weight'"):
        rollout.load_weights(first.tensors("gpt_neox.layers.0.attention.nope"), version=3)


def test_auto_takes_native_for_qwen2_and_llama_and_hf_for_gpt_neox(qwen2_dir, llama_dir, neox_dir):
    for model_dir, expected in ((qwen2_dir, "native"), (llama_dir, "native"), (neox_dir, "hf")):
        engine = build_rollout_engine(RolloutEngineConfig(kv_cache_bytes=1 << 20), model_dir)
        assert type(engine).__name__ == {"native": "NativeRolloutEngine", "hf": "HFRolloutEngine"}[expected]
        assert resolve_rollout_type("auto", model_dir)[0] == expected
    assert RolloutEngineConfig().type == "auto"
    assert resolve_rollout_type("auto", qwen2_dir) == ("native", "model_type 'qwen2'")
    taken, why = resolve_rollout_type("auto", neox_dir)
    assert taken == "hf" and why.startswith("model_type 'gpt_neox' is not one the native engine implements")
    assert resolve_rollout_type("hf", qwen2_dir) == ("hf", 'rollout.engine.type = "hf"')


@pytest.mark.parametrize("kind", ["auto", "hf", "native"])
def test_the_local_engines_refuse_the_vllm_only_keys_and_take_lora_without_max_lora_rank(kind):
    from asyncflow.config.load import ConfigError, load_config_text
    from asyncflow.config.run import RunConfig
    from asyncflow.core.schema import check_tree
    from asyncflow.engines.config import LoraConfig

    for key, value in (("weight_transfer", '"ipc"'), ("partial_kv", '"recompute"')):
        with pytest.raises(ConfigError, match=f"rollout.engine.{key} = .*: only the vLLM engines take it"):
            load_config_text(f'[rollout.engine]\ntype = "{kind}"\n{key} = {value}\n')
    cfg = RunConfig()
    cfg.train.engine.lora = LoraConfig(rank=8)
    cfg.rollout.engine = RolloutEngineConfig(type=kind)  # merges adapters itself: max_lora_rank is vLLM's
    check_tree(cfg)
