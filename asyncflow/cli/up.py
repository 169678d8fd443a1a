"""``afctl up``: run a post-training job from a cluster.toml."""

from __future__ import annotations

import os
import signal
import sys

import click


@click.command()
@click.argument("config", required=False, type=click.Path(dir_okay=False))
@click.option("--run-dir", type=click.Path(file_okay=False), help="Where to write the run (default runs/<config>-<time>).")
@click.option(
    "--resume", type=click.Path(file_okay=False, exists=True), help="Continue the run in this directory from its last checkpoint."
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Change one config key (repeatable), e.g. --set train.num_ranks=2 --set train.engine.fsdp=true.",
)
def up(config: str | None, run_dir: str | None, resume: str | None, overrides: tuple[str, ...]) -> None:
    """Start every role of CONFIG on this machine (or the cluster it names) and train.

    Progress is one line per trainer step; RUN_DIR gets config.json, metrics.jsonl,
    checkpoints/ (Hugging Face format) and summary.json. Ctrl-C (or SIGTERM) stops
    every process in order.
    --set KEY=VALUE changes a key of CONFIG for this run (the resolved config is
    saved in RUN_DIR/config.json). With --resume, --set may change only the keys
    that are safe to change mid-run (train.num_steps to extend a finished run,
    train.checkpoint_every, logging.*, ...); any other is refused by name.
    """
    from asyncflow.actors.driver.launcher import run
    from asyncflow.actors.driver.prepare import default_run_dir
    from asyncflow.actors.driver.supervisor import RunFailed
    from asyncflow.config.load import ConfigError, load_config

    if bool(config) == bool(resume):
        raise click.UsageError("give a CONFIG file to start a run, or --resume RUN_DIR to continue one (not both)")

    def terminate(*_):  # `kill`, a scheduler cancelling the job: the same orderly stop as Ctrl-C
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    try:
        if resume:
            summary = run(None, None, resume=resume, resume_overrides=overrides)
        else:
            assert config is not None  # exactly one of config and resume (checked above)
            summary = run(load_config(config, overrides), run_dir or default_run_dir(config))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    except RunFailed as exc:
        click.echo(f"run failed: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    click.echo(
        f"done: {summary['steps']} steps, {summary['samples_per_s']:.1f} samples/s, {summary['tokens_per_s']:.0f} tokens/s, "
        f"reward {summary['reward_first_10pct']:.3f} (first 10%) -> {summary['reward_last_10pct']:.3f} (last 10%), "
        f"staleness <= {summary['staleness_max']}"
    )
    if "sessions_trained" in summary:  # [rollout.gateway] train: what became of the agents' sessions
        click.echo(
            f"sessions: {summary['sessions_trained']} trained, {summary['sessions_stale']} discarded as stale "
            f"({summary['sessions_stale_frac']:.1%}); staleness mean {summary['staleness_mean']:.2f}, "
            f"max {int(summary['staleness_max'])}"
        )
    if summary.get("ended"):  # ended before its last step: why (the agents stopped sending)
        click.echo(f"ended early: {summary['ended']}")
    if summary.get("checkpoint"):  # the Hugging Face directory, what from_pretrained and model.path load
        click.echo(model_line(summary["checkpoint"]))
    if summary.get("val_best_accuracy") is not None:  # [eval]: steps counted as in the progress lines
        start = summary.get("val_start_accuracy")
        click.echo(
            (f"held-out accuracy: start {start:.3f}, " if start is not None else "held-out accuracy: ")
            + f"best {summary['val_best_accuracy']:.3f} after step {summary['val_best_step']}, "
            f"last {summary['val_final_accuracy']:.3f}"
        )


def model_line(checkpoint: str) -> str:
    """The run's last word on its model: where the trained weights are and how to load
    them. A LoRA checkpoint's ``model/`` holds the frozen base weights beside the
    adapter: loaded as is, it is the untrained model, so the line points at the merged
    model (``lora.save_merged``) or says to load the adapter."""
    model = os.path.join(checkpoint, "model")
    latest = os.path.join(os.path.dirname(checkpoint), "latest")
    if os.path.isdir(os.path.join(model, "adapter")):
        merged = os.path.join(model, "merged")
        if os.path.isdir(merged):
            return (
                f"model: {merged} (LoRA, base + adapter merged; load it with transformers: README.md, 'Load the trained model')"
            )
        return (
            f"model: {model} holds the base weights and the trained LoRA adapter ({os.path.join(model, 'adapter')}, "
            "peft's layout): from_pretrained on it alone gives the untrained model. Load the adapter with peft "
            "(README.md, 'Load the trained model'), or set [train.engine.lora] save_merged = true for a merged model"
        )
    return f"model: {model} (also {latest}; load it with transformers: README.md, 'Load the trained model')"
