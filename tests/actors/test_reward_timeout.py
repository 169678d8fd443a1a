"""``reward.timeout_s``: a reward function that hangs costs its batch's rows (reward 0,
logged), not the run."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from tiny_config import tiny_config_text

from asyncflow.actors.runtime.scoring import Scorer
from asyncflow.config.load import load_config_text
from asyncflow.toy.tiny import build_char_tokenizer

pytestmark = pytest.mark.timeout(60)

HANG = """
import threading

release = threading.Event()


def reward(prompts, responses, answers, finish_reasons):
    if any("hang" in p for p in prompts):
        release.wait()  # until the test lets it go
    return [1.0] * len(prompts)
"""


def _columns(tokenizer, prompts: list[str]) -> dict[str, list]:
    ids = lambda text: np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)  # noqa: E731
    return {
        "prompt_ids": [ids(p) for p in prompts],
        "response_ids": [ids("42") for _ in prompts],
        "answer": [np.frombuffer(b"42", dtype=np.uint8) for _ in prompts],
        "finish": [np.asarray([1], dtype=np.uint8) for _ in prompts],
    }


def test_a_hanging_reward_function_gives_its_rows_zero_and_the_next_batch_is_scored(tmp_path, monkeypatch, caplog):
    (tmp_path / "hang_reward.py").write_text(HANG)
    monkeypatch.syspath_prepend(str(tmp_path))
    import hang_reward

    cfg = load_config_text(tiny_config_text({"reward": {"functions": ["hang_reward:reward"], "timeout_s": 0.3}}))
    tokenizer = build_char_tokenizer()
    scorer = Scorer(cfg, tokenizer)
    try:
        with caplog.at_level(logging.WARNING):
            assert scorer.score(_columns(tokenizer, ["1+1 hang", "2+2"]), [7, 8]) == [0.0, 0.0]
        [record] = [r for r in caplog.records if "reward.timeout_s" in r.getMessage()]
        assert "rows [7, 8]" in record.getMessage() and "hang_reward:reward" in record.getMessage()
        assert scorer.score(_columns(tokenizer, ["3+3"]), [9]) == [1.0]  # the next batch: a fresh call, scored
        assert scorer.timed_out_rows == 2
    finally:
        hang_reward.release.set()
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("reward-fn"))  # never holds the exit


WHERE = """
import threading

threads = []


def reward(prompts, responses, answers, finish_reasons):
    threads.append(threading.current_thread().name)
    return [1.0] * len(prompts)
"""


@pytest.mark.parametrize("timeout_s, in_caller", [(0, True), (5.0, False)])
def test_timeout_zero_calls_the_functions_in_the_scoring_thread_itself(tmp_path, monkeypatch, timeout_s, in_caller):
    (tmp_path / f"where_reward_{in_caller}.py").write_text(WHERE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(f"where_reward_{in_caller}")
    fn = f"where_reward_{in_caller}:reward"
    cfg = load_config_text(tiny_config_text({"reward": {"functions": [fn], "timeout_s": timeout_s}}))
    tokenizer = build_char_tokenizer()
    assert Scorer(cfg, tokenizer).score(_columns(tokenizer, ["1+1"]), [0]) == [1.0]
    assert (module.threads == [threading.current_thread().name]) is in_caller and len(module.threads) == 1
