"""What the model writes, readable: every ``logging.samples_every`` steps the trainer
appends ``logging.samples_per_step`` of the step's rows, decoded, to
RUN_DIR/samples.jsonl (one JSON object per row: step, prompt, response, reward,
finish, version). The first rows of the step's batch are taken: whole groups come
first, so the samples of one prompt sit together."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"


class SampleLog:
    def __init__(self, run_dir: str | Path, tokenizer: Callable[[], Any], every: int, count: int):
        """``tokenizer()``: the run's tokenizer, loaded at the first write."""
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
        lines = []
        for b in range(min(self.count, len(columns["response_ids"]))):
            row = {
                "step": step,
                "prompt": decode(columns["prompt_ids"][b]),
                "response": decode(columns["response_ids"][b]),
                "reward": float(columns["reward"][b][0]),
                "finish": "stop" if int(columns["finish"][b][0]) else "length",
                "version": versions[b],
            }
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        with self.path.open("a") as f:
            f.writelines(lines)
