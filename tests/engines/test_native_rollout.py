import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncflow.engines.base import TokenBatch
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5], [4] + [9, 10, 11] * 6 + [5], [4, 30, 31, 5]]
EOS = 2


def engine(model_dir, **kw):
    cfg = dict(max_batch_size=8, kv_cache_bytes=1 << 20)
    cfg.update(kw)
    return build_rollout_engine(RolloutEngineConfig(**cfg), model_dir)


def assert_training_logprobs(model_dir, prompts, out, temperature: float = 1.0, micro_batch_size: int = 8) -> None:
    """Each completion's log-probs are the training engine's on the same tokens (fp32, 1e-4)."""
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=micro_batch_size), model_dir)
    batch = make_token_batch([prompts[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch, temperature=temperature).logp
    for b, c in enumerate(out):
        start = len(prompts[c.prompt_index])
        assert torch.allclose(logp_BT[b, start : start + len(c.response_ids)], torch.tensor(c.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch_dir", ["qwen2_dir", "llama_dir"])
def test_rollout_logprobs_match_training_engine_logprobs_at_temperature_one_in_fp32(arch_dir, request):
    model_dir = request.getfixturevalue(arch_dir)
    rollout = engine(model_dir)
    out = rollout.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=24, n=3, stop_token_ids=(EOS, 40, 41), seed=1))
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=5), model_dir)
    batch = make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch).logp
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        recomputed = logp_BT[b, start : start + len(c.response_ids)]
        assert torch.allclose(recomputed, torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_the_samples_of_a_prompt_share_one_prefill_and_still_draw_their_own_tokens(qwen2_dir):
    rollout = engine(qwen2_dir, max_batch_size=12)
    out = rollout.generate(PROMPTS[:3], SamplingParams(temperature=1.0, max_new_tokens=8, n=4, seed=4))
    assert rollout.stats.num_prefills == 1 and rollout.stats.prefill_rows == 3  # 12 sequences, 3 distinct prompts
    # the followers' KV is the leader's: their log-probs are the training engine's (checked in depth above), and
    # they sample independently (4 samples of a prompt at temperature 1 are not all one response)
    by_prompt = {p: {tuple(c.response_ids) for c in out if c.prompt_index == p} for p in range(3)}
    assert all(len(responses) > 1 for responses in by_prompt.values())
    assert_training_logprobs(qwen2_dir, PROMPTS, out)


def test_a_prefix_common_to_the_prompts_runs_once_and_the_logprobs_stay_the_training_engines(qwen2_dir):
    system = [4] + [9, 10, 11, 12] * 5  # 21 tokens every prompt starts with, as a chat template's system prompt
    prompts = [system + [20, 21, 5], system + [22, 5], system + [23, 24, 25, 26, 5], system]
    rollout = engine(qwen2_dir, max_batch_size=8)
    out = rollout.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=10, n=2, seed=3))
    # the prefix runs once (up to one token short of the shortest prompt, which still runs its last token)
    shared = len(system) - 1
    assert rollout.stats.num_prefills == 1 and rollout.stats.prefill_rows == 4
    assert rollout.stats.prefill_tokens == shared + sum(len(p) - shared for p in prompts)
    assert_training_logprobs(qwen2_dir, prompts, out)
    assert_greedy_is_transformers(qwen2_dir, prompts, rollout, max_new_tokens=6)


def test_logprobs_at_other_temperatures_match_training_logprobs_at_that_temperature(qwen2_dir):
    rollout = engine(qwen2_dir)
    out = rollout.generate(PROMPTS[:2], SamplingParams(temperature=0.7, top_k=20, max_new_tokens=10, seed=2))
    trainer = build_train_engine(TrainEngineConfig(), qwen2_dir)
    batch = make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch, temperature=0.7, top_k=20).logp
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        assert torch.allclose(logp_BT[b, start : start + 10], torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_an_on_policy_batch_under_top_p_and_top_k_has_ratio_one_on_every_token(qwen2_dir):
    """The rollout records the log-prob of the distribution it drew from (top_p = 0.9,
    top_k = 20), and the trainer's forward and train step apply the same rule: pi / mu is 1
    on every response token, where the untruncated log-probs are off on most of them."""
    rollout = engine(qwen2_dir)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=12, n=2, seed=5)
    out = rollout.generate(PROMPTS, params)
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=3), qwen2_dir)
    batch = make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    pi_BT = trainer.forward(batch, temperature=1.0, top_k=20, top_p=0.9).logp
    full_BT = trainer.forward(batch, temperature=1.0).logp
    off = 0
    for b, c in enumerate(out):
        start, n = len(PROMPTS[c.prompt_index]), len(c.response_ids)
        ratio = (pi_BT[b, start : start + n] - torch.tensor(c.logprobs)).exp()
        assert torch.allclose(ratio, torch.ones(n), atol=1e-4, rtol=0), ratio
        off += int(((full_BT[b, start : start + n] - torch.tensor(c.logprobs)).abs() > 1e-3).sum())
    assert off > 0  # the untruncated recomputation is not the distribution the tokens came from

    seen = []

    def loss_fn(fwd, mb, ctx):  # the train step's own log-probs: the same rule
        seen.append((fwd.logp.detach(), mb.rollout_logp))
        return fwd.logp.sum() * 0.0, {}

    batch.rollout_logp = torch.zeros(batch.input_ids.shape)
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        batch.rollout_logp[b, start : start + len(c.response_ids)] = torch.tensor(c.logprobs)
    trainer.train_step(batch, loss_fn, 1.0, 20, 0.9)
    for logp, mu in seen:
        mask = mu != 0
        assert torch.allclose(logp[mask], mu[mask], atol=1e-4, rtol=0)


def assert_greedy_is_transformers(model_dir, prompts, rollout, max_new_tokens: int) -> None:
    """The engine's greedy responses are transformers' greedy ``generate``, token for token."""
    out = rollout.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for c in out:
        prompt = torch.tensor([prompts[c.prompt_index]])
        ref = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert c.response_ids == ref[0, prompt.shape[1] :].tolist()


def test_greedy_generation_equals_transformers_greedy_generate(qwen2_dir):
    assert_greedy_is_transformers(qwen2_dir, PROMPTS, engine(qwen2_dir), max_new_tokens=12)


def test_continuous_batching_admits_waiting_prompts_as_others_finish(qwen2_dir):
    rollout = engine(qwen2_dir, max_batch_size=2)
    # Stopping on any of a dozen tokens makes response lengths vary widely.
    stops = tuple(range(6, 60, 5))
    out = rollout.generate(PROMPTS * 2, SamplingParams(max_new_tokens=30, n=2, stop_token_ids=stops, seed=3))
    stats = rollout.stats
    assert len(out) == 16
    assert stats.max_running == 2
    assert stats.admitted_while_running > 0
    # Continuous batching takes fewer decode steps than static batches of 2 that wait for their longest.
    lengths = [len(c.response_ids) for c in out]
    static_steps = sum(max(lengths[i : i + 2]) for i in range(0, 16, 2))
    assert stats.num_steps < static_steps
    assert [(c.prompt_index, c.sample_index) for c in out] == [(p, s) for p in range(8) for s in range(2)]


def test_kv_cache_budget_is_never_exceeded_and_limits_concurrency(qwen2_dir):
    # Qwen2 tiny: 2 layers x 2 kv heads x 16 dims x 4 bytes x 2 = 512 bytes/token; 16-token blocks = 8 KiB.
    budget = 5 * 8192 + 100
    rollout = engine(qwen2_dir, max_batch_size=16, kv_cache_bytes=budget)
    out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=20, n=4, seed=4))
    assert len(out) == 16
    assert rollout.kv_capacity_bytes <= budget
    assert rollout.pool.k.nbytes + rollout.pool.v.nbytes <= budget
    assert rollout.stats.peak_kv_used_bytes <= rollout.kv_capacity_bytes
    # Each sequence reserves 2 blocks (prompt + 20 new tokens <= 32), the third prompt 3: at most 2 run at once.
    assert rollout.stats.max_running == 2


def test_a_prompt_that_can_never_fit_the_cache_fails_before_generating(qwen2_dir):
    rollout = engine(qwen2_dir, kv_cache_bytes=8192)  # one 16-token block
    with pytest.raises(ValueError, match="raise kv_cache_bytes or lower max_new_tokens"):
        rollout.generate([PROMPTS[0]], SamplingParams(max_new_tokens=40))


def test_stop_tokens_end_responses_and_length_caps_them(qwen2_dir):
    rollout = engine(qwen2_dir)
    stops = tuple(range(6, 99, 3))
    out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=7, n=4, stop_token_ids=stops, seed=5))
    for c in out:
        assert 1 <= len(c.response_ids) <= 7 and len(c.logprobs) == len(c.response_ids)
        if c.finish_reason == "stop":
            assert c.response_ids[-1] in stops and not set(c.response_ids[:-1]) & set(stops)
        else:
            assert len(c.response_ids) == 7 and not set(c.response_ids) & set(stops)


def test_top_k_one_is_greedy_and_same_seed_repeats_samples(qwen2_dir):
    rollout = engine(qwen2_dir)
    greedy = rollout.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    top1 = rollout.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=1, max_new_tokens=8))
    assert [c.response_ids for c in greedy] == [c.response_ids for c in top1]
    a = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2, seed=9))
    b = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2, seed=9))
    assert [c.response_ids for c in a] == [c.response_ids for c in b]


def test_loaded_weights_change_generation_and_set_the_version(qwen2_dir):
    rollout = engine(qwen2_dir)
    before = rollout.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    trainer = build_train_engine(TrainEngineConfig(lr=1e-2), qwen2_dir)
    ids_BT = torch.tensor([PROMPTS[0] + [7] * 8])
    batch = TokenBatch(input_ids=ids_BT, attention_mask=torch.ones_like(ids_BT), response_mask=torch.ones(ids_BT.shape))
    for _ in range(20):
        trainer.train_step(batch, lambda out, mb, ctx: (-(out.logp * mb.response_mask).sum() / ctx.num_tokens, {}))
    rollout.load_weights(trainer.export_weights(), version=trainer.version)
    after = rollout.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=8))
    assert rollout.version == 20 and all(c.version == 20 for c in after)
    assert after[0].response_ids == [7] * 8 != before[0].response_ids


def test_loading_an_unknown_weight_name_says_what_is_wrong(qwen2_dir):
    rollout = engine(qwen2_dir)
    with pytest.raises(KeyError, match="same model_dir"):
        rollout.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))], version=1)


def test_an_empty_prompt_list_generates_nothing(qwen2_dir):
    assert engine(qwen2_dir).generate([], SamplingParams()) == []


def test_an_error_mid_generation_releases_every_kv_reservation(qwen2_dir):
    rollout = engine(qwen2_dir, max_batch_size=4)
    calls = []

    def failing_decode(*args):
        calls.append(1)
        raise RuntimeError("device lost")

    rollout._decode = failing_decode
    with pytest.raises(RuntimeError, match="device lost"):
        rollout.generate(PROMPTS, SamplingParams(max_new_tokens=8, n=2))
    assert calls and rollout.pool.used_bytes == 0


def test_a_groups_prompt_is_prefilled_once_whatever_the_group_size(qwen2_dir):
    """A GRPO group is one prompt's n samples: its prompt tokens run through the model once,
    counted in tokens, however large the group."""
    prompts = PROMPTS[:3]
    for n in (1, 4, 8):
        rollout = engine(qwen2_dir, max_batch_size=24, prefix_cache=False)
        rollout.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=4, n=n, seed=0))
        assert rollout.stats.prefill_tokens == sum(len(p) for p in prompts)
        assert rollout.stats.num_prefills == 1 and rollout.stats.prefill_rows == 3


def test_max_prefill_tokens_keeps_a_long_prompt_from_padding_the_short_ones_while_decode_goes_on(qwen2_dir):
    long = [4] + [9, 10, 11, 12, 13] * 20  # 101 tokens
    shorts = [[4, 20 + i, 5] for i in range(10)]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    unbounded = engine(qwen2_dir, max_batch_size=16, prefix_cache=False)
    expected = unbounded.generate([long, *shorts], greedy)
    # without a budget the one forward pads the 10 short prompts to the long one's length
    assert unbounded.stats.num_prefills == 1 and unbounded.stats.prefill_padded_tokens == 11 * 101

    budget = 16  # 5 of the short prompts a step
    rollout = engine(qwen2_dir, max_batch_size=16, prefix_cache=False, max_prefill_tokens=budget)
    stream = rollout.open_stream(greedy)
    stream.add([long, *shorts])
    done, steps = [], []
    while stream.num_active:
        before = (stream.stats.prefill_padded_tokens, stream.stats.prefill_rows, stream.stats.num_steps)
        done.extend(stream.step())
        stats = stream.stats
        steps.append((stats.prefill_padded_tokens - before[0], stats.prefill_rows - before[1]))
        assert stats.num_steps == before[2] + 1  # every step decodes, the ones that prefill too
    stream.close()
    assert steps[0] == (101, 1)  # the long prompt, first in line, runs alone (it is past the budget)
    assert all(tokens <= budget for tokens, rows in steps if rows > 1)
    assert [rows for _, rows in steps if rows] == [1, 5, 5]
    assert rollout.stats.prefill_padded_tokens < unbounded.stats.prefill_padded_tokens / 4
    done.sort(key=lambda c: c.prompt_index)
    assert [c.response_ids for c in done] == [c.response_ids for c in expected]
    for c, e in zip(done, expected):
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(e.logprobs), atol=1e-5, rtol=0)


def test_max_prefill_tokens_is_refused_where_the_engine_has_no_such_budget():
    import msgspec

    from asyncflow.core.schema import Refused

    for kind in ("hf", "vllm"):
        cfg = msgspec.convert({"type": kind, "max_prefill_tokens": 512}, RolloutEngineConfig)
        with pytest.raises(Refused) as refused:
            cfg.check(None)
        assert refused.value.key == "max_prefill_tokens"
    msgspec.convert({"type": "native", "max_prefill_tokens": 512}, RolloutEngineConfig).check(None)


READ_BACKS = frozenset({"item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__"})


@pytest.mark.parametrize("compile_", ["off", "on"])
@pytest.mark.timeout(600)
def test_a_decode_step_reads_the_device_back_once(compile_, llama_dir):
    """Sampling and log-probs stay on the device; a decode step's tokens and log-probs come
    back to the host in one read (on cuda each read waits for the device: a host sync)."""
    from torch.overrides import TorchFunctionMode

    class ReadBacks(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.calls: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", "")
            if name in READ_BACKS:
                self.calls.append(name)
            return func(*args, **(kwargs or {}))

    rollout = engine(llama_dir, max_batch_size=8, compile=compile_)
    for params in (
        SamplingParams(temperature=1.0, max_new_tokens=5, n=2, seed=0),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=5),
    ):
        stream = rollout.open_stream(params)
        stream.add(PROMPTS)
        stream.step()  # admission and prefill
        assert not stream.waiting and stream.running
        stream.step()  # one decode step (compiles its graph, with compile on)
        counter = ReadBacks()
        with counter:
            stream.step()
        stream.close()
        assert counter.calls == ["tolist"]


def test_a_groups_samples_admitted_later_copy_the_prompt_kv_of_a_running_sample(qwen2_dir):
    """A group split over two admissions (rows ran out mid-group): the later samples copy the
    prompt's keys and values from a sample still running and run only its last token, whose
    logits they sample from; their log-probs are still the training engine's."""
    a = [4] + [9, 10, 11] * 6 + [5]  # 20 tokens
    b = [4] + [12, 13, 14, 15] * 5 + [5]  # 22 tokens
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=2)
    rollout = engine(qwen2_dir, max_batch_size=6)
    stream = rollout.open_stream(params)
    stream.add([a], n=4, max_new_tokens=3)
    stream.add([b], n=4)  # 2 of its samples fit the 6 rows; the other 2 wait for a's to finish
    done = []
    while stream.num_active:
        done.extend(stream.step())
    stream.close()
    stats = stream.stats
    assert stats.num_prefills == 2 and stats.admitted_while_running == 2
    assert stats.prefill_tokens == len(a) + len(b) + 1  # b's later samples ran its last token only
    assert_training_logprobs(qwen2_dir, [a, b], sorted(done, key=lambda c: (c.prompt_index, c.sample_index)))
