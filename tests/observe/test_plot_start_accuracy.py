"""``afctl plot``'s held-out panel starts at the start accuracy (``eval.at_start``:
``val/start_accuracy`` in step 0's record), so a run that learns from 0.08 to 0.64
is drawn from 0.08, not from its first evaluation after training (cli/plot.py)."""

from __future__ import annotations

import pytest

from asyncflow.cli.plot import draw, val_points


def _rows() -> list[dict]:
    rows = [{"step": s, "time_s": 1.0 + s, "step_time_s": 1.0, "samples": 4, "reward_mean": 0.1} for s in range(4)]
    rows[0]["val/start_accuracy"] = 0.078
    rows[1]["val/accuracy"], rows[3]["val/accuracy"] = 0.5, 0.637
    return rows


@pytest.mark.timeout(10)
def test_the_accuracy_points_begin_with_the_start_accuracy_before_the_first_step():
    rows = _rows()
    steps, times = [r["step"] for r in rows], [1.0, 2.0, 3.0, 4.0]
    assert val_points(rows, steps, "val/accuracy", -1) == [(-1, 0.078), (1, 0.5), (3, 0.637)]
    assert val_points(rows, times, "val/accuracy", 0.0) == [(0.0, 0.078), (2.0, 0.5), (4.0, 0.637)]
    assert val_points(rows, steps, "val/pass_at_k", -1) == []  # pass@k has no start figure
    del rows[0]["val/start_accuracy"]  # without eval.at_start: the evaluations only
    assert val_points(rows, steps, "val/accuracy", -1) == [(1, 0.5), (3, 0.637)]


@pytest.mark.timeout(60)
def test_the_drawn_held_out_line_starts_at_the_start_accuracy(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    draw([("run", _rows())], tmp_path / "p.png", 1)
    panels = [ax for ax in figures[0].axes if ax.get_title(loc="left").startswith("held-out accuracy")]
    assert len(panels) == 2  # over steps and over wall time
    for ax in panels:
        [line] = [ln for ln in ax.get_lines() if len(ln.get_xdata())]
        assert list(line.get_ydata()) == pytest.approx([0.078, 0.5, 0.637])
        xs = list(line.get_xdata())
        assert xs[0] < xs[1] < xs[2]  # the start first, before the first step's evaluation
    plt.close("all")
