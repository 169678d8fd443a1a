"""The data behind ``afctl plot``, tested without looking at pixels."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from asyncflow.cli.plot import broken, console_line, draw, ema, gap_starts, plot, samples_per_s


def _rows(num_steps: int, reward=lambda s: 0.1 * s, pause_after: int | None = None) -> list[dict]:
    rows, t = [], 0.0
    for s in range(num_steps):
        t += 1.0 + (30.0 if pause_after is not None and s == pause_after + 1 else 0.0)  # a checkpoint after step pause_after
        rows.append(
            {
                "step": s,
                "time_s": t,
                "step_time_s": 1.0,
                "samples": 4,
                "total_samples": 4 * (s + 1),
                "tokens": 40,
                "reward_mean": reward(s),
                "response_len_mean": 3.0,
                "staleness_max": 1,
                "busy/rollout.0": 0.9,
                "busy/reward.0": 0.2,
                "busy/trainer": 0.5,
            }
        )
    return rows


@pytest.mark.timeout(10)
def test_ema_of_a_constant_is_that_constant_and_a_span_of_one_changes_nothing():
    assert ema([2.0] * 5, 10) == [2.0] * 5
    assert ema([0.0, 1.0, 0.0], 1) == [0.0, 1.0, 0.0]


@pytest.mark.timeout(10)
def test_ema_weights_the_newest_value_by_two_over_span_plus_one_and_skips_nan():
    out = ema([0.0, 3.0, float("nan"), 3.0], 2)  # alpha = 2/3
    assert out[:3] == pytest.approx([0.0, 2.0, 2.0]) and out[3] == pytest.approx(2.0 / 3 + 2.0)


@pytest.mark.timeout(10)
def test_a_checkpoint_pause_breaks_the_line_on_the_time_axis():
    rows = _rows(10, pause_after=4)
    times = [r["time_s"] for r in rows]
    assert gap_starts(times) == [5]
    xs, ys = broken(times, [r["reward_mean"] for r in rows], [5])
    assert len(xs) == 11 and math.isnan(xs[5]) and math.isnan(ys[5]) and xs[6] == times[5]
    assert gap_starts([r["time_s"] for r in _rows(10)]) == []


@pytest.mark.timeout(10)
def test_samples_per_s_of_a_resumed_run_restarts_with_each_launch():
    first, second = _rows(3), _rows(3)
    for r in second:
        r["step"] += 3
    assert samples_per_s(first + second) == pytest.approx([4.0] * 6)


@pytest.mark.timeout(10)
def test_the_console_reward_line_uses_summary_jsons_first_and_last_tenth():
    rows = _rows(20, reward=lambda s: float(s))
    line = console_line("run", rows)
    assert "reward 0.500 (first 10%) -> 18.500 (last 10%)" in line  # not 0.000 -> 19.000 (first and last step)


@pytest.mark.timeout(60)
def test_afctl_plot_smooths_with_an_ema_and_gives_the_busy_panel_a_colour_per_role(tmp_path, monkeypatch):
    run = tmp_path / "a-run-with-a-rather-long-name-20261130-120000"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(12, pause_after=6)))
    drawn = {}
    import asyncflow.cli.plot as plot_module

    def spy(runs, png, span):
        drawn["span"] = span
        draw(runs, png, span)

    monkeypatch.setattr(plot_module, "draw", spy)
    result = CliRunner().invoke(plot, [str(run), "--png", str(tmp_path / "p.png"), "--smooth", "5"])
    assert result.exit_code == 0, result.output
    assert drawn["span"] == 5 and (tmp_path / "p.png").stat().st_size > 1000


@pytest.mark.timeout(60)
def test_the_busy_legend_names_roles_only_in_distinct_colours(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    draw([("a-run-with-a-rather-long-name", _rows(6))], tmp_path / "p.png", 3)
    legends = [ax.get_legend() for ax in figures[0].axes if ax.get_legend() is not None]
    busy = [lg for lg in legends if {t.get_text() for t in lg.get_texts()} == {"reward.0", "rollout.0", "trainer"}]
    assert len(busy) == 1
    colours = {tuple(h.get_color()) if not isinstance(h.get_color(), str) else h.get_color() for h in busy[0].legend_handles}
    assert len(colours) == 3
    plt.close("all")


@pytest.mark.timeout(60)
def test_several_runs_are_named_in_the_legend_and_an_agent_runs_tool_call_rate_is_drawn(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    agent = [{**r, "env/tool_call_rate": 0.1 * s} for s, r in enumerate(_rows(6))]
    draw([("calc-async [async]", agent), ("calc-sync [sync]", _rows(6))], tmp_path / "p.png", 1)
    texts = {t.get_text() for ax in figures[0].axes if ax.get_legend() for t in ax.get_legend().get_texts()}
    assert {"calc-async [async]", "calc-sync [sync]"} <= texts and not any(t.startswith("run ") for t in texts)
    panel = next(ax for ax in figures[0].axes if ax.get_title(loc="left").startswith("tool-call rate"))  # over steps
    [line] = [ln for ln in panel.get_lines() if len(ln.get_xdata())]  # the run that has the metric, not the other
    assert list(line.get_ydata()) == pytest.approx([0.1 * s for s in range(6)])
    plt.close("all")
