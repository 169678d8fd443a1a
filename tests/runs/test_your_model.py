"""docs/your-model-and-data.md, followed end to end: a Llama of your own (saved with
save_pretrained, its own tokenizer, no chat template), a JSONL file, a reward for its
answer format, paths relative to the config file; the checkpoint it prints loads in
transformers with the README's snippet. Also the early errors (one
``Error:`` line naming the key, before any process starts) and the one-line report of
a role that fails at run time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "your_model"))

from make_example import write_example  # noqa: E402


def afctl(*args: str, cwd: Path, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def readme_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("### Load the trained model")[1].split("```python\n")[1].split("```")[0]


@pytest.mark.timeout(200)
def test_your_model_and_jsonl_train_from_any_directory_and_the_printed_model_loads(tmp_path):
    config = write_example(tmp_path / "mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # paths in run.toml are relative to the file, not to where afctl runs
    result = afctl("up", str(config), "--run-dir", "run", cwd=elsewhere)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = [out for out in result.stdout.splitlines() if out.startswith("model: ")]
    printed = elsewhere / line.split()[1]  # as given: relative to where afctl ran
    assert printed.resolve() == (elsewhere / "run" / "checkpoints" / "step_000003" / "model").resolve()
    latest = elsewhere / "run" / "checkpoints" / "latest"
    assert latest.is_symlink() and os.readlink(latest) == "step_000003/model"
    assert (latest / "config.json").is_file()
    snippet = readme_snippet().replace("runs/local-<time>/checkpoints/latest", str(printed))
    snippet = snippet.replace(
        'tok.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True, ', 'tok("What is 3 plus 4?", '
    )  # this model has no template: plain text, as it trained
    out = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.timeout(120)
def test_the_readme_snippet_loads_a_checkpoint_and_answers_through_the_chat_template(tmp_path):
    from asyncflow.toy.tiny import make_tiny_model

    step = tmp_path / "run" / "checkpoints" / "step_000002"
    make_tiny_model(step / "model", num_layers=1)
    (tmp_path / "run" / "checkpoints" / "latest").symlink_to("step_000002/model")
    snippet = readme_snippet().replace("runs/local-<time>", str(tmp_path / "run"))
    out = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.timeout(30)
def test_model_path_may_name_a_checkpoint_directory(tmp_path):
    from asyncflow.config.load import load_config

    step = tmp_path / "checkpoints" / "step_000004"
    (step / "model").mkdir(parents=True)
    (step / "model" / "config.json").write_text("{}")
    (tmp_path / "run.toml").write_text('[model]\npath = "checkpoints/step_000004"\n')
    assert load_config(tmp_path / "run.toml").model.path == str(step / "model")


def write_bad(tmp_path: Path, case: str) -> tuple[Path, list[str]]:
    config = write_example(tmp_path / "mine", num_prompts=8)
    text = config.read_text()
    sets: list[str] = []
    if case == "reward_module":
        sets = ['reward.functions=["not_there:score"]']
    elif case == "role_class":
        text += '\n[[roles]]\nname = "judge"\ncls = "my_reward:NoSuchJudge"\n'
    elif case == "device":
        sets = ["rollout.engine.device=cuda", "cluster.device=cuda"]
    elif case == "data_fields":
        (config.parent / "data.jsonl").write_text('{"question": "What is 1 plus 1?", "answer": "2"}\n')
    elif case == "chat_template":
        sets = ["data.chat_template=true"]
    elif case == "range":
        sets = ["rollout.sampling.temperature=-1"]
    elif case == "set_type":
        sets = ["train.num_steps=abc"]
    config.write_text(text)
    return config, [a for s in sets for a in ("--set", s)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "case,message",
    [
        ("reward_module", "reward.functions[0] = 'not_there:score': cannot import module 'not_there'"),
        ("role_class", "roles[0].cls = 'my_reward:NoSuchJudge' (role 'judge'): module 'my_reward'"),
        ("device", "= 'cuda', but torch sees no CUDA device here"),
        ("data_fields", "data.path = "),
        ("chat_template", "data.chat_template = true, but the tokenizer of"),
        ("range", "rollout.sampling.temperature = -1: out of range; use a value >= 0"),
        ("set_type", "(in --set train.num_steps=abc)"),
    ],
)
def test_a_mistake_is_one_error_line_naming_the_key_before_any_process_starts(tmp_path, case, message):
    if case == "device":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    config, sets = write_bad(tmp_path, case)
    result = afctl("up", str(config), "--run-dir", str(tmp_path / "run"), *sets, cwd=tmp_path, timeout=50)
    assert result.returncode != 0
    errors = [out for out in result.stderr.splitlines() if out.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    if case == "reward_module":
        assert "cluster.python_path" in errors[0]
    if case == "data_fields":
        assert "'prompt'" in errors[0]
    assert not (tmp_path / "run" / "logs").exists()  # no process was started


@pytest.mark.timeout(150)
def test_a_role_failing_at_run_time_is_one_line_with_the_traceback_in_its_log_and_no_resume_advice(tmp_path):
    config = write_example(tmp_path / "mine", num_prompts=8)
    (config.parent / "my_reward.py").write_text(
        "def last_integer(prompts, responses, answers, finish_reasons):\n"
        "    raise ValueError('my reward cannot parse ' + repr(responses[0]))\n"
    )
    result = afctl("up", str(config), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 1
    [line] = [out for out in result.stderr.splitlines() if out.startswith("run failed:")]
    assert "role reward.0 failed: ValueError: my reward cannot parse" in line
    log = tmp_path / "run" / "logs" / "reward.0.log"
    assert f"(traceback in {log})" in line
    assert "Traceback (most recent call last)" in log.read_text()
    assert "Traceback" not in result.stderr
    assert "afctl up --resume" not in result.stderr  # checkpoint_every = 0: nothing to resume from
    assert "No checkpoint to resume from: none was saved yet (train.checkpoint_every = 0" in result.stderr
