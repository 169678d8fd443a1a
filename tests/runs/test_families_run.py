"""Each model family trains end to end: ``afctl up`` of 2 async steps on a tiny random
model of the family (``tests/engines/families.py``), the native engine rolling out,
a checkpoint at the end that transformers loads back bit for bit. Three families run
in the default suite (a dense one with q/k norm, the sandwich-norm windowed one, an
MoE); the others are marked slow (``pytest -m slow tests/runs/test_families_run.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "engines"))
from families import FAMILIES, make_family_model  # noqa: E402

DEFAULT = ("qwen3", "gemma3", "qwen3_moe")

CONFIG = """seed = 0
[model]
path = "model"
[data]
task = "add"
num_prompts = 32
[algorithm]
group_size = 2
[rollout]
prompts_per_call = 2
[rollout.sampling]
max_new_tokens = 4
[reward]
functions = ["wf_rewards:scattered"]   # varied rewards from an untrained model: a real gradient
[train]
num_steps = 2
prompts_per_step = 2
checkpoint_every = 2
[train.engine]
lr = 1e-3
[workflow]
mode = "async"
staleness = 1
[cluster]
python_path = ["{here}"]
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", [f if f in DEFAULT else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_two_async_steps_of_each_family_end_in_a_checkpoint_transformers_loads_bit_for_bit(name, tmp_path):
    from transformers import AutoModelForCausalLM

    make_family_model(tmp_path / "model", name)
    (tmp_path / "run.toml").write_text(CONFIG.format(here=Path(__file__).parent))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "asyncflow.cli.main", "up", "run.toml", "--run-dir", "run"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    saved = tmp_path / "run" / "checkpoints" / "step_000002" / "model"
    written = safetensors.torch.load_file(saved / "model.safetensors")
    loaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    state = loaded.state_dict()
    assert written, "the checkpoint holds no tensor"
    for key, tensor in written.items():
        assert torch.equal(state[key].view(torch.uint8), tensor.view(torch.uint8)), key
    start = AutoModelForCausalLM.from_pretrained(tmp_path / "model", dtype=torch.float32).state_dict()
    assert any(not torch.equal(start[k], t) for k, t in written.items()), "two steps changed no weight"
