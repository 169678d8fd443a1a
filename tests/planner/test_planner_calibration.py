"""Profile files and the fit of efficiency factors."""

import pytest

from asyncflow.planner.calibration import Efficiency, Point, Profile, fit_linear
from asyncflow.planner.io import load_profile, save_profile


def test_fit_recovers_the_efficiency_and_the_fixed_overhead_from_exact_points():
    peak = 1e12
    work = [1e9, 2e9, 4e9, 8e9]
    times = [0.003 + w / (0.4 * peak) for w in work]
    eff, overhead = fit_linear(work, times, peak)
    assert eff == pytest.approx(0.4)
    assert overhead == pytest.approx(0.003)


def test_fit_through_the_origin_with_one_point():
    eff, overhead = fit_linear([5e9], [0.01], 1e12)
    assert eff == pytest.approx(0.5) and overhead == 0.0


def test_fit_refuses_times_that_do_not_grow_with_work():
    with pytest.raises(ValueError, match="larger sizes"):
        fit_linear([1.0, 2.0], [-1.0, -2.0], 1.0)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_profile_round_trips_through_json_and_toml(tmp_path, suffix):
    profile = Profile(
        hardware="cpu",
        efficiency=Efficiency(train_flops=0.21, decode_overhead_s=0.002),
        points=[Point(kind="train", size="hidden 128", work=1e9, time_s=0.5)],
        created_at="2026-11-29T12:00:00",
        notes="test",
    )
    path = tmp_path / f"profile{suffix}"
    save_profile(profile, path)
    assert load_profile(path) == profile


def test_a_missing_profile_names_the_command_that_makes_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="afctl profile"):
        load_profile(tmp_path / "nope.json")


def test_decode_fit_recovers_bandwidth_efficiency_when_some_iterations_are_compute_bound():
    from asyncflow.planner.calibration import fit_max

    peak = 1e9
    work = [1e6, 2e6, 4e6, 8e6]
    compute_s = [0.0, 0.0, 0.05, 0.0]  # the third iteration is compute-bound
    layers = [2, 4, 4, 8]
    batch = [1, 8, 32, 8]
    times = [0.001 + 2e-4 * n + 1e-5 * b + max(w / (0.25 * peak), c) for w, c, n, b in zip(work, compute_s, layers, batch)]
    times.append(0.001 + 2e-4 * 6 + 1e-5 * 16 + 1.2e6 / (0.25 * peak))
    work.append(1.2e6), compute_s.append(0.0), layers.append(6), batch.append(16)
    eff, (fixed, per_layer, per_seq) = fit_max(work, compute_s, times, peak, [[1.0] * 5, layers, batch])
    assert eff == pytest.approx(0.25, rel=0.05)
    assert fixed == pytest.approx(0.001, abs=3e-4) and per_layer == pytest.approx(2e-4, rel=0.2)
    assert per_seq == pytest.approx(1e-5, rel=0.3)


def test_profile_fit_sets_every_measured_factor():
    from asyncflow.planner.calibration import fit_profile
    from asyncflow.planner.hardware import get_hardware

    hw = get_hardware("cpu")
    points = [Point(kind="train", size="s", work=w, time_s=0.01 + w / (0.5 * hw.peak_bf16_flops)) for w in (1e9, 4e9)]
    points += [Point(kind="forward", size="s", work=w, time_s=w / (0.6 * hw.peak_bf16_flops)) for w in (1e9, 4e9)]
    points += [Point(kind="prefill", size="s", work=w, num_layers=2, time_s=w / (0.4 * hw.peak_bf16_flops)) for w in (1e9, 4e9)]
    points += [
        Point(
            kind="decode",
            size="s",
            work=w,
            flops=1e3,
            batch=4,
            num_layers=2,
            time_s=0.002 + w / (0.2 * hw.memory_bandwidth_bytes_per_s),
        )
        for w in (1e6, 3e6, 9e6)
    ]
    eff = fit_profile(points, hw)
    assert eff.train_flops == pytest.approx(0.5, rel=1e-3) and eff.train_overhead_s == pytest.approx(0.01, rel=1e-2)
    assert eff.forward_flops == pytest.approx(0.6, rel=1e-3) and eff.prefill_flops == pytest.approx(0.4, rel=1e-3)
    assert eff.decode_bandwidth == pytest.approx(0.2, rel=0.05)
    total_overhead = eff.decode_overhead_s + 2 * eff.decode_overhead_s_per_layer + 4 * eff.decode_overhead_s_per_seq
    assert total_overhead == pytest.approx(0.002, rel=0.1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_afctl_profile_runs_the_real_engines_and_its_profile_feeds_afctl_plan(tmp_path):
    import json

    from click.testing import CliRunner

    from asyncflow.cli.main import main

    path = tmp_path / "cpu.toml"
    result = CliRunner().invoke(main, ["profile", "--out", str(path), "--quick", "--repeats", "1"])
    assert result.exit_code == 0, result.output
    prof = load_profile(path)
    assert prof.hardware == "cpu" and len(prof.points) >= 10
    assert 0 < prof.efficiency.train_flops <= 1 and 0 < prof.efficiency.decode_bandwidth <= 1
    eff = prof.efficiency  # the framework's own terms, from the real code paths
    assert eff.trainer_overhead_s_per_row > 0 and eff.snapshot_s_per_param > 0 and eff.queue_ask_s > 0
    assert eff.queue_handoff_s >= 0 and eff.corun_slowdown >= 1
    assert {p.kind for p in prof.points} >= {"trainer", "snapshot", "queue", "handoff", "corun"}
    out = CliRunner().invoke(
        main,
        [
            "plan",
            "--model",
            "0.5b",
            "--devices",
            "4",
            "--hardware",
            "cpu",
            "--batch-size",
            "4",
            "-n",
            "2",
            "--prompt-len",
            "32",
            "--response-len",
            "32",
            "--max-response-len",
            "64",
            "--profile",
            str(path),
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.output.splitlines()[-1])["plans"]
