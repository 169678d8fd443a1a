"""``afctl plot RUN_DIR [RUN_DIR...] --png out.png``: the metrics of one or more runs
overlaid (one colour per run): reward, response length, samples/s, staleness and
busy fractions (one colour per role), each over trainer steps (left) and over wall
time (right), and the held-out evaluations (``val/accuracy``, ``val/pass_at_k``)
when a run has them (``val/accuracy`` from the start accuracy, ``eval.at_start``).

The data functions (``ema``, ``gap_starts``, ``broken``, ``samples_per_s``, ``val_points``,
``console_line``, ``step_axis``) are pure and tested without drawing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

PANELS = [  # (title, function of a run's metrics -> y values)
    ("reward (mean over the step's samples)", "reward_mean"),
    ("response length (tokens, mean)", "response_len_mean"),
    ("samples/s (per step)", "samples_per_s"),
    ("staleness (max, steps)", "staleness_max"),
    ("busy fraction per role", "busy"),
]
VAL_PANEL = ("held-out accuracy (val/accuracy; dashed: val/pass_at_k)", "val")
VAL_KEYS = (("val/accuracy", "-"), ("val/pass_at_k", "--"))
OPTIONAL_PANELS = [  # drawn when a run has the metric (an agent run: [env] path), for the runs that have it
    ("tool-call rate (env/tool_call_rate: trajectories with a tool call)", "env/tool_call_rate"),
]
ROLE_STYLES: list[Any] = ["-", "--", ":", "-.", (0, (3, 1, 1, 1, 1, 1))]  # matplotlib linestyles


def samples_per_s(rows: list[dict]) -> list[float]:
    """Samples of each step over the wall time since the previous step ended (the
    first step of each launch of a resumed run: over its own step time)."""
    from asyncflow.actors.driver.summary import launches

    out = []
    for part in launches(rows):
        previous = None
        for r in part:
            dt = r["time_s"] - previous if previous is not None else r.get("step_time_s", r["time_s"])
            out.append(r["samples"] / dt if dt > 0 else float("nan"))
            previous = r["time_s"]
    return out


def ema(values: list[float], span: int) -> list[float]:
    """Exponential moving average over about ``span`` steps (weight 2 / (span + 1) on
    the newest value; 1: the values as they are). NaN values are skipped (their
    position gets the average so far)."""
    if span <= 1:
        return list(values)
    alpha = 2.0 / (span + 1)
    out, avg = [], None
    for v in values:
        if v == v:
            avg = v if avg is None else alpha * v + (1 - alpha) * avg
        out.append(avg if avg is not None else float("nan"))
    return out


def gap_starts(times: list[float], factor: float = 3.0) -> list[int]:
    """Indices i where the time from row i - 1 to row i is more than ``factor`` times
    the median step interval: a checkpoint, an evaluation or a restart paused the
    run there, and a line drawn across it would invent values."""
    dts = [b - a for a, b in zip(times, times[1:])]
    if len(dts) < 2:
        return []
    median = sorted(dts)[len(dts) // 2]
    return [i + 1 for i, dt in enumerate(dts) if median > 0 and dt > factor * median]


def broken(xs: list[float], ys: list[float], starts: list[int]) -> tuple[list[float], list[float]]:
    """``xs``, ``ys`` with a NaN point before each index of ``starts``: matplotlib
    breaks the line there."""
    out_x, out_y, cut = [], [], set(starts)
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i in cut:
            out_x.append(float("nan"))
            out_y.append(float("nan"))
        out_x.append(x)
        out_y.append(y)
    return out_x, out_y


def val_points(rows: list[dict], xs: list, name: str, x_start: float) -> list[tuple[float, float]]:
    """The held-out panel's points of ``name`` over ``xs`` (each row's x). ``val/accuracy``
    starts at the start accuracy (``eval.at_start``: ``val/start_accuracy`` in an early
    step's record), drawn at ``x_start``, where the axis has the model before the first step."""
    from asyncflow.actors.driver.summary import evaluated_step

    x_of = {int(r["step"]): x for x, r in zip(xs, rows)}
    # at the x of the step that published the version evaluated (its figures may reach a later record: eval.where)
    points = [(x_of.get(evaluated_step(r) - 1, x), r[name]) for x, r in zip(xs, rows) if name in r]
    start = next((r["val/start_accuracy"] for r in rows if "val/start_accuracy" in r), None)
    if name == "val/accuracy" and start is not None:
        points.insert(0, (x_start, start))
    return points


def console_line(label: str, rows: list[dict]) -> str:
    """The line ``afctl plot`` prints per run: reward as summary.json defines it (the
    mean over the first and over the last tenth of the steps), samples/s over the
    training span of every launch."""
    from asyncflow.actors.driver.summary import reward_trend, train_span_s

    first, last = reward_trend(rows)
    rate = samples_per_s(rows)
    return (
        f"{label}: {len(rows)} steps, reward {first:.3f} (first 10%) -> {last:.3f} (last 10%), "
        f"{sum(r['samples'] for r in rows) / max(train_span_s(rows), 1e-9):.1f} samples/s overall, "
        f"last step {rate[-1]:.1f} samples/s"
    )


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--png", "png", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Write the figure here.")
@click.option(
    "--smooth",
    "span",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Exponential moving average over about this many steps for reward, response length, samples/s "
    "and busy fractions (the raw reward stays drawn, faint); 1: no smoothing.",
)
def plot(run_dirs: tuple[Path, ...], png: Path, span: int) -> None:
    """Reward, response length, samples/s, staleness and busy fractions of RUN_DIRs
    (and the tool-call rate of agent runs, the held-out accuracy of runs with [eval]),
    over steps and over wall time, runs overlaid and named in the legends (the
    convergence-parity figure).

    Lines break where the wall time jumps (a checkpoint or an evaluation paused the
    run); a resumed run's launches follow each other on the time axis."""
    from asyncflow.actors.driver.summary import evaluated_step
    from asyncflow.cli.runs import read_metrics, run_label

    runs = []
    for run_dir in run_dirs:
        try:
            rows = read_metrics(run_dir)
        except FileNotFoundError as exc:
            raise click.ClickException(str(exc)) from None
        if not rows:
            raise click.ClickException(f"{run_dir}/metrics.jsonl has no steps yet")
        runs.append((run_label(run_dir), rows))
    draw(runs, png, span)
    for label, rows in runs:
        click.echo(console_line(label, rows))
        evals = [r for r in rows if "val/accuracy" in r]
        if evals:
            top = max(evals, key=lambda r: r["val/accuracy"])
            click.echo(
                f"{label}: held-out accuracy best {top['val/accuracy']:.3f} after step {evaluated_step(top)}, "
                f"last {evals[-1]['val/accuracy']:.3f}"
            )
    click.echo(f"wrote {png}")


def step_axis(rows: list[dict]) -> list[int]:
    """The x values over steps: each row's step as the progress line printed it (1-based)."""
    from asyncflow.actors.driver.summary import console_step

    return [console_step(r) for r in rows]


def busy_roles(rows: list[dict]) -> list[str]:
    """The roles with a ``busy/<role>`` figure in any row (custom roles included), sorted."""
    return sorted({m.removeprefix("busy/") for r in rows for m in r if m.startswith("busy/")})


def draw(runs: list[tuple[str, list[dict]]], png: Path, span: int = 1) -> None:
    """One colour per run in every panel but the busy one, which has one colour per
    role (and one line style per run); its legend sits beside the panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from asyncflow.actors.driver.summary import run_clock

    has = {key for _, rows in runs for r in rows for key in r}
    panels = PANELS + [p for p in OPTIONAL_PANELS if p[1] in has] + ([VAL_PANEL] if "val/accuracy" in has else [])
    optional = {key for _, key in OPTIONAL_PANELS}
    fig, axes = plt.subplots(len(panels), 2, figsize=(14, 2.3 * len(panels) + 0.6), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    all_roles = sorted({role for _, rows in runs for role in busy_roles(rows)})
    role_colour = {role: plt.get_cmap("tab10" if len(all_roles) <= 10 else "tab20")(j) for j, role in enumerate(all_roles)}
    for k, (label, rows) in enumerate(runs):
        colour = colours[k % len(colours)]
        steps = [float(s) for s in step_axis(rows)]
        times = run_clock(rows)
        gaps = {0: [], 1: gap_starts(times)}  # lines break at pauses on the time axis only
        series = {"samples_per_s": samples_per_s(rows)}
        for row, (title, key) in enumerate(panels):
            for col, xs in enumerate((steps, times)):
                ax = axes[row, col]
                if key == "val":  # sparse points: the steps that evaluated, not smoothed
                    for name, style in VAL_KEYS:
                        # the start: one step before the first on the step axis, 0 s on the clock
                        points = val_points(rows, xs, name, xs[0] - 1 if col == 0 else 0.0)
                        if points:
                            ax.plot(
                                *zip(*points),
                                color=colour,
                                linestyle=style,
                                marker="o",
                                markersize=3,
                                linewidth=1.2,
                                label=f"{label}: {name}" if col == 0 else None,
                            )
                    ax.set_ylim(-0.02, 1.02)
                elif key == "busy":
                    for role in busy_roles(rows):
                        ys = ema([r.get(f"busy/{role}", float("nan")) for r in rows], span)
                        ax.plot(
                            *broken(xs, ys, gaps[col]),
                            color=role_colour[role],
                            linestyle=ROLE_STYLES[k % len(ROLE_STYLES)],
                            linewidth=1.2,
                            label=role if (col, k) == (0, 0) else None,
                        )
                elif key in optional and not any(key in r for r in rows):
                    pass  # this run has no such figure (not an agent run)
                else:
                    raw = series[key] if key in series else [r.get(key, float("nan")) for r in rows]
                    if key == "reward_mean" and span > 1:  # the raw values, faint, under the smoothed line
                        ax.plot(*broken(xs, raw, gaps[col]), color=colour, alpha=0.25, linewidth=0.8)
                    ys = raw if key == "staleness_max" else ema(raw, span)
                    if key in optional:
                        ax.set_ylim(-0.02, 1.02)
                    ax.plot(
                        *broken(xs, ys, gaps[col]), color=colour, linewidth=1.2, label=label if (row, col) == (0, 0) else None
                    )
                smoothed = span > 1 and key not in ("staleness_max", "val")
                ax.set_title(title + (f", EMA over ~{span} steps" if smoothed else ""), fontsize=9, loc="left")
                ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("trainer step (1-based, as the progress lines number them)")
    axes[-1, 1].set_xlabel("training wall time (s; pauses between launches left out)")
    axes[0, 0].legend(fontsize=8)
    keys = [key for _, key in panels]
    if "busy" in keys:  # beside the right-hand busy panel, outside both: it covers no line
        ax = axes[keys.index("busy"), 1]
        handles, labels = axes[keys.index("busy"), 0].get_legend_handles_labels()
        if len(runs) > 1:  # which line style is which run
            from matplotlib.lines import Line2D

            handles += [Line2D([], [], color="grey", linestyle=ROLE_STYLES[k % len(ROLE_STYLES)]) for k in range(len(runs))]
            labels += [label for label, _ in runs]
        if handles:
            ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    if "val" in keys and (ax := axes[keys.index("val"), 0]).get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(fig)
