"""``afctl trace RUN_DIR [RUN_DIR...] [--png out.png]``: check RUN_DIR/trace.json and
draw the timeline: one row per role, busy activities in colour, waits in light
grey, weight-sync transfers as arrows from the trainer to the replica that loads them
(at most ``--arrows`` of them, spread over the drawn time); several runs stacked (sync
above async) on one time axis, so a bubble (a row that is grey while another works) is
visible at a glance. The legend sits above the rows, the axis label below.

A resumed run has a trace per launch (trace.launch-1.json, ..., then trace.json: the
collector keeps each earlier one): every launch is checked, printed and drawn, each
labelled "launch k of n", on its own time axis."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

WAIT_COLOUR = "#d9d9d9"
FLOW_COLOUR = "#5a2d0c"  # weight sync: trainer publishes version v -> a rollout replica loads it
COLOURS = {  # busy activities; any other name takes the next colour of the cycle
    "generate": "#1f77b4",
    "train": "#d62728",
    "score": "#2ca02c",
    "forward": "#9467bd",
    "sync_weights": "#8c564b",
    "swap_weights": "#e377c2",
    "put": "#17becf",
    "load": "#bcbd22",
    "checkpoint": "#444444",
}
CYCLE = ["#ff7f0e", "#7f7f7f", "#aec7e8", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94"]


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--png", "png", type=click.Path(dir_okay=False, path_type=Path), help="Draw the timeline into this PNG.")
@click.option("--from-s", "from_s", type=float, default=None, help="Draw from this many seconds after the first span.")
@click.option("--to-s", "to_s", type=float, default=None, help="Draw up to this many seconds after the first span.")
@click.option(
    "--arrows",
    "max_arrows",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Draw at most this many weight-sync arrows per run, spread evenly over the drawn time (0: none).",
)
def trace(run_dirs: tuple[Path, ...], png: Path | None, from_s: float | None, to_s: float | None, max_arrows: int) -> None:
    """Validate RUN_DIR/trace.json (Chrome trace format; open it in https://ui.perfetto.dev)
    and print every role's busy fraction; with --png, draw the timelines stacked,
    sync runs above async ones. A resumed run shows every launch, each labelled."""
    from asyncflow.cli.runs import (
        launch_traces,
        load_trace,
        run_label,
        run_mode,
        run_wall_s,
        sync_first,
        timeline,
        validate_trace,
    )

    launches = []  # (run directory, trace file, launch k, of n)
    for run_dir in sync_first(list(run_dirs)):
        paths = launch_traces(run_dir)
        launches += [(run_dir, path, k, len(paths)) for k, path in enumerate(paths, start=1)]
    timelines, invalid = [], False
    for run_dir, path, k, n in launches:
        try:
            data = load_trace(path)
        except (FileNotFoundError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        last = k == n and path.name == "trace.json"
        problems = validate_trace(data, max_run_s=run_wall_s(run_dir) if last else None)  # summary.json: the last launch's wall
        label = run_label(run_dir) + (f" launch {k} of {n}" if n > 1 else "")
        tl = timeline(data, label=label, mode=run_mode(run_dir))
        click.echo(
            f"{tl.label}: {sum(len(s) for s in tl.tracks.values())} spans over {tl.end_s:.1f} s, "
            f"{len(tl.tracks)} tracks, {tl.num_flows} weight-sync flows, "
            f"counters {', '.join(f'{k} x{v}' for k, v in tl.counters.items()) or 'none'}"
        )
        if tl.flows:
            lags = sorted(t_dst - t_src for _, t_src, _, t_dst in tl.flows)
            click.echo(
                f"  weights: publish -> replica swap median {lags[len(lags) // 2] * 1e3:.0f} ms, max {lags[-1] * 1e3:.0f} ms"
            )
        for role, spans in tl.tracks.items():
            waits: dict[str, float] = {}
            for s in spans:
                if s.waiting:
                    waits[s.name] = waits.get(s.name, 0.0) + s.duration_s
            top = ", ".join(f"{k} {v:.1f}s" for k, v in sorted(waits.items(), key=lambda kv: -kv[1])[:2])
            click.echo(f"  {role:<14} busy {tl.busy_fraction(role):6.1%}  {len(spans):>6} spans  waits: {top or '-'}")
        if problems:
            invalid = True
            click.echo(f"  INVALID trace ({len(problems)} problems):", err=True)
            for p in problems[:20]:
                click.echo(f"    {p}", err=True)
        timelines.append(tl)
    if png is not None:
        draw(timelines, png, from_s, to_s, max_arrows)
        click.echo(f"wrote {png}")
    if invalid:
        sys.exit(1)


def thin_flows(
    flows: list[tuple[str, float, str, float]], max_arrows: int, from_s: float | None = None, to_s: float | None = None
) -> list[tuple[str, float, str, float]]:
    """At most ``max_arrows`` of ``flows`` (``(from role, s, to role, s)``) that start and
    end inside [from_s, to_s], evenly spread over them in time order (first and last kept)."""
    lo, hi = from_s if from_s is not None else float("-inf"), to_s if to_s is not None else float("inf")
    inside = sorted((f for f in flows if lo <= f[1] and f[3] <= hi), key=lambda f: f[1])
    if max_arrows <= 0:
        return []
    if len(inside) <= max_arrows:
        return inside
    if max_arrows == 1:
        return inside[:1]
    step = (len(inside) - 1) / (max_arrows - 1)
    return [inside[round(k * step)] for k in range(max_arrows)]


def draw(timelines: list, png: Path, from_s: float | None = None, to_s: float | None = None, max_arrows: int = 20) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    heights = [max(1, len(tl.tracks)) * 0.42 + 0.7 for tl in timelines]
    fig, axes = plt.subplots(
        len(timelines), 1, figsize=(13, sum(heights) + 0.9), sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    colours: dict[str, str] = {}

    def colour(name: str) -> str:
        if name.startswith("wait_"):
            return WAIT_COLOUR
        if name not in colours:
            colours[name] = COLOURS.get(name) or CYCLE[len([c for c in colours if c not in COLOURS]) % len(CYCLE)]
        return colours[name]

    end = max((tl.end_s for tl in timelines), default=1.0)
    for ax, tl in zip(axes[:, 0], timelines):
        roles = list(tl.tracks)
        for row, role in enumerate(roles):
            spans = tl.tracks[role]
            ax.broken_barh(
                [(s.start_s, s.duration_s) for s in spans],
                (row - 0.4, 0.8),
                facecolors=[colour(s.name) for s in spans],
                linewidth=0,
            )
        rows = {role: row for row, role in enumerate(roles)}
        for src, t_src, dst, t_dst in thin_flows(tl.flows, max_arrows, from_s, to_s):
            if src in rows and dst in rows:
                ax.annotate(
                    "",
                    xy=(t_dst, rows[dst]),
                    xytext=(t_src, rows[src]),
                    arrowprops={"arrowstyle": "->", "color": FLOW_COLOUR, "alpha": 0.6, "lw": 0.7},
                )
        ax.set_yticks(range(len(roles)), [f"{r}  {tl.busy_fraction(r):.0%}" for r in roles], fontsize=8)
        ax.set_ylim(len(roles) - 0.5, -0.5)
        ax.set_title(tl.label, fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlim(from_s if from_s is not None else 0.0, to_s if to_s is not None else end)
    axes[-1, 0].set_xlabel("seconds since the run's first span (row label: busy fraction)")
    legend: list[Any] = [Patch(color=c, label=n) for n, c in colours.items()] + [Patch(color=WAIT_COLOUR, label="wait_*")]
    if max_arrows and any(tl.flows for tl in timelines):
        from matplotlib.lines import Line2D

        shown = max(len(thin_flows(tl.flows, max_arrows, from_s, to_s)) for tl in timelines)
        total = max(len(tl.flows) for tl in timelines)
        legend.append(
            Line2D(
                [],
                [],
                color=FLOW_COLOUR,
                lw=0.8,
                label="weights v -> replica" + (f" ({shown} of {total}; --arrows)" if shown < total else ""),
            )
        )
    # the legend above the rows, in its own strip: it never covers the x-axis label
    ncol = min(8, len(legend))
    strip_in = 0.3 * -(-len(legend) // ncol) + 0.1
    fig.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - strip_in / fig.get_figheight()))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
