"""Sequence packing under FSDP2: each rank packs its own part, the ranks agree on the
number of micro-batches, and the step equals one unpacked process's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine

sys.path.insert(0, os.path.dirname(__file__))
from fsdp_packing_worker import MICRO_BATCH_SIZE, loss_fn, uneven_batch  # noqa: E402


@pytest.mark.slow  # about 20 s on 2 cores (two interpreters importing torch + transformers)
@pytest.mark.timeout(180)
def test_two_fsdp_ranks_each_pack_their_own_part_and_match_one_padded_process(qwen2_dir, tmp_path):
    worker = Path(__file__).with_name("fsdp_packing_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(worker)]
    done = subprocess.run(cmd + [str(qwen2_dir), str(tmp_path)], env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"figures{r}.json").read_text()) for r in (0, 1)]
    # the halves pack into different numbers of micro-batches; the smaller plan was split to match
    assert ranks[0]["own_plan"] != ranks[1]["own_plan"]
    assert ranks[0]["forwards"] == ranks[1]["forwards"]
    assert ranks[0]["pack_attention"] == "position_ids"

    batch = uneven_batch()
    single = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=MICRO_BATCH_SIZE), qwen2_dir)
    fed: list[int] = []
    single.net.register_forward_pre_hook(lambda module, args: fed.append(args[0].numel()))
    results = [single.train_step(batch, loss_fn()) for _ in range(2)]
    assert ranks[0]["loss"] == pytest.approx([r.loss for r in results], abs=1e-5)
    assert ranks[0]["grad_norm"] == pytest.approx([r.grad_norm for r in results], rel=1e-4)
    assert sum(r["fed_tokens"] for r in ranks) < 0.75 * sum(fed)  # packed: fewer tokens through the model

    want = single.forward(batch).logp
    half = batch.batch_size // 2
    real = batch.response_mask.bool()  # the log-probs the loss reads: one process computes no others
    for r in (0, 1):
        got = torch.tensor(ranks[r]["logp"])
        rows = slice(r * half, (r + 1) * half)
        width = got.shape[1]
        assert torch.allclose(got[real[rows, :width]], want[rows, :width][real[rows, :width]], atol=1e-5)
