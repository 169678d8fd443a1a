"""Benchmarks that compare several runs (``bench e2e``, ``bench peer``) start them all
from the same weights and data: the tiny model and data set are built once. And the
``--model DIR`` option of the engine benchmarks (``bench rollout``, ``bench train``,
``bench decode``) and the tiny model they build without one."""

from __future__ import annotations

from pathlib import Path

import click
import msgspec

from asyncflow.config.run import RunConfig


def with_shared_inputs(base: RunConfig, root: Path) -> RunConfig:
    """``base`` with ``model.path`` and ``data.path`` set, building the tiny model and
    data into ``root/shared`` when the config names none."""
    if base.model.path and base.data.path:
        return base
    from asyncflow.actors.driver.prepare import prepare_new

    _, _, launch = prepare_new(base, root / "shared")
    return msgspec.structs.replace(
        base,
        model=msgspec.structs.replace(base.model, path=launch.model_dir),
        data=msgspec.structs.replace(base.data, path=launch.data_path),
    )


def model_option(ignored: str):
    """``--model DIR`` (into ``model_path``): a real model instead of the tiny one; ``ignored``
    names what the benchmark then ignores."""
    return click.option(
        "--model",
        "model_path",
        type=click.Path(exists=True, file_okay=False),
        default=None,
        help=f"A Hugging Face model directory (e.g. afctl model import-gguf smollm2 DIR) instead of the tiny one ({ignored}).",
    )


def bench_tiny_model(prefix: str, hidden_size: int, num_layers: int) -> str:
    """The engine benchmarks' tiny model (without ``--model``): ``hidden_size`` x
    ``num_layers``, 4 heads of which 2 key-value, built into a fresh temporary directory."""
    import tempfile

    from asyncflow.toy.tiny import make_tiny_model

    return str(
        make_tiny_model(
            tempfile.mkdtemp(prefix=prefix),
            seed=0,
            hidden_size=hidden_size,
            num_layers=num_layers,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=3 * hidden_size,
        )
    )
