"""``afctl bench e2e``: one config end to end in sync and in async (k=1) mode, one
after the other in one invocation, on the same model and data."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", default=20, show_default=True, help="Trainer steps per mode.")
@click.option("--staleness", default=1, show_default=True, help="k of the async run.")
@click.option("--out", type=click.Path(file_okay=False), help="Keep both run directories here.")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change a config key for both runs, as afctl up --set (repeatable).",
)
@click.option(
    "--breakdown",
    is_flag=True,
    help="Also print where each role's time goes, per activity and phase, in ms per trainer step "
    "(compute vs the framework's share), from each run's trace.json; the JSON gets it too.",
)
@click.option(
    "--partial-rollout",
    is_flag=True,
    help="Compare async with [workflow] partial_rollout off and on (instead of sync and async), and the "
    "rollout's idle fraction of each.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def e2e(
    config_path: str,
    steps: int,
    staleness: int,
    out: str | None,
    overrides: tuple[str, ...],
    breakdown: bool,
    partial_rollout: bool,
    as_json: bool,
) -> None:
    """Samples/s and tokens/s of sync vs async, busy fraction of every role, and
    pipeline efficiency (busiest role's busy time over the training span). With
    --partial-rollout: async without and with partial rollout instead."""
    import msgspec

    from asyncflow.actors.driver.launcher import run
    from asyncflow.bench.shared_inputs import with_shared_inputs
    from asyncflow.config.load import load_config
    from asyncflow.config.run import validate
    from asyncflow.core.schema import ConfigError

    base = load_config(config_path, list(overrides))
    root = Path(out or tempfile.mkdtemp(prefix="af-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    base = with_shared_inputs(base, root)  # both modes start from the same weights and data
    results = {}
    # (label, mode, partial rollout): the two runs compared, one after the other
    runs = (
        [("async", "async", False), ("partial", "async", True)]
        if partial_rollout
        else [("sync", "sync", False), ("async", "async", False)]
    )
    for label, mode, partial in runs:
        cfg = msgspec.structs.replace(
            base,
            workflow=msgspec.structs.replace(base.workflow, mode=mode, staleness=staleness, partial_rollout=partial),
            train=msgspec.structs.replace(base.train, num_steps=steps, checkpoint_every=0),
        )
        try:  # the rules hold for the changed config too (a combination the file never had)
            validate(cfg)
        except ConfigError as exc:
            raise click.UsageError(f"the {label} run's config: {exc}") from None
        click.echo(f"== {label} ==")
        results[label] = run(cfg, root / label)
    (first, _, _), (second, _, _) = runs
    if partial_rollout:
        partial_report(results[first], results[second], base.rollout.prompts_per_call * base.algorithm.group_size, root, as_json)
        return
    s, a = results["sync"], results["async"]
    click.echo(f"\n{'':<22}{'sync':>12}{'async':>12}")
    for key in ("samples_per_s", "tokens_per_s", "pipeline_efficiency", "staleness_max", "train_span_s"):
        click.echo(f"{key:<22}{s[key]:>12.3f}{a[key]:>12.3f}")
    for role in sorted(set(s["busy_fraction"]) | set(a["busy_fraction"])):
        click.echo(f"{'busy ' + role:<22}{s['busy_fraction'].get(role, 0):>12.3f}{a['busy_fraction'].get(role, 0):>12.3f}")
    ratio = a["samples_per_s"] / s["samples_per_s"]
    click.echo(f"async / sync samples/s: {ratio:.2f}x   (runs in {root})")
    extra = {}
    if breakdown:
        from asyncflow.bench._breakdown import breakdown as of_trace
        from asyncflow.bench._breakdown import rounded, table
        from asyncflow.cli.runs import load_trace

        by_mode = {mode: of_trace(load_trace(root / mode / "trace.json"), steps) for mode in ("sync", "async")}
        click.echo("")
        for line in table(by_mode):
            click.echo(line)
        extra = {
            "steps": steps,
            "breakdown": {mode: rounded(b) for mode, b in by_mode.items()},
            "sync_ms_per_step": 1e3 * s["train_span_s"] / steps,
            "async_ms_per_step": 1e3 * a["train_span_s"] / steps,
        }
    if as_json:
        click.echo(
            json.dumps(
                {
                    **extra,
                    "sync_samples_per_s": s["samples_per_s"],
                    "async_samples_per_s": a["samples_per_s"],
                    "sync_tokens_per_s": s["tokens_per_s"],
                    "async_tokens_per_s": a["tokens_per_s"],
                    "ratio": ratio,
                    "sync_pipeline_efficiency": s["pipeline_efficiency"],
                    "async_pipeline_efficiency": a["pipeline_efficiency"],
                    "sync_busy_fraction": s["busy_fraction"],
                    "async_busy_fraction": a["busy_fraction"],
                }
            )
        )


def partial_report(off: dict, on: dict, capacity: int, root: Path, as_json: bool) -> None:
    """Async without vs with partial rollout: samples/s, tokens/s, and the rollout
    replicas' idleness: the time they wait (1 - busy), the empty rows of their decode
    batches (1 - mean decode batch / ``capacity``, the sequences a unit or the stream
    holds at most), and both together, ``rollout idle = 1 - busy x row occupancy``."""

    def idle(result: dict) -> tuple[float, float, float]:
        names = [role for role in result["busy_fraction"] if role.startswith("rollout")]
        busy = sum(result["busy_fraction"][r] for r in names) / max(len(names), 1)
        steps = sum(result["counters"].get(r, {}).get("decode_steps", 0.0) for r in names)
        rows = sum(result["counters"].get(r, {}).get("decode_rows", 0.0) for r in names)
        occupancy = rows / (steps * capacity) if steps else float("nan")
        return 1.0 - busy, 1.0 - occupancy, 1.0 - busy * occupancy

    click.echo(f"\n{'':<22}{'async':>12}{'partial':>12}")
    for key in ("samples_per_s", "tokens_per_s", "pipeline_efficiency", "staleness_max", "train_span_s"):
        click.echo(f"{key:<22}{off[key]:>12.3f}{on[key]:>12.3f}")
    for role in sorted(set(off["busy_fraction"]) | set(on["busy_fraction"])):
        click.echo(f"{'busy ' + role:<22}{off['busy_fraction'].get(role, 0):>12.3f}{on['busy_fraction'].get(role, 0):>12.3f}")
    idle_off, idle_on = idle(off), idle(on)
    for i, name in enumerate(("rollout waiting", "rollout empty rows", "rollout idle")):
        click.echo(f"{name:<22}{idle_off[i]:>12.3f}{idle_on[i]:>12.3f}")
    ratio = on["samples_per_s"] / off["samples_per_s"]
    click.echo(f"partial / async samples/s: {ratio:.2f}x, rollout idle {idle_off[2]:.3f} -> {idle_on[2]:.3f}   (runs in {root})")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "async_samples_per_s": off["samples_per_s"],
                    "partial_samples_per_s": on["samples_per_s"],
                    "async_tokens_per_s": off["tokens_per_s"],
                    "partial_tokens_per_s": on["tokens_per_s"],
                    "ratio": ratio,
                    "async_rollout_idle": idle_off[2],
                    "partial_rollout_idle": idle_on[2],
                    "async_rollout_empty_rows": idle_off[1],
                    "partial_rollout_empty_rows": idle_on[1],
                    "async_busy_fraction": off["busy_fraction"],
                    "partial_busy_fraction": on["busy_fraction"],
                }
            )
        )
