"""Partial rollout in the emulated engine: the stream contract of NativeStream
(tests/engines/test_partial_stream.py) on ``EmulatedRolloutEngine.open_stream``, and its
device time per step from the planner's cost model. No sleep is measured: the engine is
given a sleep that records the seconds asked for."""

from __future__ import annotations

import pytest
import torch

from asyncflow.config.load import load_config_text
from asyncflow.engines import emulated_model
from asyncflow.engines.base import run_stream
from asyncflow.engines.config import EmulatedConfig, RolloutEngineConfig, SamplingParams
from asyncflow.engines.factory import build_rollout_engine
from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import decode_iteration_s
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS

pytestmark = pytest.mark.timeout(60)

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5]]


class Sleeps(list):
    """The sleep the engine is given: it records the seconds, waits none."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def _engine(tmp_path, version=3, sleeps=None, **emulated):
    """Every response exactly max_new_tokens long (median 1.0 of the cap, sigma 0), unless given."""
    emulated = {"response_median_fraction": 1.0, "response_sigma": 0.0, **emulated}
    cfg = RolloutEngineConfig(type="emulated", emulated=EmulatedConfig(**emulated))
    engine = build_rollout_engine(cfg, tmp_path, version=version)
    engine.sleep = sleeps if sleeps is not None else Sleeps()
    return engine


def _logps(prompt, response, version):
    return emulated_model.logp_BT(torch.tensor([prompt + response]), version)[0, len(prompt) :].tolist()


def test_a_stream_continues_its_sequences_across_a_swap_with_each_token_from_its_own_version(tmp_path):
    engine = _engine(tmp_path)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=12, stop_token_ids=(), seed=7))
    stream.add(PROMPTS)
    done = []
    for _ in range(4):  # step 1 prefills (token 0) and decodes (token 1); 3 more: tokens 0..4 under v3
        done += stream.step()
    engine.load_weights(emulated_model.version_weights(4), version=4)  # between two decode steps
    while stream.num_active:
        done += stream.step()
    stream.close()
    assert len(done) == 4
    for c in done:
        assert c.token_versions == [3] * 5 + [4] * 7
        assert c.version == 3  # a completion's version: its oldest token's
        prompt = PROMPTS[c.prompt_index]
        # each token's log-prob is the one the emulated trainer computes under the version that sampled it
        assert c.logprobs[:5] == _logps(prompt, c.response_ids, 3)[:5]
        assert c.logprobs[5:] == _logps(prompt, c.response_ids, 4)[5:]
        assert c.logprobs[5:] != _logps(prompt, c.response_ids, 3)[5:]


def test_a_prompt_joins_a_running_stream_and_nothing_is_left_at_the_end(tmp_path):
    engine = _engine(tmp_path)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=6, stop_token_ids=(), seed=3))
    assert stream.add(PROMPTS[:1]) == [0]
    got = stream.step()
    assert stream.add(PROMPTS[1:]) == [1]  # joins while prompt 0's samples decode
    while stream.num_active:
        got += stream.step()
    assert stream.stats.admitted_while_running == 2
    assert sorted((c.prompt_index, c.sample_index) for c in got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(len(c.response_ids) == 6 and c.token_versions == [3] * 6 for c in got)
    assert stream.num_active == 0


def test_a_stream_never_decodes_more_than_max_running_sequences(tmp_path):
    engine = _engine(tmp_path)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=5, stop_token_ids=(), seed=3), max_running=3)
    stream.add(PROMPTS)
    assert stream.num_free == 0  # 4 samples wait for 3 rows
    got = []
    while stream.num_active:
        got += stream.step()
    assert len(got) == 4 and stream.stats.max_running == 3


def test_a_prompt_added_with_its_own_count_and_length_is_sampled_so_beside_the_streams_own(tmp_path):
    engine = _engine(tmp_path)
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=6, stop_token_ids=(), seed=3))
    stream.add(PROMPTS[:1])
    stream.add(PROMPTS[1:], n=1, max_new_tokens=3)  # one sample of 3 tokens (a gateway request in the stream)
    got = []
    while stream.num_active:
        got += stream.step()
    lengths = sorted((c.prompt_index, c.sample_index, len(c.response_ids)) for c in got)
    assert lengths == [(0, 0, 6), (0, 1, 6), (1, 0, 3)]


def test_a_whole_stream_without_a_swap_gives_what_generate_gives(tmp_path):
    params = SamplingParams(n=4, max_new_tokens=32, stop_token_ids=(2,))
    prompts = [[4, i, 5] for i in range(10, 20)]
    # the default length distribution: long-tailed, some stopped, some capped
    whole = _engine(tmp_path, response_median_fraction=0.25, response_sigma=1.0).generate(prompts, params)
    streamed = run_stream(_engine(tmp_path, response_median_fraction=0.25, response_sigma=1.0).open_stream(params), prompts)
    assert [(c.response_ids, c.logprobs, c.finish_reason, c.version) for c in streamed] == [
        (c.response_ids, c.logprobs, c.finish_reason, c.version) for c in whole
    ]
    assert len({len(c.response_ids) for c in whole}) > 3
    assert {c.finish_reason for c in whole} == {"stop", "length"}


def test_each_step_sleeps_the_cost_models_prefill_of_the_admitted_and_decode_of_the_running_batch(tmp_path):
    sleeps = Sleeps()
    scale, tokens = 1e-3, 64
    engine = _engine(tmp_path, sleeps=sleeps, model="32b", hardware="910b", rollout_tp=4, time_scale=scale, token_scale=tokens)
    timing = engine.timing
    stream = engine.open_stream(SamplingParams(n=2, max_new_tokens=8, stop_token_ids=(), seed=3))
    stream.add(PROMPTS[:1])
    stream.step()  # admits 2 samples of prompt 0 (6 tokens): a prefill, then a decode of 2 rows at context 7
    stream.add(PROMPTS[1:])
    stream.step()  # admits 2 of prompt 1 (3 tokens), then decodes 4 rows: contexts 8, 8, 4, 4
    model, hw, eff = PRESETS["32b"], get_hardware("910b"), Efficiency()

    def decode(batch, context):
        return tokens * decode_iteration_s(model, hw, eff, 4, batch, context * tokens) * scale

    assert sleeps[0] == pytest.approx(timing.prefill_s([6, 6]) + decode(2, 7), rel=1e-9)
    assert sleeps[1] == pytest.approx(timing.prefill_s([3, 3]) + decode(4, 6), rel=1e-9)
    stream.step()
    assert sleeps[2] == pytest.approx(decode(4, 7), rel=1e-9)  # nothing admitted: the decode alone
    # a prefill is the planner's: 2P FLOPs per modelled prompt token over tp devices at its efficiency,
    # with the per-call and per-sequence overheads
    expected = (
        2 * model.prefill_flops(6 * tokens) / 4 / (hw.peak_bf16_flops * eff.prefill_flops)
        + model.num_layers * eff.prefill_overhead_s_per_layer
        + eff.generate_overhead_s
        + 2 * eff.generate_overhead_s_per_seq
    ) * scale
    assert timing.prefill_s([6, 6]) == pytest.approx(expected, rel=1e-9)


def test_a_stream_longer_than_the_engines_batch_is_admitted_as_rows_free_up(tmp_path):
    engine = _engine(tmp_path, model="32b", hardware="910b", rollout_tp=4)
    cap = engine.timing.max_running(len(PROMPTS[0]), 8)
    assert 1 <= cap <= 512
    stream = engine.open_stream(SamplingParams(n=cap + 3, max_new_tokens=8, stop_token_ids=(), seed=3))
    stream.add(PROMPTS[:1])
    stream.step()
    assert stream.stats.max_running == cap and stream.num_active == cap + 3


def test_partial_rollout_with_the_emulated_engines_is_a_valid_config():
    text = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n'
    cfg = load_config_text(text + '[workflow]\nmode = "async"\nstaleness = 1\npartial_rollout = true\n')
    assert cfg.workflow.partial_rollout and cfg.rollout.engine.type == "emulated"


def test_auto_streams_an_async_run_of_the_emulated_engines_as_on_the_accelerator_they_stand_for():
    text = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n[workflow]\nmode = "async"\n'
    cfg = load_config_text(text)
    assert cfg.workflow.partial_rollout == "auto" and cfg.rollout_streams
    assert "emulated" in cfg.rollout_mode_why()[1]
    assert not load_config_text(text.replace('"async"', '"sync"')).rollout_streams
    assert not load_config_text(text + "partial_rollout = false\n").rollout_streams
