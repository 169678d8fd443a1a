"""The planner models the rollout mode that runs: generate calls that drain (unit) or one
continuous stream (stream, and partial rollout), for a plan, a simulation and a run config."""

from __future__ import annotations

import json

import msgspec
import pytest
from click.testing import CliRunner

from asyncflow.planner.calibration import Efficiency, Profile
from asyncflow.planner.cost import Workload, expected_longest_response, rollout_cost
from asyncflow.planner.hardware import get_hardware
from asyncflow.planner.models import PRESETS
from asyncflow.planner.search import search
from asyncflow.planner.simulate import simulate

H100 = get_hardware("h100")
# long-tailed lengths: a mean of 1,024 tokens, a cap of 8,192
WL = Workload(
    prompts_per_step=32, samples_per_prompt=8, response_len_tokens=1024, max_response_len_tokens=8192, use_reference=False
)


def _modes(wl: Workload = WL, n: int = 16):
    unit = search(PRESETS["7b"], H100, msgspec.structs.replace(wl, rollout_mode="unit"), n)
    stream = search(PRESETS["7b"], H100, msgspec.structs.replace(wl, rollout_mode="stream"), n)
    return unit, stream


def test_a_unit_rollout_with_long_tailed_lengths_predicts_a_slower_async_step_than_a_stream():
    unit, stream = _modes(msgspec.structs.replace(WL, prompts_per_call=1))
    assert unit.plans[0].rollout_mode == "unit" and stream.plans[0].rollout_mode == "stream"
    assert unit.plans[0].predicted_samples_per_s < 0.9 * stream.plans[0].predicted_samples_per_s


def test_each_generate_call_pays_its_own_tail_so_smaller_calls_are_slower():
    one = msgspec.structs.replace(WL, rollout_mode="unit", prompts_per_call=1)
    whole = msgspec.structs.replace(WL, rollout_mode="unit", prompts_per_call=16)  # one call per instance
    stream = msgspec.structs.replace(WL, rollout_mode="stream")
    cost = [rollout_cost(PRESETS["7b"], H100, Efficiency(), wl, 2, 1) for wl in (one, whole, stream)]
    assert cost[0].time_s > cost[1].time_s > cost[2].time_s
    # a unit's tails are in its busy time: a synchronous step waits for nothing more
    assert cost[0].tail_s == cost[1].tail_s == 0 and cost[2].tail_s > 0


def test_the_longest_of_a_call_grows_with_its_size_up_to_the_cap():
    lengths = [expected_longest_response(WL, n) for n in (1, 8, 64, 4096)]
    assert lengths[0] == pytest.approx(WL.response_len_tokens, rel=0.35)
    assert lengths == sorted(lengths) and lengths[-1] == pytest.approx(WL.max_response_len_tokens, rel=1e-3)


def test_sync_and_colocated_plans_do_not_depend_on_the_async_rollout_mode():
    unit, stream = _modes(msgspec.structs.replace(WL, prompts_per_call=1))
    for a, b in ((unit.sync, stream.sync), (unit.colocated, stream.colocated)):
        assert a is not None and b is not None
        assert a.predicted_step_s == b.predicted_step_s


@pytest.mark.parametrize("prompts_per_call", [1, 2, 4])
def test_the_unit_model_agrees_with_the_simulation_of_calls_that_drain(prompts_per_call):
    wl = msgspec.structs.replace(WL, prompts_per_call=prompts_per_call, rollout_mode="unit")
    plan = search(PRESETS["7b"], H100, wl, 16).plans[0]
    assert plan.bottleneck == "rollout"  # so the step is the rollout's calls, which the simulation plays out
    _, unit = simulate(PRESETS["7b"], H100, Efficiency(), wl, plan, num_steps=8, seed=1)
    assert unit.step_s == pytest.approx(plan.predicted_step_s, rel=0.15)
    # the same workload streamed, on the plan the planner picks for a stream
    stream_wl = msgspec.structs.replace(wl, rollout_mode="stream")
    stream_plan = search(PRESETS["7b"], H100, stream_wl, 16).plans[0]
    _, stream = simulate(PRESETS["7b"], H100, Efficiency(), stream_wl, stream_plan, num_steps=8, seed=1)
    assert unit.step_s > 1.5 * stream.step_s


@pytest.mark.timeout(60)
def test_the_prediction_for_a_config_follows_its_partial_rollout():
    from asyncflow.cli.predict import config_inputs
    from asyncflow.config.load import load_config_text
    from asyncflow.planner.predict import predict

    text = """
        [algorithm]
        group_size = 4
        [rollout]
        prompts_per_call = 2
        [rollout.sampling]
        max_new_tokens = 64
        [reward]
        placement = "role"
        [train]
        prompts_per_step = 8
        [workflow]
        mode = "async"
        partial_rollout = {}
    """
    profile = Profile(hardware="cpu", efficiency=Efficiency())
    unit_cfg = load_config_text(text.format("false"))
    stream_cfg = load_config_text(text.format("true"))
    inputs = config_inputs(unit_cfg)
    kw = dict(response_len=16, num_steps=10, cores=2, poll_s=0.05)
    unit = predict(unit_cfg, profile, inputs, **kw)
    stream = predict(stream_cfg, profile, inputs, **kw)
    assert unit["rollout_mode"] == "unit" and stream["rollout_mode"] == "stream"
    assert unit["modes"]["async"]["predicted_step_s"] > stream["modes"]["async"]["predicted_step_s"]
    assert unit["modes"]["sync"]["predicted_step_s"] == stream["modes"]["sync"]["predicted_step_s"]  # sync runs calls
    # each says what the other mode would give
    assert unit["other_rollout_mode"]["rollout_mode"] == "stream"
    assert unit["other_rollout_mode"]["predicted_step_s"] == pytest.approx(stream["modes"]["async"]["predicted_step_s"])


def test_afctl_plan_says_which_rollout_mode_it_assumed_and_what_the_other_gives():
    from asyncflow.cli.main import main

    args = ["plan", "--model", "7b", "--gpus", "16", "--batch-size", "32", "--response-len", "1024", "--no-reference"]
    unit = CliRunner().invoke(main, [*args, "--rollout", "unit", "--prompts-per-call", "1"])
    assert unit.exit_code == 0, unit.output
    assert "rollout: unit" in unit.output and "a stream would give" in unit.output
    stream = CliRunner().invoke(main, [*args, "--rollout", "stream", "--json"])
    assert stream.exit_code == 0, stream.output
    payload = json.loads(stream.output.strip().splitlines()[-1])
    assert payload["rollout_mode"] == "stream" and payload["plans"][0]["rollout_mode"] == "stream"
    assert payload["other_rollout_mode"]["rollout_mode"] == "unit"
    assert payload["other_rollout_mode"]["predicted_samples_per_s"] < payload["plans"][0]["predicted_samples_per_s"]


@pytest.mark.parametrize("devices, hardware", [("--gpus", "h100"), ("--npus", "910b"), ("--devices", "cpu")])
def test_afctl_plan_assumes_the_rollout_mode_a_run_config_gets_by_default_on_that_hardware(devices, hardware):
    from asyncflow.cli.main import main
    from asyncflow.config.load import load_config_text

    out = CliRunner().invoke(main, ["plan", "--model", "0.5b", devices, "16", "--hardware", hardware, "--json"])
    assert out.exit_code == 0, out.output
    device = {"h100": "cuda", "910b": "npu", "cpu": "cpu"}[hardware]
    cfg = load_config_text(f'[rollout.engine]\ndevice = "{device}"\n[train.engine]\ndevice = "{device}"\n')
    default = "stream" if cfg.rollout_streams else "unit"
    assert json.loads(out.output.strip().splitlines()[-1])["rollout_mode"] == default
