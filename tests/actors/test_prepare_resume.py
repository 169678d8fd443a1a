"""A damaged run directory is named in one line by ``afctl up --resume``, never a raw
traceback (actors/_prepare.py): a DONE file that holds no step, a truncated
launch.json."""

from __future__ import annotations

import msgspec
import pytest

from asyncflow.actors._checkpoints import checkpoint_dir
from asyncflow.actors._prepare import prepare_resume, write_run_config
from asyncflow.actors._run import LaunchInfo
from asyncflow.config.run import load_config_text
from asyncflow.core.schema import ConfigError

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def run_dir(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    write_run_config(load_config_text("[train]\nnum_steps = 8"), rd)
    launch = LaunchInfo(model_dir=str(rd / "model"), base_model_dir=str(rd / "model"), data_path=str(rd / "data.jsonl"))
    (rd / "launch.json").write_bytes(msgspec.json.encode(launch))
    for step in (2, 4):
        path = checkpoint_dir(rd, step)
        (path / "model").mkdir(parents=True)
        (path / "roles.msgpack").write_bytes(msgspec.msgpack.encode({}))
        (path / "DONE").write_text(f"{step}\n")
    return rd


def test_a_checkpoint_whose_done_file_holds_no_step_is_skipped_by_name(run_dir, capsys):
    (checkpoint_dir(run_dir, 4) / "DONE").write_text("\x00garbage")
    _, _, launch = prepare_resume(str(run_dir))
    assert launch.start_step == 2 and launch.resume_from.endswith("step_000002")
    assert "checkpoint step_000004 is damaged: DONE: not a step number; skipping it" in capsys.readouterr().err


def test_a_truncated_launch_json_is_one_error_naming_the_file_and_what_to_do(run_dir):
    text = (run_dir / "launch.json").read_bytes()
    (run_dir / "launch.json").write_bytes(text[: len(text) // 2])
    with pytest.raises(ConfigError, match=r"launch\.json is unreadable \(DecodeError.*start a new run, with model\.path = "):
        prepare_resume(str(run_dir))
