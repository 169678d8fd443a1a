"""Profile files and the fit of efficiency factors."""

import pytest

from asyncflow.planner.calibration import Efficiency, Point, Profile, fit_linear, load_profile, save_profile


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
        hardware="cpu", efficiency=Efficiency(train_flops=0.21, decode_overhead_s=0.002),
        points=[Point(kind="train", size="hidden 128", work=1e9, time_s=0.5)], created_at="2026-11-29T12:00:00",
        notes="test",
    )
    path = tmp_path / f"profile{suffix}"
    save_profile(profile, path)
    assert load_profile(path) == profile


def test_a_missing_profile_names_the_command_that_makes_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="afctl profile"):
        load_profile(tmp_path / "nope.json")
