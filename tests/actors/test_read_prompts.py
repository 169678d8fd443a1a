"""A data file's mistakes are named by file and line before any process starts
(actors/runtime/run_dir.py ``read_prompts``, called by the preflight)."""

from __future__ import annotations

import pytest

from asyncflow.actors.runtime.run_dir import read_prompts
from asyncflow.config.load import load_config_text
from asyncflow.core.schema import ConfigError

pytestmark = pytest.mark.timeout(20)

GOOD = '{"prompt": "What is 1 + 1?", "answer": "2"}\n'


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"prompt": "", "answer": "3"}\n', r"line 3 has an empty prompt \(''\); give every row a prompt"),
        ('{"prompt": "   ", "answer": "3"}\n', r"line 3 has an empty prompt"),
        ('{"prompt": 12, "answer": "3"}\n', r"line 3: 'prompt' is a int, not a string"),
        ('{"prompt": "What is 1 + 2?", "answer": \n', r"line 3 is not JSON \(.*\); write one JSON object per line"),
        ("[1, 2]\n", r"line 3 lacks 'prompt' or 'answer' \(has list\)"),
    ],
)
def test_a_bad_row_is_named_by_its_line_in_the_file(tmp_path, bad, message):
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD + "\n" + bad + GOOD)  # a blank line still counts as a line
    with pytest.raises(ValueError, match=message):
        read_prompts(str(path))


def test_bytes_that_are_not_utf8_are_named_by_line(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD.encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match=r"line 2 is not UTF-8 .*save the file as UTF-8"):
        read_prompts(str(path))


def test_the_preflight_refuses_an_empty_prompt_naming_the_key_the_file_and_the_line(tmp_path, tiny_dir):
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD * 20 + '{"prompt": "", "answer": "2"}\n')
    from asyncflow.actors.driver.preflight import check_inputs

    cfg = load_config_text(f"[model]\npath = {str(tiny_dir)!r}\n[data]\npath = {str(path)!r}")
    with pytest.raises(ConfigError, match=r"data\.path = .*data\.jsonl.*line 21 has an empty prompt"):
        check_inputs(cfg)


@pytest.mark.parametrize("model", ["tiny", "dir"])
def test_max_new_tokens_beyond_the_models_positions_is_refused_before_any_process_starts(model, tiny_dir):
    from asyncflow.actors.driver.preflight import check_inputs

    path = f"[model]\npath = {str(tiny_dir)!r}\n" if model == "dir" else ""
    cfg = load_config_text(path + "[rollout.sampling]\nmax_new_tokens = 100000")
    with pytest.raises(ConfigError, match=r"rollout\.sampling\.max_new_tokens = 100000: the model holds \d+ positions"):
        check_inputs(cfg)


@pytest.mark.parametrize("limit", ["positions", "key"])
def test_a_prompt_longer_than_its_limit_is_refused_by_its_line_before_any_process_starts(tmp_path, tiny_dir, limit):
    import json

    from asyncflow.actors.driver.preflight import check_inputs

    positions = json.loads((tiny_dir / "config.json").read_text())["max_position_embeddings"]
    long = "1+" * (positions if limit == "positions" else 40) + "1"
    path = tmp_path / "data.jsonl"
    path.write_text(GOOD * 5 + "\n" + json.dumps({"prompt": long, "answer": "2"}) + "\n" + GOOD * 5)
    extra = "\nmax_prompt_tokens = 50" if limit == "key" else ""
    cfg = load_config_text(f"[model]\npath = {str(tiny_dir)!r}\n[data]\npath = {str(path)!r}{extra}")
    why = (
        r"data\.max_prompt_tokens"
        if limit == "key"
        else r"max_position_embeddings \d+ less rollout\.sampling\.max_new_tokens \d+"
    )
    with pytest.raises(ConfigError, match=rf"1 prompt\(s\) longer than \d+ tokens \({why}\): line 7 \(\d+ tokens\)"):
        check_inputs(cfg)
    path.write_text(GOOD * 5)
    check_inputs(cfg)  # short prompts pass
