"""``afctl bench planner``: a deliberately unbalanced run with the online planner on,
and how fast it went at its start and at its end.

The default config (examples/unbalanced.toml) has one rollout replica with long
generations and a cheap trainer holding two threads: the trainer waits on rollout.
The planner should move a thread from the trainer to a second replica, so the last
window of steps runs faster than the first. Samples/s over a window of W steps is
samples / (end of its last step - end of the step before it): the first window
starts after step 0 (which carries the start-up). ``--compare`` also runs the same
config with the planner off, for the same windows and for the steps after the
move. Runs go one after the other: on a machine shared with other jobs the load
drifts between them, so compare the planner's own ``measured`` line too (before and
after the move, in one run).

``--rounds N`` runs N rounds of both, alternating which goes first (round 1: online
then static; round 2: static then online; ...), and prints each round's whole-run
samples/s ratio, online / static: the planner should never make a round slower
(it moves only when what a move saves in the steps left exceeds its cost; docs/planner.md,
"What a move costs").
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click


def window_rates(rows: list[dict], window: int) -> tuple[float, float]:
    """Samples/s over steps 1..W and over the last W steps (step 0 only starts the clock)."""
    if len(rows) < 2 * window + 1:
        raise click.ClickException(
            f"{len(rows)} steps cannot hold two windows of {window} after step 0: "
            f"raise --steps to at least {2 * window + 1} or lower --window"
        )

    def rate(lo: int, hi: int) -> float:  # steps lo..hi-1, timed from the end of step lo-1
        return sum(r["samples"] for r in rows[lo:hi]) / (rows[hi - 1]["time_s"] - rows[lo - 1]["time_s"])

    return rate(1, 1 + window), rate(len(rows) - window, len(rows))


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def after_move(results: dict, root: Path) -> dict | None:
    """Samples/s of every run over the steps after the online run's first move took effect."""
    applied = [e for e in results["online"]["applied"] if e["ok"]]
    if not applied:
        return None
    events = _read(root / "online" / "planner.jsonl")
    later = [e["step"] for e in events if e["event"] == "observe" and e["time"] > applied[0]["time"]]
    if not later:
        return None
    out = {"first_step": min(later) + 1}
    for mode in results:
        rows = _read(root / mode / "metrics.jsonl")
        lo, hi = out["first_step"], len(rows)
        if hi - lo < 2:
            return None
        out["last_step"] = hi - 1
        out[mode] = sum(r["samples"] for r in rows[lo:hi]) / (rows[hi - 1]["time_s"] - rows[lo - 1]["time_s"])
    return out


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "unbalanced.toml"
"""The default config, found next to the package (a source checkout), not in the working directory."""


@click.command()
@click.option(
    "--config",
    "config_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="The run config to rebalance [default: examples/unbalanced.toml of this checkout].",
)
@click.option("--steps", type=int, help="Trainer steps (default: the config's).")
@click.option("--window", default=5, show_default=True, help="Steps per measured window (first and last).")
@click.option("--compare", is_flag=True, help="Also run the config with the planner off.")
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rounds of online and static runs, alternating which goes first (more than 1 implies --compare).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change one config key for every run (repeatable), e.g. --set planner.move_cost_s=0 to measure a move's cost.",
)
@click.option("--out", type=click.Path(file_okay=False), help="Keep the run directories here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def planner(
    config_path: str,
    steps: int | None,
    window: int,
    compare: bool,
    rounds: int,
    overrides: tuple[str, ...],
    out: str | None,
    as_json: bool,
) -> None:
    """Samples/s in the first and last windows of an unbalanced run, and the planner's decisions."""
    import msgspec

    from asyncflow.actors.driver.prepare import prepare_new
    from asyncflow.config.load import load_config

    if config_path is None:
        if not EXAMPLE.is_file():
            raise click.ClickException(
                f"{EXAMPLE} does not exist (asyncflow is not installed from a source checkout): give a config with --config PATH"
            )
        config_path = str(EXAMPLE)
    base = load_config(config_path, overrides)
    if steps:
        base = msgspec.structs.replace(base, train=msgspec.structs.replace(base.train, num_steps=steps))
    root = Path(out or tempfile.mkdtemp(prefix="af-bench-planner-"))
    root.mkdir(parents=True, exist_ok=True)
    if not base.model.path or not base.data.path:  # one model and data set for every run
        _, _, launch = prepare_new(base, root / "shared")
        base = msgspec.structs.replace(
            base,
            model=msgspec.structs.replace(base.model, path=launch.model_dir),
            data=msgspec.structs.replace(base.data, path=launch.data_path),
        )
    if rounds > 1:
        _rounds(base, root, rounds, window, as_json)
        return
    modes = {"online": True, **({"static": False} if compare else {})}
    results = {mode: _run(base, mode, on, root / mode, window) for mode, on in modes.items()}
    click.echo(
        f"\n{'':<12}{'first ' + str(window) + ' steps':>16}{'last ' + str(window) + ' steps':>16}{'last/first':>12}"
        f"{'whole run':>12}   (samples/s)"
    )
    for mode, r in results.items():
        click.echo(
            f"{mode:<12}{r['first_window_samples_per_s']:>16.2f}{r['last_window_samples_per_s']:>16.2f}"
            f"{r['speedup']:>11.2f}x{r['samples_per_s']:>12.2f}"
        )
    after = after_move(results, root)
    if after:
        line = f"steps {after['first_step']}-{after['last_step']} (after the move): online {after['online']:.2f} samples/s"
        if "static" in after:
            line += (
                f", static {after['static']:.2f} ({after['online'] / after['static']:.2f}x, same steps, run one after the other)"
            )
        click.echo(line)
        results["after_move"] = after
    for e in results["online"]["decisions"]:
        if e["event"] == "held":
            click.echo(f"held at step {e['step']}: {e['reason']}")
            continue
        click.echo(
            f"decision at step {e['step']}: {e['move']}  {e['split_before']} -> {e['split_after']}  "
            f"predicted step {e['predicted_step_s_before']:.3f} -> {e['predicted_step_s_after']:.3f} s "
            f"(gain {e['predicted_gain']:+.0%})  because {e['reason']}"
        )
    for e in results["online"]["measured"]:
        click.echo(
            f"measured at step {e['step']}: step {e['step_s_before']:.3f} -> {e['step_s_after']:.3f} s, "
            f"gain {e['measured_gain']:+.0%} (predicted {e['predicted_gain']:+.0%}); the move cost {e['cost_s']:.1f} s "
            f"and was in place {e['wall_s']:.1f} s after its decision (planner.move_cost_s calibrates the first move)"
        )
    if not results["online"]["decisions"]:
        click.echo("the planner made no decision: the roles were balanced within planner.imbalance_threshold")
    click.echo(f"(runs in {root})")
    if as_json:
        click.echo(json.dumps(results))


def _run(base, mode: str, on: bool, run_dir: Path, window: int) -> dict:
    """One run of ``base`` with the online planner on or off, and its figures."""
    import msgspec

    from asyncflow.actors.driver.launcher import run

    cfg = msgspec.structs.replace(base, planner=msgspec.structs.replace(base.planner, online=on))
    click.echo(f"== planner {mode} -> {run_dir} ==")
    summary = run(cfg, run_dir)
    rows = _read(run_dir / "metrics.jsonl")
    first, last = window_rates(rows, window)
    events = _read(run_dir / "planner.jsonl")
    return {
        "first_window_samples_per_s": first,
        "last_window_samples_per_s": last,
        "speedup": last / first,
        "samples_per_s": summary["samples_per_s"],
        "train_span_s": summary["train_span_s"],
        "decisions": [e for e in events if e["event"] in ("decision", "held")],
        "applied": [e for e in events if e["event"] == "applied"],
        "measured": [e for e in events if e["event"] == "measured"],
        "reverted": [e for e in events if e["event"] == "revert"],
        "run_dir": str(run_dir),
    }


def _rounds(base, root: Path, rounds: int, window: int, as_json: bool) -> None:
    """``rounds`` rounds of online and static, the order alternating; one line per round."""
    out = []
    for i in range(rounds):
        order = ["online", "static"] if i % 2 == 0 else ["static", "online"]
        got = {mode: _run(base, mode, mode == "online", root / f"round{i + 1}" / mode, window) for mode in order}
        on = got["online"]
        moves = [e for e in on["decisions"] if e["event"] == "decision"]
        held = [e["reason"] for e in on["decisions"] if e["event"] == "held"]
        out.append(
            {
                "round": i + 1,
                "order": order,
                "online_samples_per_s": on["samples_per_s"],
                "static_samples_per_s": got["static"]["samples_per_s"],
                "ratio": on["samples_per_s"] / got["static"]["samples_per_s"],
                "moves": [
                    f"step {e['step']}: {e['move']} (predicted {e['predicted_gain']:+.0%}, cost {e['cost']})" for e in moves
                ],
                "measured": [f"step {e['step']}: {e['measured_gain']:+.0%} (cost {e['cost_s']:.1f} s)" for e in on["measured"]],
                "reverted": len(on["reverted"]),
                "held": held[:3],
            }
        )
        r = out[-1]
        click.echo(
            f"round {r['round']} ({' then '.join(order)}): online {r['online_samples_per_s']:.2f} samples/s, "
            f"static {r['static_samples_per_s']:.2f}: {r['ratio']:.2f}x; moves {len(moves)}, reverted {r['reverted']}"
        )
        for line in [*r["moves"], *(f"measured {m}" for m in r["measured"]), *(f"held: {h}" for h in r["held"])]:
            click.echo(f"    {line}")
    ratios = [r["ratio"] for r in out]
    click.echo(
        f"online / static, whole run, per round: {' '.join(f'{x:.2f}' for x in ratios)} "
        f"(slowest {min(ratios):.2f}x, median {sorted(ratios)[len(ratios) // 2]:.2f}x)  (runs in {root})"
    )
    if as_json:
        click.echo(json.dumps({"rounds": out, "ratios": ratios}))
