"""``afctl samples RUN_DIR [--step N] [--worst | --best] [--eval] [--limit N]``: what the
model wrote, as a table of step, version, reward, prompt and completion (and the
reference answer with ``--eval``), one line per row, shortened to the terminal's width.
Steps are numbered as the progress lines number them (``shown_step``).

It reads RUN_DIR/samples.jsonl (training: ``logging.samples_every``,
``logging.samples_per_step``) or, with ``--eval``, RUN_DIR/eval_samples.jsonl (every
completion of every evaluation, ``[eval]``); both are written by the trainer
(``actors/trainer/_samples.py``; docs/metrics.md, 'What the model writes'). The data
functions (``read_samples``, ``shown_step``, ``choose``, ``table``) are pure and tested on planted files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

FILES = {False: "samples.jsonl", True: "eval_samples.jsonl"}
WRITTEN_BY = {
    False: "the trainer writes it every logging.samples_every steps (0: never); set it >= 1 for the next run",
    True: "the trainer writes it at every evaluation: set eval.every_steps > 0 for the next run",
}
NUMBERS = ("step", "version", "reward")
GAP = " | "


def shown_step(row: dict, evaluation: bool = False) -> int:
    """The step number a user reads, as the progress lines number steps (1-based; the
    files' ``step`` is the step's 0-based index, docs/metrics.md): a training row's
    step is the step that trained on it; an evaluation's is the number of steps trained
    before it, its policy ``version`` (0: the start evaluation, ``eval.at_start``)."""
    return int(row["version"]) if evaluation else int(row["step"]) + 1


def read_samples(run_dir: Path, evaluation: bool = False) -> list[dict]:
    """The rows of RUN_DIR's sample log (the evaluation's with ``evaluation``), in the
    order written; a torn last line (the run is writing it) is left out."""
    from asyncflow.actors.driver.summary import complete_lines

    path = run_dir / FILES[evaluation]
    if not path.exists():
        raise click.ClickException(f"{path} does not exist: {WRITTEN_BY[evaluation]}")
    return [json.loads(line) for line in complete_lines(path)]


def choose(rows: list[dict], step: int | None = None, order: str = "", limit: int = 0, evaluation: bool = False) -> list[dict]:
    """The rows of ``step`` (``shown_step``; all without it), ordered by reward
    (``order``: ``worst`` first or ``best`` first; ties keep the file's order) or as
    written; the first ``limit`` of them (0: all)."""
    chosen = [r for r in rows if step is None or shown_step(r, evaluation) == step]
    if order:
        chosen.sort(key=lambda r: r["reward"], reverse=order == "best")
    return chosen[:limit] if limit else chosen


def _cell(value: object, column: str) -> str:
    if column == "reward":
        return f"{float(value):.3f}"  # type: ignore[arg-type]
    if value is None:
        return ""
    return "⏎".join(str(value).splitlines())  # one line per row: a newline is shown, not printed


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def table(rows: list[dict], width: int, evaluation: bool = False) -> list[str]:
    """A header, its rule and one line per row, each at most ``width`` characters: the
    numbers whole, the text columns sharing the rest (the completion the most)."""
    texts = ["prompt", "response"] + (["answer"] if evaluation else [])
    names = {"response": "completion", "step": "after step" if evaluation else "step"}
    cells = [{**{c: _cell(r.get(c), c) for c in (*NUMBERS, *texts)}, "step": str(shown_step(r, evaluation))} for r in rows]
    widths = {c: max([len(names.get(c, c))] + [len(row[c]) for row in cells]) for c in (*NUMBERS, *texts)}
    room = width - sum(widths[c] for c in NUMBERS) - len(GAP) * (len(NUMBERS) + len(texts) - 1)
    shares = {"prompt": 0.4, "response": 0.6} if not evaluation else {"prompt": 0.35, "response": 0.45, "answer": 0.2}
    # each text column gets what it needs up to its share; what a short one leaves goes to the others
    need = {c: widths[c] for c in texts}
    fair = {c: max(int(room * shares[c]), len(names.get(c, c))) for c in texts}
    spare = room - sum(min(need[c], fair[c]) for c in texts)
    for c in sorted(texts, key=lambda c: -shares[c]):
        widths[c] = min(need[c], fair[c])
        extra = min(max(spare, 0), need[c] - widths[c])
        widths[c] += extra
        spare -= extra
    columns = [*NUMBERS, *texts]

    def line(values: dict[str, str]) -> str:
        out = []
        for c in columns:
            text = _fit(values[c], widths[c])
            out.append(text.rjust(widths[c]) if c in NUMBERS else text.ljust(widths[c]))
        return GAP.join(out).rstrip()

    header = line({c: names.get(c, c) for c in columns})
    rule = "-+-".join("-" * widths[c] for c in columns)
    return [header, rule] + [line(row) for row in cells]


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--step",
    type=int,
    default=None,
    help="Only the rows of step N, numbered as the progress lines number steps (1: the first); with --eval, "
    "the evaluation after step N (0: the start evaluation).",
)
@click.option("--worst", is_flag=True, help="Lowest reward first.")
@click.option("--best", is_flag=True, help="Highest reward first.")
@click.option(
    "--eval",
    "evaluation",
    is_flag=True,
    help="The evaluation's completions (RUN_DIR/eval_samples.jsonl, with the reference answer) instead of training's.",
)
@click.option("--limit", type=click.IntRange(min=0), default=0, help="Print at most this many rows (0: all).")
def samples(run_dir: Path, step: int | None, worst: bool, best: bool, evaluation: bool, limit: int) -> None:
    """What the model wrote in RUN_DIR, as a table: step (1-based, as the progress lines
    number steps), policy version, reward, prompt and completion, one line each,
    shortened to the terminal's width. Training's rows come from RUN_DIR/samples.jsonl
    (logging.samples_every, logging.samples_per_step), the evaluation's, with --eval,
    from RUN_DIR/eval_samples.jsonl."""
    if worst and best:
        raise click.UsageError("--worst or --best, not both")
    written = read_samples(run_dir, evaluation)
    rows = choose(written, step, "worst" if worst else "best" if best else "", limit, evaluation)
    if not rows:
        steps = sorted({shown_step(r, evaluation) for r in written})
        has = f"rows of steps {steps[0]} to {steps[-1]} ({len(steps)} steps)" if steps else "no rows yet"
        raise click.ClickException(f"{run_dir / FILES[evaluation]} has {has}" + (f", none of step {step}" if steps else ""))
    for text in table(rows, shutil.get_terminal_size().columns, evaluation):
        click.echo(text)
