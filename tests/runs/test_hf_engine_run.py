"""`afctl up` on a model the native engine does not implement (a tiny GPT-NeoX given as
``model.path``): ``rollout.engine.type = "auto"`` takes the hf engine, the run's first
lines say so and why, two async steps train with partial rollout (the hf engine's stream
across a weight swap), and the checkpoint loads back in transformers with the weights
the trainer saved."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import safetensors.torch
import torch
from tiny_config import TINY, write_tiny_config
from tiny_neox import make_tiny_neox
from transformers import AutoModelForCausalLM
from wf_helpers import afctl, read_jsonl

VARIED = """def distinct_chars(prompts, responses, answers, finish_reasons):
    return [len(set(r)) / 4.0 for r in responses]  # varied across an untrained model's samples: a real gradient
"""


@pytest.mark.timeout(240)
def test_a_gpt_neox_trains_two_async_steps_through_the_hf_engine_and_its_checkpoint_loads(tmp_path, request):
    model_dir = make_tiny_neox(tmp_path / "neox")
    (tmp_path / "varied.py").write_text(VARIED)
    config = write_tiny_config(
        tmp_path / "neox.toml",
        {
            "model": {"path": str(model_dir)},
            "reward": {"functions": ["varied:distinct_chars"]},
            "train": {"num_steps": 2, "checkpoint_every": 0},
            "workflow": {"mode": "async", "staleness": 1, "partial_rollout": True},
        },
        extra=f'[cluster]\npython_path = ["{tmp_path}"]\n',
    )
    run_dir = tmp_path / "run"
    tmp = Path(tempfile.mkdtemp(prefix="afq-", dir="/tmp"))  # the run's TMPDIR: short, as ipc socket paths must be
    request.addfinalizer(lambda: shutil.rmtree(tmp, ignore_errors=True))
    proc = afctl("up", str(config), "--run-dir", str(run_dir), env_extra={"TMPDIR": str(tmp)})
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    assert "rollout engine: hf (model_type 'gpt_neox' is not one the native engine implements" in out, out
    assert "done: 2 steps" in out, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [int(m["step"]) for m in metrics] == [0, 1]
    # every row checked against its version's weights digest (the hf engine's, read back from its model)
    assert all(m["weights_mismatch"] == 0 and m["weights_unverified"] == 0 for m in metrics), metrics

    saved = run_dir / "checkpoints" / "latest"
    model = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
    assert model.config.model_type == "gpt_neox"
    tensors = safetensors.torch.load_file(saved / "model.safetensors")
    params = dict(model.named_parameters())
    assert set(tensors) == set(params)
    assert all(torch.equal(params[name], t) for name, t in tensors.items())
    start = dict(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).named_parameters())
    assert any(not torch.equal(start[name], t) for name, t in tensors.items())  # the two steps trained it


@pytest.mark.timeout(60)
def test_the_engine_line_says_native_for_qwen2_and_type_native_is_refused_for_gpt_neox(tmp_path):
    from asyncflow.actors.driver.launcher import rollout_engine_line
    from asyncflow.config.load import ConfigError, load_config
    from asyncflow.toy.tiny import make_tiny_model

    qwen2, neox = make_tiny_model(tmp_path / "qwen2", num_layers=1), make_tiny_neox(tmp_path / "neox", num_layers=1)
    assert rollout_engine_line(load_config(TINY), str(qwen2)).startswith("rollout engine: native (model_type 'qwen2'); ")
    hf = load_config(TINY, ["rollout.engine.type=hf"])
    assert rollout_engine_line(hf, str(qwen2)).startswith('rollout engine: hf (rollout.engine.type = "hf"); ')
    native = load_config(TINY, ["rollout.engine.type=native"])
    with pytest.raises(ConfigError, match="rollout.engine.type = \"native\": model_type 'gpt_neox' is not one"):
        rollout_engine_line(native, str(neox))
