"""A damaged run directory is named in one line by ``afctl up --resume``, never a raw
traceback (actors/driver/prepare.py): a DONE file that holds no step, a truncated
launch.json; and a resume cuts the run's logs back to its checkpoint, so each step appears once."""

from __future__ import annotations

import json

import msgspec
import pytest

from asyncflow.actors.driver.prepare import prepare_resume, write_run_config
from asyncflow.actors.runtime.run_dir import LaunchInfo
from asyncflow.actors.trainer.checkpoints import checkpoint_dir
from asyncflow.config.load import load_config_text
from asyncflow.core.schema import ConfigError

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def run_dir(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    write_run_config(load_config_text("[train]\nnum_steps = 8\n[train.engine]\nlr_schedule = 'cosine'\nlr = 1e-4"), rd)
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


def test_extending_a_run_says_how_its_cosine_lr_schedule_is_stretched(run_dir, capsys):
    _, _, launch = prepare_resume(str(run_dir), ["train.num_steps=16"])
    assert launch.start_step == 4
    err = capsys.readouterr().err
    # cosine from 1e-4 to 0, no warmup: over steps 0..7, step 4 is 1e-4 * (1 + cos(pi * 4/7)) / 2 = 3.89e-05;
    # over steps 0..15, 1e-4 * (1 + cos(pi * 4/15)) / 2 = 8.35e-05
    assert "!! train.num_steps 8 -> 16: the cosine learning-rate schedule is stretched over 16 steps, so at step 5 the lr" in err
    assert "is 8.35e-05 (it was 3.89e-05 there)" in err, err


def test_a_resume_drops_the_samples_of_the_steps_it_trains_again(run_dir):
    for name in ("samples.jsonl", "eval_samples.jsonl"):
        rows = [{"step": s, "version": s, "prompt": "p", "response": "r", "reward": 0.0} for s in range(7)]
        (run_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, _, launch = prepare_resume(str(run_dir))
    assert launch.start_step == 4
    for name in ("samples.jsonl", "eval_samples.jsonl"):
        steps = [json.loads(line)["step"] for line in (run_dir / name).read_text().splitlines()]
        assert steps == [0, 1, 2, 3], name  # steps 4 to 6 are trained (and sampled) again
