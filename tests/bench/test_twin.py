"""The twin's pure parts (asyncflow/bench/twin.py): flag checks that name the flag and the
fix, the planner's split per mode, the run config it writes (loaded by the real config
loader), and the figures from a run's metrics lines and CPU marks."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from asyncflow.bench import twin as tw
from asyncflow.cli.main import main
from asyncflow.config.load import load_config_text

pytestmark = pytest.mark.timeout(60)

WL = tw.workload(256, 8, 6.0, 16.0)


@pytest.mark.parametrize(
    "kwargs, flag, fix",
    [
        ({"model": "70b"}, "--model", "7b or 32b"),
        ({"hardware": "tpu"}, "--hardware", "910b"),
        ({"npus": 1}, "--npus", "at least 2"),
        ({"steps": 3}, "--steps", "--steps 4 or more"),
        ({"time_scale": "fast"}, "--time-scale", "positive number"),
        ({"time_scale": "0"}, "--time-scale", "positive number"),
        ({"time_scale": "-1e-2"}, "--time-scale", "positive number"),
        ({"modes": "sync,warp"}, "--modes", "sync,async,colocated"),
        ({"modes": ","}, "--modes", "none given"),
        ({"prompts": 0}, "--prompts", "1 or more"),
    ],
)
def test_a_bad_flag_is_refused_naming_the_flag_and_the_fix(kwargs, flag, fix):
    args = dict(model="7b", npus=32, hardware="910b", steps=6, time_scale="auto", modes="sync,async", prompts=256, group=8)
    args.update(kwargs)
    with pytest.raises(tw.TwinError) as err:
        tw.check_flags(**args)
    assert flag in str(err.value) and fix in str(err.value), err.value


def test_good_flags_give_the_modes_in_order_without_repeats():
    assert tw.check_flags("32b", 512, "h100", 4, "1e-2", "async,sync,async", 64, 4) == ["async", "sync"]


@pytest.mark.parametrize("args, flag", [(["--npus", "1"], "--npus"), (["--npus", "32", "--modes", "fast"], "--modes")])
def test_afctl_twin_refuses_a_bad_flag_before_building_anything(args, flag, tmp_path):
    result = CliRunner().invoke(main, ["twin", *args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert flag in result.output and "Usage" in result.output, result.output
    assert not (tmp_path / "out").exists()  # refused before the shared inputs were built


def test_each_mode_takes_the_planners_split():
    plans = tw.plan_modes("7b", "910b", 256, WL, ["sync", "async", "colocated"])
    a, s, c = plans["async"], plans["sync"], plans["colocated"]
    assert a.workflow_mode == "async" and s.workflow_mode == c.workflow_mode == "sync"
    for p in (a, s):  # task-separated: rollout and training share the devices, nothing left over
        assert p.rollout_devices + p.train_devices == 256
        assert p.replicas * p.rollout_tp == p.rollout_devices
    assert c.train_devices == 256 and c.replicas * c.rollout_tp == 256  # colocated: every device does both
    assert a.predicted_step_s < min(s.predicted_step_s, c.predicted_step_s)
    for p in plans.values():
        assert math.ceil(p.replicas / p.per_process) <= tw.MAX_PROCESSES
        assert p.prompts_per_call == max(1, 256 // p.replicas)


def test_too_few_devices_for_the_model_is_a_flag_error():
    with pytest.raises(tw.TwinError, match="--npus 2"):
        tw.plan_modes("32b", "910b", 2, WL, ["async"])


def test_the_config_it_writes_loads_as_an_emulated_packed_run():
    plans = tw.plan_modes("32b", "910b", 128, WL, ["async", "colocated"])
    for mp in plans.values():
        cfg = load_config_text(tw.config_text(mp, "32b", "910b", 1e-2, 6, 256, 8), "twin")
        assert cfg.rollout.engine.type == cfg.train.engine.type == "emulated"
        assert cfg.rollout.num_replicas == mp.replicas and cfg.cluster.actors_per_process == mp.per_process
        assert cfg.rollout.engine.emulated.rollout_tp == mp.rollout_tp
        assert cfg.train.engine.emulated.train_devices == mp.train_devices
        assert cfg.rollout.engine.emulated.time_scale == cfg.train.engine.emulated.time_scale == 1e-2
        assert cfg.workflow.mode == mp.workflow_mode and cfg.train.prompts_per_step == 256


def test_the_emulated_weights_take_the_planners_transfer_over_the_emulated_link():
    from asyncflow.engines.emulated_model import WEIGHT_ELEMENTS
    from asyncflow.planner.calibration import Efficiency
    from asyncflow.planner.cost import weight_transfer_s
    from asyncflow.planner.hardware import get_hardware
    from asyncflow.planner.models import PRESETS

    assert tw.EMULATED_WEIGHT_BYTES == WEIGHT_ELEMENTS * 4  # what one emulated version sends
    hw = get_hardware("910b")
    plans = tw.plan_modes("32b", "910b", 256, WL, ["sync", "colocated"])
    for mp in plans.values():
        cfg = load_config_text(tw.config_text(mp, "32b", "910b", 0.05, 6, 256, 8), "twin")
        rate = cfg.workflow.weight_link_mb_s * 1e6
        planner_s = weight_transfer_s(
            PRESETS["32b"], hw, Efficiency(), mp.rollout_tp, colocated=mp.mode == "colocated", replicas=mp.replicas
        )
        # every replica's copy over the trainer's one link: the planner's transfer (less its latency), scaled
        fanout_s = mp.replicas * tw.EMULATED_WEIGHT_BYTES / rate
        assert fanout_s == pytest.approx((planner_s - hw.collective_latency_s) * 0.05)
    assert plans["sync"].predicted_stage_s["weight_sync"] * 0.05 == pytest.approx(
        plans["sync"].replicas
        * tw.EMULATED_WEIGHT_BYTES
        / (
            load_config_text(tw.config_text(plans["sync"], "32b", "910b", 0.05, 6, 256, 8), "twin").workflow.weight_link_mb_s
            * 1e6
        ),
        rel=1e-3,
    )


def test_figures_leave_the_warmup_out_and_divide_by_the_steps_measured():
    mp = tw.plan_modes("7b", "910b", 32, WL, ["async"])["async"]
    metrics = [{"time_s": t, "samples": 100.0} for t in (5.0, 5.1, 6.0, 7.0, 8.0)]  # steps 3..5 take 1 s each
    marks = [{"time": 0.0, "queue": q, "directory": 0.001 * i, "driver": 0.1 * i} for i, q in enumerate((1, 2, 3, 3.3, 3.6))]
    f = tw.figures(metrics, marks, 0.01, 4.0, mp)
    assert f["steps_measured"] == 2 and f["measured_step_ms"] == pytest.approx(1000.0)
    assert f["measured_samples_per_s"] == pytest.approx(100.0 * 0.01)  # modelled: samples/s here x time_scale
    assert f["overhead_ms"] == pytest.approx({"queue": 300.0, "directory": 1.0, "driver": 100.0, "weights": 4.0})
    assert f["emulated_step_ms"] == pytest.approx(mp.predicted_step_s * 0.01 * 1e3)
    assert f["overhead_frac"]["queue"] == pytest.approx(300.0 / f["emulated_step_ms"])
    assert f["error"] == pytest.approx(1.0 / mp.predicted_samples_per_s - 1)


def test_the_mean_response_the_planner_is_given_is_the_emulated_rollouts():
    import random

    from asyncflow.engines.emulated_model import response_length

    r = random.Random(0)
    draws = [response_length(r, tw.MAX_NEW_TOKENS, tw.RESPONSE_MEDIAN_FRACTION, tw.RESPONSE_SIGMA) for _ in range(20000)]
    assert tw.emulated_mean_response() == pytest.approx(sum(draws) / len(draws))
    assert tw.emulated_mean_response() * tw.TOKEN_SCALE == pytest.approx(2048, rel=0.05)  # the paper-like mean


def test_afctl_lists_twin_and_its_help_names_every_flag():
    assert "  twin " in CliRunner().invoke(main, ["--help"]).output
    text = CliRunner().invoke(main, ["twin", "--help"]).output
    for flag in ("--model", "--npus", "--hardware", "--steps", "--time-scale", "--modes", "--rollout", "--json"):
        assert flag in text, text


def test_a_bad_rollout_flag_is_refused_naming_the_flag_and_the_fix():
    with pytest.raises(tw.TwinError, match=r"--rollout 'partial'.*unit or stream"):
        tw.check_flags("7b", 32, "910b", 6, "auto", "async", 256, 8, rollout="partial")
    assert tw.check_flags("7b", 32, "910b", 6, "auto", "async", 256, 8, rollout="stream") == ["async"]


@pytest.mark.parametrize("rollout, runs", [("unit", "unit"), ("stream", "stream"), ("auto", "stream")])
def test_async_runs_the_rollout_asked_for_and_sync_and_colocated_stay_unit(rollout, runs):
    # auto: what the run config's partial_rollout = "auto" takes for emulated async replicas (they stream)
    plans = tw.plan_modes("32b", "910b", 512, WL, ["sync", "async", "colocated"], rollout=rollout)
    assert plans["async"].rollout == runs and plans["sync"].rollout == plans["colocated"].rollout == "unit"
    for mode, mp in plans.items():
        text = tw.config_text(mp, "32b", "910b", 1e-2, 6, 256, 8)
        assert f"rollout {mp.rollout}" in text.splitlines()[0]  # the config says which it runs
        cfg = load_config_text(text, "twin")
        assert cfg.rollout_streams == (mode == "async" and runs == "stream")
    assert tw.DEFAULT_ROLLOUT == "auto"


def _trace(publish_starts, fetches):
    """A trace.json of a trainer's sync_weights spans and replicas' fetch spans (start, seconds)."""
    from asyncflow.actors.rollout.inbox import FETCH_SPAN

    events = [
        {"ph": "X", "name": "sync_weights", "cat": "busy", "ts": t * 1e6, "dur": 1e3, "pid": 1, "tid": 0} for t in publish_starts
    ]
    events += [
        {"ph": "X", "name": FETCH_SPAN, "cat": "phase", "ts": t * 1e6, "dur": d * 1e6, "pid": 2 + i % 3, "tid": 1}
        for i, (t, d) in enumerate(fetches)
    ]
    return {"traceEvents": events}


def test_the_weight_time_of_a_version_is_from_its_publish_to_the_last_replica_holding_it():
    # versions published at 10, 20, 30, 40; the first WARMUP_STEPS left out; the last replica has v3 at 30 + 0.9
    fetches = [(10.1, 0.2), (10.2, 0.5), (20.05, 0.3), (20.1, 0.6), (30.2, 0.4), (30.3, 0.6), (40.1, 0.1), (40.1, 0.3)]
    got = tw.weight_time_s(_trace([10.0, 20.0, 30.0, 40.0], fetches))
    assert got == pytest.approx([0.7, 0.7, 0.9, 0.4])
    assert tw.weight_time_s(_trace([10.0], [])) == []  # no replica fetched: nothing to report
    mp = tw.plan_modes("32b", "910b", 512, WL, ["async"])["async"]
    f = tw.figures([{"time_s": t, "samples": 1.0} for t in (1.0, 2.0, 3.0, 4.0, 5.0)], [], 0.01, 4.0, mp, weight_s=got)
    assert f["weight_ms"] == pytest.approx(1e3 * (0.9 + 0.4) / 2)  # the versions after the warm-up
    assert f["predicted_weight_ms"] == pytest.approx(1e3 * 0.01 * tw.planner_weight_s(mp, "32b", "910b"))


@pytest.mark.parametrize("mode", ["sync", "async", "colocated"])
def test_the_emulated_links_time_for_every_replicas_copy_is_the_planners_transfer_within_15_percent(mode):
    from asyncflow.actors.weights._link import EmulatedLink

    mp = tw.plan_modes("32b", "910b", 512, WL, [mode])[mode]
    scale = 1e-2
    cfg = load_config_text(tw.config_text(mp, "32b", "910b", scale, 6, 256, 8), "twin")
    now = [0.0]
    link = EmulatedLink(cfg.workflow.weight_link_mb_s, clock=lambda: now[0])
    # every replica asks for its copy at the publish: the last leaves after all of them
    last_s = max(link.delay_s(tw.EMULATED_WEIGHT_BYTES) for _ in range(mp.replicas))
    planner_s = tw.planner_weight_s(mp, "32b", "910b") * scale
    assert last_s == pytest.approx(planner_s, rel=0.15)


def test_figures_state_the_overhead_against_the_real_uncompressed_step():
    mp = tw.plan_modes("7b", "910b", 32, WL, ["async"])["async"]
    metrics = [{"time_s": t, "samples": 100.0} for t in (5.0, 5.1, 6.0, 7.0, 8.0)]
    marks = [{"time": 0.0, "queue": q, "directory": 0.0, "driver": 0.1 * i} for i, q in enumerate((1, 2, 3, 3.3, 3.6))]
    f = tw.figures(metrics, marks, 0.01, 4.0, mp)
    real_ms = mp.predicted_step_s * 1e3  # the planner's step in modelled seconds: no time_scale
    assert f["real_step_ms"] == pytest.approx(real_ms)
    assert f["overhead_frac_real"]["queue"] == pytest.approx(300.0 / real_ms)
    assert f["overhead_frac_real_total"] == pytest.approx((300.0 + 0.0 + 100.0 + 4.0) / real_ms)
    lines = "\n".join(tw.table(tw.report("7b", "910b", 32, WL, 0.01, {"async": f})))
    assert "of the real step" in lines


@pytest.mark.parametrize("rollout", ["unit", "stream", "auto"])
def test_the_twins_async_prediction_models_the_rollout_its_config_runs(rollout):
    assert WL.response_len_sigma == tw.RESPONSE_SIGMA  # the emulated lengths' spread: a unit call's longest
    a = tw.plan_modes("32b", "910b", 512, WL, ["async"], rollout=rollout)["async"]
    cfg = load_config_text(tw.config_text(a, "32b", "910b", 0.01, 6, 256, 8), "twin")
    assert a.rollout_mode == ("stream" if cfg.rollout_streams else "unit") == a.rollout


def test_a_unit_rollout_is_predicted_slower_than_a_stream_on_the_same_workload():
    unit = tw.plan_modes("32b", "910b", 512, WL, ["async"], rollout="unit")["async"]
    stream = tw.plan_modes("32b", "910b", 512, WL, ["async"], rollout="stream")["async"]
    # each replica's call waits for its longest response
    assert unit.predicted_samples_per_s < 0.8 * stream.predicted_samples_per_s
