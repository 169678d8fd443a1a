"""``afctl trace --png``: few arrows, a legend clear of the axis label."""

from __future__ import annotations

import pytest

from asyncflow.cli.runs import Span, Timeline
from asyncflow.cli.trace import draw, thin_flows

FLOWS = [("trainer", float(v), "rollout.0", v + 0.5) for v in range(300)]


@pytest.mark.timeout(10)
def test_300_weight_syncs_are_thinned_to_at_most_n_arrows_spread_over_the_run():
    shown = thin_flows(FLOWS, 20)
    assert len(shown) == 20 and shown[0] == FLOWS[0] and shown[-1] == FLOWS[-1]
    gaps = [b[1] - a[1] for a, b in zip(shown, shown[1:])]
    assert max(gaps) - min(gaps) <= 1.0
    assert thin_flows(FLOWS, 0) == [] and thin_flows(FLOWS[:5], 20) == FLOWS[:5]


@pytest.mark.timeout(10)
def test_arrows_outside_the_drawn_window_are_left_out():
    assert [f[1] for f in thin_flows(FLOWS, 20, from_s=10.0, to_s=14.0)] == [10.0, 11.0, 12.0, 13.0]


@pytest.mark.timeout(60)
def test_the_legend_does_not_overlap_the_x_axis_label(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [
        "generate",
        "score",
        "train",
        "sync_weights",
        "swap_weights",
        "put",
        "load",
        "checkpoint",
        "forward",
        "wait_data",
        "eval",
    ]
    tracks = {
        role: [Span(n, float(k), 0.8) for k, n in enumerate(names)] for role in ("loader", "rollout.0", "reward.0", "trainer")
    }
    tl = Timeline(label="run", mode="async (k=1)", tracks=tracks, end_s=float(len(names)), flows=FLOWS[:8])
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig: figures.append(fig))
    draw([tl], tmp_path / "t.png", max_arrows=3)
    fig = figures[0]
    renderer = fig.canvas.get_renderer()
    label = fig.axes[-1].xaxis.label.get_window_extent(renderer)
    legend = fig.legends[0].get_window_extent(renderer)
    assert not label.overlaps(legend)
    assert fig.bbox.contains(legend.x0 + 1, legend.y1 - 1)  # inside the figure
    arrows = [c for c in fig.axes[0].texts if c.arrow_patch is not None]
    assert len(arrows) == 3
    plt.close("all")
