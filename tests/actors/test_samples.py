"""RUN_DIR/samples.jsonl: what the model writes, as text (actors/trainer/_samples.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from asyncflow.actors.trainer._samples import SampleLog

pytestmark = pytest.mark.timeout(20)


def test_every_n_steps_the_first_rows_are_written_decoded_with_reward_and_ending(tmp_path, tokenizer):
    loads = []

    def load():
        loads.append(1)
        return tokenizer

    log = SampleLog(tmp_path, load, every=5, count=2)
    assert [s for s in range(12) if log.due(s)] == [0, 5, 10]
    ids = lambda text: np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    columns = {
        "prompt_ids": [ids("3+4="), ids("3+4="), ids("1+1=")],
        "response_ids": [ids("7"), ids("8"), ids("2")],
        "reward": [np.asarray([1.0]), np.asarray([0.0]), np.asarray([1.0])],
        "finish": [np.asarray([1], dtype=np.uint8), np.asarray([0], dtype=np.uint8), np.asarray([1], dtype=np.uint8)],
    }
    log.write(5, columns, versions=[4, 4, 5])
    log.write(10, columns, versions=[9, 9, 9])
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert rows[:2] == [
        {"step": 5, "prompt": "3+4=", "response": "7", "reward": 1.0, "finish": "stop", "version": 4},
        {"step": 5, "prompt": "3+4=", "response": "8", "reward": 0.0, "finish": "length", "version": 4},
    ]
    assert [r["step"] for r in rows] == [5, 5, 10, 10] and loads == [1]  # the tokenizer is loaded once
    assert not SampleLog(tmp_path, load, every=0, count=2).due(0)  # 0: never


def test_by_default_two_rows_of_every_step_are_written_so_a_short_run_shows_the_model_learning():
    from asyncflow.config.cluster import LoggingConfig

    logging = LoggingConfig()
    assert (logging.samples_every, logging.samples_per_step) == (1, 2)


def test_an_evaluations_completions_go_to_eval_samples_jsonl_one_row_each_with_its_answer(tmp_path):
    from asyncflow.actors.evaluation.evaluator import append_eval_samples

    append_eval_samples(tmp_path, 0, 0, ["1+1=", "2+2="], ["2", "5"], [1.0, 0.0], ["2", "4"])  # eval.at_start
    append_eval_samples(tmp_path, 3, 4, ["1+1="], ["2"], [1.0], ["2"], finish=["length"])
    rows = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert rows == [
        {"step": 0, "version": 0, "prompt": "1+1=", "response": "2", "reward": 1.0, "answer": "2", "finish": None},
        {"step": 0, "version": 0, "prompt": "2+2=", "response": "5", "reward": 0.0, "answer": "4", "finish": None},
        {"step": 3, "version": 4, "prompt": "1+1=", "response": "2", "reward": 1.0, "answer": "2", "finish": "length"},
    ]
    assert not (tmp_path / "samples.jsonl").exists()  # the training samples stay a file of their own
    with pytest.raises(ValueError, match="one prompt, completion, reward and answer per row"):
        append_eval_samples(tmp_path, 4, 5, ["1+1="], ["2", "3"], [1.0], ["2"])
