"""How a config's processes share this machine's cores: the same config run once per
thread layout, one after the other in one invocation, samples/s side by side.

    python scripts/threads_check.py --config examples/smollm2.toml --steps 4 --json

Layouts (each sets every key it depends on, whatever the config says):
    async, pinned        the trainer on a core of its own with 1 thread, the rest on the other
                         (``cluster.pin_trainer_cores = 1``)
    async, trainer x2    nothing pinned, the trainer with 2 threads: it takes both cores while
                         the rollout idles, and shares them while it generates
    async, all x2        nothing pinned, the trainer and the rollout with 2 threads each
    sync, 1 thread       every process with 1 thread (its phases take turns on one core)
    sync, 2 threads      every process with 2 threads

No held-out evaluation and no checkpoints: the figures are the trainer's samples/s over
its training span (summary.json), and each role's busy seconds.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS: dict[str, list[str]] = {
    "async_pinned": [
        *("workflow.mode=async", "cluster.pin_trainer_cores=1", "cluster.threads_per_process=1"),
        *("train.engine.num_threads=1", "rollout.engine.num_threads=1"),
    ],
    "async_trainer2": [
        *("workflow.mode=async", "cluster.pin_trainer_cores=0", "cluster.threads_per_process=1"),
        *("train.engine.num_threads=2", "rollout.engine.num_threads=1"),
    ],
    "async_all2": [
        *("workflow.mode=async", "cluster.pin_trainer_cores=0", "cluster.threads_per_process=1"),
        *("train.engine.num_threads=2", "rollout.engine.num_threads=2"),
    ],
    "sync_1": [
        *("workflow.mode=sync", "cluster.pin_trainer_cores=0", "cluster.threads_per_process=1"),
        *("train.engine.num_threads=1", "rollout.engine.num_threads=1"),
    ],
    "sync_2": [
        *("workflow.mode=sync", "cluster.pin_trainer_cores=0", "cluster.threads_per_process=2"),
        *("train.engine.num_threads=2", "rollout.engine.num_threads=2"),
    ],
}
QUIET = ["eval.every_steps=0", "eval.at_start=false", "train.checkpoint_every=0", "logging.progress=false"]


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--steps", default=4, show_default=True, help="Trainer steps per layout.")
@click.option("--layouts", default=",".join(LAYOUTS), show_default=True, help="Which layouts, comma-separated.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="A config key for every layout (repeatable).")
@click.option("--out", type=click.Path(file_okay=False), help="Keep the run directories here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def main(config_path: str, steps: int, layouts: str, overrides: tuple[str, ...], out: str | None, as_json: bool) -> None:
    import msgspec

    from asyncflow.actors.driver.launcher import run
    from asyncflow.bench.shared_inputs import with_shared_inputs
    from asyncflow.config.load import load_config

    names = [n.strip() for n in layouts.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        raise click.BadParameter(f"unknown layout(s) {unknown}; choose from {list(LAYOUTS)}", param_hint="--layouts")
    root = Path(out or tempfile.mkdtemp(prefix="af-threads-"))
    root.mkdir(parents=True, exist_ok=True)
    # every layout: the same weights and data, prepared once
    shared = with_shared_inputs(load_config(config_path, [*overrides, *QUIET]), root)
    results: dict[str, dict] = {}
    for i, name in enumerate(names, 1):
        keys = [*overrides, *QUIET, f"train.num_steps={steps}", *LAYOUTS[name]]
        cfg = msgspec.structs.replace(load_config(config_path, keys), model=shared.model, data=shared.data)
        click.echo(f"== {name} ({i}/{len(names)}): {' '.join(LAYOUTS[name])}", err=True)
        summary = run(cfg, root / name)
        results[name] = {
            "samples_per_s": summary["samples_per_s"],
            "train_span_s": summary["train_span_s"],
            "busy_s": {role: round(s, 1) for role, s in summary["busy_s"].items()},
            "pinned_trainer_cores": summary.get("pinned_trainer_cores", 0),
            "keys": LAYOUTS[name],
        }
    first = results[names[0]]["samples_per_s"]
    click.echo(f"\n{'layout':<16}{'samples/s':>10}{'vs ' + names[0]:>20}{'s/step':>8}  busy s per step")
    for name, r in results.items():
        busy = ", ".join(f"{role} {s / steps:.0f}" for role, s in sorted(r["busy_s"].items()) if s >= 0.5)
        click.echo(
            f"{name:<16}{r['samples_per_s']:>10.3f}{r['samples_per_s'] / first:>19.2f}x{r['train_span_s'] / steps:>8.1f}  {busy}"
        )
    if as_json:
        click.echo(json.dumps({"config": config_path, "steps": steps, "layouts": results}))


if __name__ == "__main__":
    main()
