"""What the model writes in training, readable: RUN_DIR/samples.jsonl (``afctl samples
RUN_DIR`` prints it as a table). Every ``logging.samples_every`` steps (by default every
step) the trainer appends ``logging.samples_per_step`` (2) of the step's rows, decoded
(step, prompt, response, reward, finish, version). The first rows of the step's batch
are taken: whole groups come first, so the samples of one prompt sit together. The
evaluation's completions have a file of their own (``evaluation/evaluator.py``,
RUN_DIR/eval_samples.jsonl).

Keyed by the step of the metrics.jsonl record they go with, so a resume cuts them back
to its checkpoint as it cuts metrics.jsonl (``driver/prepare.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"


class SampleLog:
    def __init__(self, run_dir: str | Path, tokenizer: Callable[[], Any], every: int, count: int):
        """``tokenizer()``: the run's tokenizer, loaded at the first ``write``."""
        self.path = Path(run_dir) / SAMPLES_FILE
        self._load_tokenizer = tokenizer
        self._tokenizer: Any = None
        self.every, self.count = every, count

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def write(self, step: int, columns: dict[str, list], versions: list[int]) -> None:
        """Append the first ``count`` rows of ``columns`` (prompt_ids, response_ids,
        reward, finish: a sequence of arrays per row) as text."""
        if self._tokenizer is None:
            self._tokenizer = self._load_tokenizer()
        tokenizer = self._tokenizer
        decode = lambda ids: tokenizer.decode([int(t) for t in ids], skip_special_tokens=True)  # noqa: E731
        rows = []
        for b in range(min(self.count, len(columns["response_ids"]))):
            rows.append(
                {
                    "step": step,
                    "prompt": decode(columns["prompt_ids"][b]),
                    "response": decode(columns["response_ids"][b]),
                    "reward": float(columns["reward"][b][0]),
                    "finish": "stop" if int(columns["finish"][b][0]) else "length",
                    "version": versions[b],
                }
            )
        _append(self.path, rows)


def _append(path: Path, rows: list[dict]) -> None:
    """One write per call: a reader (``tail -f``, ``afctl samples``) sees whole lines."""
    with path.open("a") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
