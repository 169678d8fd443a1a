"""``afctl twin``: a cluster of emulated devices run by the real control plane, in sync,
async and a colocated baseline, side by side (asyncflow/bench/twin.py; docs/scale.md,
"The digital twin")."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click


@click.command()
@click.option("--model", default="7b", show_default=True, help="The planner's preset the engines emulate: 7b or 32b.")
@click.option(
    "--npus", type=int, required=True, help="Devices of the emulated cluster (NPUs or GPUs), split as the planner splits them."
)
@click.option("--hardware", default="910b", show_default=True, help="A device of the cluster: 910b, h100 (a100, h200).")
@click.option("--steps", default=6, show_default=True, help="Trainer steps per mode (the first 2 are left out of the figures).")
@click.option(
    "--time-scale",
    default="auto",
    show_default=True,
    help="Seconds here per modelled second; auto: the predicted async step sleeps about --step-s.",
)
@click.option(
    "--step-s",
    default=2.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="With --time-scale auto: the seconds the predicted async step takes here. A larger batch needs more: the "
    "emulated engines' own CPU per step grows with the rows (16 s for 1,024 x 16 on this 2-core box).",
)
@click.option("--modes", default="sync,async,colocated", show_default=True, help="Comma list of sync, async, colocated.")
@click.option(
    "--rollout",
    default="auto",
    show_default=True,
    help="How async replicas generate: unit (a generate call per unit), stream (partial rollout: one continuous "
    "stream per replica) or auto (what the run config's workflow.partial_rollout = auto takes). Sync and colocated "
    "run unit.",
)
@click.option("--prompts", default=256, show_default=True, help="Prompts per step (the batch).")
@click.option("--group", default=8, show_default=True, help="Samples per prompt (the GRPO group).")
@click.option("--out", type=click.Path(file_okay=False), help="Keep each mode's config and run directory here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def twin(
    model: str,
    npus: int,
    hardware: str,
    steps: int,
    time_scale: str,
    step_s: float,
    modes: str,
    rollout: str,
    prompts: int,
    group: int,
    out: str | None,
    as_json: bool,
) -> None:
    """Emulate NPUS devices of HARDWARE training MODEL: the planner's split becomes a run of
    emulated engines (rollout replicas packed many to a process), and the real control
    plane (driver, directory, queue, loader, weight sync) runs it in each mode. Prints per
    mode the framework's overhead per step (queue, weights, directory, driver; ms here and
    as a fraction of the emulated step), the throughput reached against the planner's
    prediction (modelled samples/s) and the async/sync and async/colocated speedups."""
    from asyncflow.bench import twin as tw

    try:
        asked = tw.check_flags(model, npus, hardware, steps, time_scale, modes, prompts, group, rollout)
    except tw.TwinError as exc:
        raise click.UsageError(str(exc)) from None
    from asyncflow.actors.driver.launcher import quiet_progress_bars
    from asyncflow.actors.driver.preflight import mean_prompt_tokens
    from asyncflow.bench.shared_inputs import with_shared_inputs
    from asyncflow.config.load import load_config_text

    root = Path(out or tempfile.mkdtemp(prefix="af-twin-"))
    root.mkdir(parents=True, exist_ok=True)
    tw.say_stderr(
        f"twin: {model} on {npus} {hardware}, {prompts} prompts x {group} per step; building the shared inputs in {root}"
    )
    # the tiny tokenizer and the prompts, built once: every mode reads the same (its prompt length is the workload's)
    probe_plan = tw.ModePlan(
        mode="async",
        workflow_mode="async",
        replicas=1,
        rollout_tp=1,
        rollout_devices=1,
        train_devices=1,
        train_tp=1,
        train_pp=1,
        prompts_per_call=1,
        per_process=1,
        predicted_step_s=1.0,
        predicted_samples_per_s=1.0,
        predicted_stage_s={},
        bottleneck="",
    )
    base = load_config_text(tw.config_text(probe_plan, model, hardware, 1.0, steps, prompts, group), "twin")
    quiet_progress_bars()  # before the tiny tokenizer is saved
    base = with_shared_inputs(base, root)
    prompt_tokens = mean_prompt_tokens(base, base.data.path, base.model.path)
    wl = tw.workload(prompts, group, prompt_tokens, tw.emulated_mean_response())
    try:
        plans = tw.plan_modes(model, hardware, npus, wl, asked, rollout)
    except tw.TwinError as exc:
        raise click.UsageError(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(f"--npus {npus}: {exc}") from None
    anchor = plans.get("async") or next(iter(plans.values()))
    scale = float(time_scale) if time_scale != "auto" else step_s / anchor.predicted_step_s
    tw.say_stderr(
        f"workload: prompts {wl.prompt_len_tokens} tokens, responses {wl.response_len_tokens} mean / "
        f"{wl.max_response_len_tokens} cap (modelled; x{tw.TOKEN_SCALE} the emulated), no reference; time_scale {scale:.3g}"
    )
    results: dict[str, dict] = {}
    for i, mode in enumerate(asked, 1):
        mp = plans[mode]
        cfg_path = root / f"{mode}.toml"
        cfg_path.write_text(tw.config_text(mp, model, hardware, scale, steps, prompts, group, base.model.path, base.data.path))
        load_config_text(cfg_path.read_text(), str(cfg_path))  # a config the loader refuses is this process's error
        tw.say_stderr(
            f"[{i}/{len(asked)}] {mode} ({mp.rollout}): {mp.replicas} rollout replicas (tp {mp.rollout_tp}, {mp.per_process} per process), "
            f"trainer on {mp.train_devices} devices; predicted {mp.predicted_step_s:.1f} s/step "
            f"(here {mp.predicted_step_s * scale:.2f} s), config {cfg_path}"
        )
        try:
            results[mode] = tw.run_mode_process(cfg_path, root / mode, mp, scale, steps)
        except Exception as exc:  # the run's own words are in its log
            raise click.ClickException(
                f"the {mode} run failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; its output is in "
                f"{root / mode / 'twin.log'} and its processes' logs in {root / mode / 'logs'}"
            ) from None
    report = tw.report(model, hardware, npus, wl, scale, results)
    for line in tw.table(report):
        click.echo(line)
    if as_json:
        click.echo(json.dumps(report))
