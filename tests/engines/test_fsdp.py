import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine

sys.path.insert(0, os.path.dirname(__file__))
from test_torch_train import batch, nll  # noqa: E402


@pytest.mark.slow  # about 20 s alone on 2 cores (two interpreters importing torch + transformers)
@pytest.mark.timeout(180)
def test_two_process_fsdp2_over_gloo_matches_one_process_and_saves_a_loadable_checkpoint(qwen2_dir, tmp_path):
    worker = Path(__file__).with_name("fsdp_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(worker),
        str(qwen2_dir),
        str(tmp_path),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "figures.json").read_text())

    single = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=1), qwen2_dir)
    results = [single.train_step(batch(), nll) for _ in range(2)]
    assert figures["loss"] == pytest.approx([r.loss for r in results], abs=1e-5)
    assert figures["grad_norm"] == pytest.approx([r.grad_norm for r in results], abs=1e-5)
    weights = {name: t.sum().item() for name, t in single.export_weights()}
    assert figures["weights"] == pytest.approx(weights, abs=1e-3)

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    b = batch(seed=2)
    logits = model(input_ids=b.input_ids[1:2]).logits[0, :-1]
    got = torch.log_softmax(logits, -1).gather(1, b.input_ids[1, 1:, None]).squeeze(1)
    assert torch.allclose(got[4:], single.forward(b).logp[1, 5:], atol=1e-4)  # the response tokens (from column 5)
