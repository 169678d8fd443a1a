"""``afctl plot RUN_DIR [RUN_DIR...] --png out.png``: the metrics of one or more runs
overlaid (one colour per run): reward, response length, samples/s, staleness and
busy fractions, each over trainer steps (left) and over wall time (right), and the
held-out evaluations (``val/accuracy``, ``val/pass_at_k``) when a run has them."""

from __future__ import annotations

from pathlib import Path

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
ROLE_STYLES = ["-", "--", ":", "-.", (0, (3, 1, 1, 1, 1, 1))]


def samples_per_s(rows: list[dict]) -> list[float]:
    """Samples of each step over the wall time since the previous step ended."""
    out, previous = [], None
    for r in rows:
        dt = r["time_s"] - previous if previous is not None else r.get("step_time_s", r["time_s"])
        out.append(r["samples"] / dt if dt > 0 else float("nan"))
        previous = r["time_s"]
    return out


def smooth(values: list[float], window: int) -> list[float]:
    if window <= 1:
        return values
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1): i + 1] if v == v]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--png", "png", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Write the figure here.")
@click.option("--smooth", "window", default=1, show_default=True, help="Moving average over this many steps.")
def plot(run_dirs: tuple[Path, ...], png: Path, window: int) -> None:
    """Reward, response length, samples/s, staleness and busy fractions of RUN_DIRs,
    over steps and over wall time, runs overlaid (the convergence-parity figure)."""
    from asyncflow.cli._runs import read_metrics, run_label

    runs = []
    for run_dir in run_dirs:
        try:
            rows = read_metrics(run_dir)
        except FileNotFoundError as exc:
            raise click.ClickException(str(exc)) from None
        if not rows:
            raise click.ClickException(f"{run_dir}/metrics.jsonl has no steps yet")
        runs.append((run_label(run_dir), rows))
    draw(runs, png, window)
    for label, rows in runs:
        rate = samples_per_s(rows)
        click.echo(f"{label}: {len(rows)} steps, reward {rows[0]['reward_mean']:.3f} -> {rows[-1]['reward_mean']:.3f}, "
                   f"{sum(r['samples'] for r in rows) / max(rows[-1]['time_s'], 1e-9):.1f} samples/s overall, "
                   f"last step {rate[-1]:.1f} samples/s")
        evals = [r for r in rows if "val/accuracy" in r]
        if evals:
            top = max(evals, key=lambda r: r["val/accuracy"])
            click.echo(f"{label}: held-out accuracy best {top['val/accuracy']:.3f} after step {int(top['step']) + 1}, "
                       f"last {evals[-1]['val/accuracy']:.3f}")
    click.echo(f"wrote {png}")


def draw(runs: list[tuple[str, list[dict]]], png: Path, window: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = PANELS + ([VAL_PANEL] if any("val/accuracy" in r for _, rows in runs for r in rows) else [])
    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 2.3 * len(panels) + 0.6), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (label, rows) in enumerate(runs):
        colour = colours[k % len(colours)]
        steps = [r["step"] for r in rows]
        times = [r["time_s"] for r in rows]
        series = {"samples_per_s": samples_per_s(rows)}
        for row, (title, key) in enumerate(panels):
            for col, xs in enumerate((steps, times)):
                ax = axes[row, col]
                if key == "val":  # sparse points: the steps that evaluated, not smoothed
                    for name, style in VAL_KEYS:
                        points = [(x, r[name]) for x, r in zip(xs, rows) if name in r]
                        if points:
                            ax.plot(*zip(*points), color=colour, linestyle=style, marker="o", markersize=3,
                                    linewidth=1.2, label=f"{label}: {name}" if col == 0 else None)
                    ax.set_ylim(-0.02, 1.02)
                elif key == "busy":
                    roles = sorted({m.removeprefix("busy/") for r in rows for m in r if m.startswith("busy/")})
                    for j, role in enumerate(roles):
                        ys = [r.get(f"busy/{role}", float("nan")) for r in rows]
                        ax.plot(xs, smooth(ys, window), color=colour, linestyle=ROLE_STYLES[j % len(ROLE_STYLES)],
                                label=f"{label}: {role}" if col == 0 else None, linewidth=1.2)
                else:
                    ys = series[key] if key in series else [r.get(key, float("nan")) for r in rows]
                    ax.plot(xs, smooth(ys, 1 if key == "staleness_max" else window), color=colour,
                            label=label if (row, col) == (0, 0) else None,
                            linewidth=1.2)
                ax.set_title(title, fontsize=9, loc="left")
                ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("trainer step")
    axes[-1, 1].set_xlabel("wall time since the trainer started (s)")
    axes[0, 0].legend(fontsize=8)
    keys = [key for _, key in panels]
    for key, columns in (("busy", 2), ("val", 1)):
        if key in keys and (ax := axes[keys.index(key), 0]).get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, ncol=columns)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
