"""The emulated engine pair (``rollout.engine.type = "emulated"``, ``train.engine.type =
"emulated"``): device time from the planner's cost model, log-probs a hash both sides
compute, weights whose digest follows the version. No model, no sleep measured: the
engines are given a sleep that records the seconds asked for."""

from __future__ import annotations

import math

import pytest
import torch

from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.engines import emulated_model
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import EmulatedConfig, RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.digest import weights_digest
from asyncflow.engines.factory import build_rollout_engine, build_train_engine
from asyncflow.planner.calibration import Efficiency
from asyncflow.planner.cost import Workload, rollout_cost, train_cost
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS

pytestmark = pytest.mark.timeout(60)

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5], [4, 30, 31, 5]]
PARAMS = SamplingParams(max_new_tokens=32, n=4, stop_token_ids=(2,))


class Sleeps(list):
    """The sleep the engines are given: it records the seconds, waits none."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def rollout(tmp_path, sleeps=None, **emulated):
    cfg = RolloutEngineConfig(type="emulated", emulated=EmulatedConfig(**emulated))
    engine = build_rollout_engine(cfg, tmp_path)
    engine.sleep = sleeps if sleeps is not None else Sleeps()
    return engine


def trainer(tmp_path, sleeps=None, **emulated):
    engine = build_train_engine(TrainEngineConfig(type="emulated", emulated=EmulatedConfig(**emulated)), tmp_path)
    engine.sleep = sleeps if sleeps is not None else Sleeps()
    return engine


def batch_of(out):
    return make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)


def test_the_trainer_recomputes_exactly_the_rollouts_log_probs_so_an_on_policy_ratio_is_exactly_one(tmp_path):
    out = rollout(tmp_path).generate(PROMPTS, PARAMS)
    assert len(out) == len(PROMPTS) * PARAMS.n
    logp_BT = trainer(tmp_path).forward(batch_of(out)).logp
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        recomputed = logp_BT[b, start : start + len(c.response_ids)]
        assert torch.equal(recomputed, torch.tensor(c.logprobs, dtype=torch.float32))
        assert bool((recomputed < 0).all())


def test_log_probs_are_a_deterministic_function_of_the_context_the_token_and_the_version(tmp_path):
    first = rollout(tmp_path).generate(PROMPTS, PARAMS)
    again = rollout(tmp_path).generate(PROMPTS, PARAMS)
    assert [(c.response_ids, c.logprobs) for c in first] == [(c.response_ids, c.logprobs) for c in again]
    ids_BT = torch.tensor([[4, 9, 16, 10, 20, 5]])
    assert torch.equal(emulated_model.logp_BT(ids_BT, 3), emulated_model.logp_BT(ids_BT, 3))
    assert not torch.equal(emulated_model.logp_BT(ids_BT, 3)[:, 1:], emulated_model.logp_BT(ids_BT, 4)[:, 1:])
    assert emulated_model.logp_BT(ids_BT, 3)[0, 0].item() == 0.0


def test_an_off_policy_row_has_a_ratio_other_than_one_after_a_training_step(tmp_path):
    out = rollout(tmp_path).generate(PROMPTS, PARAMS)
    engine = trainer(tmp_path)
    result = engine.train_step(batch_of(out), lambda o, mb, ctx: ((o.logp * mb.response_mask).sum() * 0.0 + 1.5, {"x": 1.0}))
    assert engine.version == result.step == 1
    assert math.isfinite(result.loss) and math.isfinite(result.grad_norm) and result.num_tokens > 0
    logp_BT = engine.forward(batch_of(out)).logp
    c = out[0]
    start = len(PROMPTS[c.prompt_index])
    assert not torch.equal(logp_BT[0, start : start + len(c.response_ids)], torch.tensor(c.logprobs))


def test_the_weights_digest_changes_with_each_version_and_the_replica_reads_back_what_the_trainer_published(tmp_path):
    engine, replica = trainer(tmp_path), rollout(tmp_path)
    digests = []
    for _ in range(3):
        snapshot = list(engine.export_weights())
        published = engine.published_digest(snapshot, torch.float32)
        replica.load_weights(snapshot, engine.version)
        assert replica.weights_digest() == published == weights_digest(snapshot, torch.float32)
        digests.append(published)
        engine.train_step(batch_of(replica.generate(PROMPTS[:1], PARAMS)), lambda o, mb, ctx: (o.logp.sum() * 0.0, {}))
    assert len(set(digests)) == 3
    # a fresh replica at version 0 holds what the trainer publishes as version 0
    assert rollout(tmp_path).weights_digest() == trainer(tmp_path).published_digest(
        list(trainer(tmp_path).export_weights()), torch.float32
    )


def test_response_lengths_are_long_tailed_and_capped_at_max_new_tokens(tmp_path):
    params = SamplingParams(max_new_tokens=64, n=16, stop_token_ids=(2,))
    out = rollout(tmp_path).generate([[4, i, 5] for i in range(10, 60)], params)
    lengths = sorted(len(c.response_ids) for c in out)
    assert max(lengths) <= 64 and min(lengths) >= 1
    median, mean = lengths[len(lengths) // 2], sum(lengths) / len(lengths)
    assert mean > median  # a right tail
    capped = [c for c in out if len(c.response_ids) == 64]
    assert capped and all(c.finish_reason == "length" for c in capped)
    stopped = [c for c in out if c.finish_reason == "stop"]
    assert stopped and all(c.response_ids[-1] == 2 and 2 not in c.response_ids[:-1] for c in stopped)


def test_a_generate_call_sleeps_the_planners_rollout_time_times_time_scale(tmp_path):
    sleeps = Sleeps()
    engine = rollout(tmp_path, sleeps, model="7b", hardware="910b", time_scale=1e-3)
    out = engine.generate(PROMPTS, PARAMS)
    lengths = [len(c.response_ids) for c in out]
    wl = Workload(
        prompt_len_tokens=round(sum(len(PROMPTS[c.prompt_index]) for c in out) / len(out)),
        response_len_tokens=max(1, round(sum(lengths) / len(lengths))),
        max_response_len_tokens=max(lengths),
        prompts_per_step=len(PROMPTS),
        samples_per_prompt=PARAMS.n,
        use_reference=False,
    )
    cost = rollout_cost(PRESETS["7b"], get_hardware("910b"), Efficiency(), wl, devices=1, tp=1)
    assert sleeps == [pytest.approx((cost.time_s + cost.tail_s) * 1e-3, rel=1e-9)]
    slower = Sleeps()
    rollout(tmp_path, slower, model="7b", hardware="910b", time_scale=2e-3).generate(PROMPTS, PARAMS)
    assert slower == [pytest.approx(2 * sleeps[0], rel=1e-9)]


def test_a_training_step_sleeps_the_planners_train_time_and_a_weight_swap_the_swap_time(tmp_path):
    out = rollout(tmp_path).generate(PROMPTS, PARAMS)
    sleeps = Sleeps()
    engine = trainer(tmp_path, sleeps, model="32b", hardware="h100", train_devices=16, time_scale=1e-3)
    batch = batch_of(out)
    engine.train_step(batch, lambda o, mb, ctx: (o.logp.sum() * 0.0, {}))
    expected = emulated_model.Timing(EmulatedConfig(model="32b", hardware="h100", train_devices=16, time_scale=1e-3))
    assert sleeps == [pytest.approx(expected.train_s(batch), rel=1e-9)]
    prompt, response = expected.lengths(batch)
    wl = Workload(
        prompt_len_tokens=prompt,
        response_len_tokens=response,
        max_response_len_tokens=response,
        prompts_per_step=batch.batch_size,
        samples_per_prompt=1,
        use_reference=False,
    )
    cost = train_cost(PRESETS["32b"], get_hardware("h100"), Efficiency(), wl, devices=16, tp=1, pp=1)
    assert sleeps[0] == pytest.approx(cost.time_s * 1e-3, rel=1e-9)
    swaps = Sleeps()
    rollout(tmp_path, swaps, model="32b", hardware="h100", time_scale=1e-3).load_weights(engine.export_weights(), 1)
    assert swaps == [pytest.approx(expected.swap_s(), rel=1e-9)] and swaps[0] > 0
    assert expected.weight_bytes == PRESETS["32b"].num_params * 2


def test_an_emulated_rollout_with_a_real_trainer_is_refused_naming_both_keys():
    with pytest.raises(ConfigError, match=r"rollout\.engine\.type.*train\.engine\.type"):
        load_config_text('[rollout.engine]\ntype = "emulated"\n')


def test_the_two_emulated_engines_must_emulate_one_model():
    text = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n[train.engine.emulated]\nmodel = "32b"\n'
    with pytest.raises(ConfigError, match=r"train\.engine\.emulated\.model"):
        load_config_text(text)


def test_packing_replicas_is_refused_for_an_engine_that_holds_a_model():
    with pytest.raises(ConfigError, match=r"cluster\.actors_per_process.*emulated"):
        load_config_text("[cluster]\nactors_per_process = 4\n")


BOTH = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n'


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("[workflow]\nstream_step = true\n", r"train\.engine\.type.*stream_step = false"),
        ("[train.engine.emulated]\nhardware = 'h100'\n", r"train\.engine\.emulated\.hardware"),
        ("[cluster]\nactors_per_process = 4\n[planner]\nonline = true\n", r"cluster\.actors_per_process.*planner\.online"),
    ],
)
def test_what_the_emulated_engines_do_not_emulate_is_refused_naming_the_key_and_the_fix(extra, key):
    with pytest.raises(ConfigError, match=key):
        load_config_text(BOTH + extra)
    assert load_config_text(BOTH + "[cluster]\nactors_per_process = 4\n").cluster.actors_per_process == 4


def test_a_marked_wait_ends_the_device_time_after_the_mark_so_host_work_overlaps_it(monkeypatch):
    waits: list[float] = []
    clock = iter([10.0, 10.3, 20.0, 25.0])
    monkeypatch.setattr(emulated_model.time, "monotonic", lambda: next(clock))
    sleep = emulated_model.EventSleep()
    monkeypatch.setattr(sleep.event, "wait", waits.append)
    sleep.mark()  # 10.0: the call starts; its host work takes 0.3 s
    sleep(1.0)  # 10.3
    sleep(1.0)  # unmarked: the whole second
    sleep.mark()  # 20.0; host work longer than the device time: no wait at all
    sleep(1.0)  # 25.0
    assert waits == [pytest.approx(0.7), 1.0]


def test_the_emulated_trainer_times_its_tensor_and_pipeline_degrees_and_refuses_devices_they_do_not_split(tmp_path):
    base = '[rollout.engine]\ntype = "emulated"\n[train.engine]\ntype = "emulated"\n[train.engine.emulated]\n'
    with pytest.raises(ConfigError, match=r"train\.engine\.emulated\.train_devices.*multiple"):
        load_config_text(base + "train_devices = 6\ntrain_tp = 4\n")
    # 32B on 16 devices at tp 4: timed as the planner times that plan
    out = rollout(tmp_path, model="32b", rollout_tp=4).generate(PROMPTS, PARAMS)
    sleeps = Sleeps()
    engine = trainer(tmp_path, sleeps, model="32b", train_devices=16, train_tp=4)
    engine.train_step(batch_of(out), lambda o, b, c: (o.logp.sum() * 0, {}))
    prompt, response = engine.timing.lengths(batch_of(out))
    wl = Workload(
        prompt_len_tokens=prompt,
        response_len_tokens=response,
        max_response_len_tokens=response,
        prompts_per_step=len(out),
        samples_per_prompt=1,
        use_reference=False,
    )
    cost = train_cost(PRESETS["32b"], get_hardware("910b"), Efficiency(), wl, 16, 4, 1)
    assert cost.feasible and sleeps == [pytest.approx(cost.time_s * 1e-3, rel=1e-9)]


def test_a_checkpoint_of_the_emulated_trainer_carries_the_model_config_a_resume_reads(tmp_path):
    """Found by tests/chaos/test_chaos_scale.py: an emulated run's automatic resume failed in the
    preflight (``no config.json at .../checkpoints/step_000004/model/config.json``): the emulated
    checkpoint held its version alone, while a resume reads the model's config.json from it (the
    preflight's memory and step estimates; the emulated rollout's vocabulary)."""
    base = tmp_path / "model"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "qwen2", "vocab_size": 77}')
    engine = trainer(base)
    engine._version = 4
    first = tmp_path / "step_000004" / "model"
    engine.save_checkpoint(str(first))
    assert (first / "config.json").read_text() == (base / "config.json").read_text()
    resumed = trainer(first)  # the resumed launch's model dir is the checkpoint's
    resumed.load_checkpoint(str(first))
    assert resumed.version == 4 and emulated_model.vocab_of(first) == emulated_model.vocab_of(base) == (77, 3)
    resumed.save_checkpoint(str(tmp_path / "step_000006" / "model"))  # and so on, from launch to launch
    assert (tmp_path / "step_000006" / "model" / "config.json").read_text() == (base / "config.json").read_text()
