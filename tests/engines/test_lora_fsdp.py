import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
import safetensors.torch
import torch

from asyncflow.engines.config import RolloutEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine

sys.path.insert(0, os.path.dirname(__file__))
from test_lora import lora_cfg  # noqa: E402
from test_torch_train import batch, nll  # noqa: E402


@pytest.mark.slow  # about 25 s on 2 cores (two interpreters importing torch, transformers and peft)
@pytest.mark.timeout(240)
def test_two_fsdp_ranks_train_the_adapters_like_one_process_and_export_them_whole(qwen2_dir, tmp_path):
    worker = Path(__file__).with_name("fsdp_lora_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker)]
    done = subprocess.run([*cmd, str(qwen2_dir), str(tmp_path)], env=env, capture_output=True, text=True, timeout=230)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "figures.json").read_text())

    single = build_train_engine(msgspec.structs.replace(lora_cfg(), micro_batch_size=1), qwen2_dir)
    results = [single.train_step(batch(), nll) for _ in range(2)]
    assert figures["loss"] == pytest.approx([r.loss for r in results], abs=1e-5)
    assert figures["grad_norm"] == pytest.approx([r.grad_norm for r in results], abs=1e-5)
    gathered = safetensors.torch.load_file(tmp_path / "adapters.safetensors")
    mine = dict(single.export_weights())
    assert sorted(gathered) == sorted(mine)
    for name, t in mine.items():
        assert gathered[name].shape == t.shape and torch.allclose(gathered[name], t, atol=1e-5), name
    # a replica started on the FSDP checkpoint holds the weights whose digest rank 0 published
    replica = build_rollout_engine(RolloutEngineConfig(), tmp_path / "ckpt")
    assert replica.weights_digest() == figures["digest"]
