"""Entry point of ``afctl``. Each command lives in its own module, imported lazily."""

from __future__ import annotations

import click

from asyncflow import __version__
from asyncflow.cli._lazy import LazyGroup

COMMANDS = {
    "up": ("asyncflow.cli.up:up", "Run an RL post-training job from a cluster.toml."),
    "plan": ("asyncflow.cli.plan:plan", "Preview the best split of devices between rollout and training."),
    "profile": ("asyncflow.cli.profile:profile", "Calibrate the planner's cost model on this hardware."),
    "bench": (
        "asyncflow.cli.bench:bench",
        "Benchmarks: transport, queue, rollout, decode, prefix, train, e2e, weights, planner, peer, lora, fanout.",
    ),
    "twin": (
        "asyncflow.cli.twin:twin",
        "A digital twin: N emulated devices run by the real control plane, sync vs async vs colocated.",
    ),
    "model": ("asyncflow.cli.model:model", "Get a real model as a Hugging Face directory (import-gguf)."),
    "certs": ("asyncflow.cli.certs:certs", "Make a cluster CA and node certificate for TLS (tcp)."),
    "status": ("asyncflow.cli.status:status", "Show the actors of a running cluster."),
    "trace": ("asyncflow.cli.trace:trace", "Draw the timeline of a run directory."),
    "plot": ("asyncflow.cli.plot:plot", "Plot metrics of one or more run directories."),
    "samples": ("asyncflow.cli.samples:samples", "Print what the model wrote in a run directory, as a table."),
}


@click.group(cls=LazyGroup, lazy_commands=COMMANDS)
@click.version_option(__version__)  # not looked up by distribution: asyncflow-rl installs `import asyncflow`
def main() -> None:
    """asyncflow: asynchronous streaming RL post-training for LLMs."""


if __name__ == "__main__":
    main()
