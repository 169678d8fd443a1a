"""What the model writes, readable, in two JSON-lines files of the run directory
(``afctl samples RUN_DIR`` prints them as a table):

- RUN_DIR/samples.jsonl, training: every ``logging.samples_every`` steps (by default
  every step) the trainer appends ``logging.samples_per_step`` (2) of the step's rows,
  decoded (step, prompt, response, reward, finish, version). The first rows of the
  step's batch are taken: whole groups come first, so the samples of one prompt sit
  together.
- RUN_DIR/eval_samples.jsonl, the evaluation: every completion of every evaluation
  (``write_eval``; step, version, prompt, response, reward, answer, finish), the
  start evaluation (``eval.at_start``) included.

Both are keyed by the step of the metrics.jsonl record they go with, so a resume cuts
them back to its checkpoint as it cuts metrics.jsonl (``driver/prepare.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"
EVAL_SAMPLES_FILE = "eval_samples.jsonl"


class SampleLog:
    def __init__(self, run_dir: str | Path, tokenizer: Callable[[], Any], every: int, count: int):
        """``tokenizer()``: the run's tokenizer, loaded at the first ``write``."""
        self.path = Path(run_dir) / SAMPLES_FILE
        self.eval_path = Path(run_dir) / EVAL_SAMPLES_FILE
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

    def write_eval(
        self,
        step: int,
        version: int,
        prompts: Sequence[str],
        completions: Sequence[str],
        rewards: Sequence[float],
        answers: Sequence[str],
        finish: Sequence[str] | None = None,
    ) -> None:
        """Append one evaluation's completions to RUN_DIR/eval_samples.jsonl, one row
        each, in the order given: ``step``, the metrics.jsonl record its ``val/*``
        figures go into (0 for the start evaluation); ``version``, the policy version
        evaluated (0 at the start, ``step + 1`` after a step); the i-th prompt, its
        completion (decoded text), reward and reference answer; ``finish`` (optional):
        each one's finish reason (``stop``, ``length``), else null. Written whatever
        ``logging.samples_every`` says."""
        num = len(completions)
        if not (len(prompts) == len(rewards) == len(answers) == num and (finish is None or len(finish) == num)):
            raise ValueError(
                "write_eval takes one prompt, completion, reward and answer per row (and one finish reason, when given): "
                f"got {len(prompts)} prompts, {num} completions, {len(rewards)} rewards, {len(answers)} answers"
                + (f", {len(finish)} finish reasons" if finish is not None else "")
            )
        rows = [
            {
                "step": step,
                "version": version,
                "prompt": prompts[i],
                "response": completions[i],
                "reward": float(rewards[i]),
                "answer": answers[i],
                "finish": finish[i] if finish is not None else None,
            }
            for i in range(num)
        ]
        _append(self.eval_path, rows)


def _append(path: Path, rows: list[dict]) -> None:
    """One write per call: a reader (``tail -f``, ``afctl samples``) sees whole lines."""
    with path.open("a") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
