"""The native engines on a CUDA GPU at real size (no vLLM): the paths test_real_sizes.py
takes on the cpu, on ``device = "cuda"``. Marked ``gpu``; they skip where torch sees no
CUDA GPU. ``scripts/cuda_check.sh`` runs them on a GPU machine without PyPI.

- a cuda replica and a cuda trainer agree on the weights' digest (float32 and bfloat16);
- the log-probs a float32 cuda replica samples with are the ones the cuda trainer
  recomputes; a bfloat16 replica's stay close to a bfloat16-autocast trainer's
  (``autocast = "auto"`` resolves to bfloat16 on a GPU with bf16);
- a real-size version travels over nng from the trainer's host-staged copy into a cuda
  replica, which then holds its digest;
- a train step on cuda moves the weights, and the checkpoint it writes loads in
  transformers on the cpu bit for bit.

Figures (the log-prob gaps) go to the file ``ASYNCFLOW_CUDA_FIGURES`` names, if set."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from asyncflow.actors.weights.nng import NngReceiver
from asyncflow.config.names import WEIGHTS
from asyncflow.engines.base import TokenBatch
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.digest import weights_digest
from asyncflow.engines.factory import build_rollout_engine, build_train_engine
from asyncflow.engines.precision import resolve_autocast

sys.path.insert(0, os.path.dirname(__file__))
from real_sizes import REAL_SHAPES, logprob_gaps, real_size_model  # noqa: E402
from test_real_sizes import WeightsSide, _bits, _same_tensors  # noqa: E402
from test_torch_train import nll  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)"),
]


def _figure(name: str, value: float) -> None:
    path = os.environ.get("ASYNCFLOW_CUDA_FIGURES")
    print(f"{name} = {value:.6g}")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({name: value}) + "\n")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    return real_size_model("qwen", tmp_path_factory)


@pytest.fixture(scope="module")
def trainer(qwen):
    return build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=4, device="cuda", autocast="off"), qwen)


def _replica(model_dir: Path, dtype: str = "float32"):
    return build_rollout_engine(RolloutEngineConfig(device="cuda", dtype=dtype, kv_cache_bytes=1 << 30), model_dir)


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in (5, 9, 17)]


@pytest.mark.timeout(300)
def test_a_cuda_replica_and_a_cuda_trainer_agree_on_the_digest_in_float32_and_bfloat16(qwen, trainer):
    assert trainer.device.type == "cuda"
    snapshot = list(trainer.export_weights())
    assert all(t.device.type == "cpu" for _, t in snapshot)  # host-staged
    for dtype, torch_dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        replica = _replica(qwen, dtype)
        try:
            assert replica.device.type == "cuda"
            assert replica.weights_digest() == trainer.published_digest(snapshot, torch_dtype)
        finally:
            replica.close()


@pytest.mark.timeout(300)
def test_a_float32_cuda_replica_samples_with_the_logprobs_the_cuda_trainer_recomputes(qwen, trainer):
    vocab = REAL_SHAPES["qwen"]["vocab_size"]
    prompts = _prompts(vocab)
    replica = _replica(qwen)
    try:
        done = replica.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=0))
    finally:
        replica.close()
    assert len(done) == 12 and all(len(c.response_ids) == 8 for c in done)
    assert max(t for c in done for t in c.response_ids) > 2**16  # ids from all of the vocabulary
    gap = logprob_gaps(trainer, prompts, done).abs()
    _figure("cuda_fp32_logprob_gap_max", float(gap.max()))
    assert float(gap.max()) < 1e-3


@pytest.mark.timeout(300)
def test_a_bfloat16_cuda_replica_stays_close_to_a_bfloat16_autocast_trainer(qwen):
    assert resolve_autocast("auto", "cuda") == ("bfloat16" if torch.cuda.is_bf16_supported() else "off")
    trainer = build_train_engine(TrainEngineConfig(micro_batch_size=4, device="cuda", autocast="auto"), qwen)
    vocab = REAL_SHAPES["qwen"]["vocab_size"]
    prompts = _prompts(vocab)
    replica = _replica(qwen, "bfloat16")
    try:
        done = replica.generate(prompts, SamplingParams(max_new_tokens=8, temperature=1.0, n=4, seed=0))
    finally:
        replica.close()
    gap = logprob_gaps(trainer, prompts, done).abs()
    _figure("cuda_bf16_logprob_gap_mean", float(gap.mean()))
    _figure("cuda_bf16_logprob_gap_max", float(gap.max()))
    assert float(gap.mean()) < 0.1


@pytest.mark.timeout(300)
def test_a_real_size_version_travels_over_nng_from_a_cuda_trainer_into_a_cuda_replica(qwen, trainer, tmp_path):
    trainer.train_step(_batch(), nll)  # weights the replica has not got
    snapshot = list(trainer.export_weights())
    digest = weights_digest(snapshot)
    side = WeightsSide(tmp_path, max_message_bytes=64 << 20)
    replica = _replica(qwen)
    try:
        assert replica.weights_digest() != digest
        side.publish(1, snapshot, digest)
        version, got = NngReceiver(60.0).fetch(side.dc.ref(WEIGHTS))
        assert version == 1
        _same_tensors(snapshot, got)
        replica.load_weights(got, version)
        assert replica.weights_digest() == digest == trainer.published_digest(snapshot, torch.float32)
    finally:
        replica.close()
        side.close()


@pytest.mark.timeout(300)
def test_a_cuda_train_step_moves_the_weights_and_its_checkpoint_loads_in_transformers_on_the_cpu(qwen, trainer, tmp_path):
    from transformers import AutoModelForCausalLM

    before = weights_digest(trainer.export_weights())
    result = trainer.train_step(_batch(), nll)
    assert torch.isfinite(torch.tensor(result.loss)) and result.grad_norm > 0
    after = dict(trainer.export_weights())
    assert weights_digest(after.items()) != before
    trainer.save_checkpoint(tmp_path / "ckpt", with_optimizer=True)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", local_files_only=True)
    loaded = dict(model.named_parameters())
    assert sorted(loaded) == sorted(after)
    for name, p in after.items():
        assert torch.equal(_bits(loaded[name]), _bits(p)), name


def _batch() -> TokenBatch:
    g = torch.Generator().manual_seed(1)
    ids_BT = torch.randint(0, REAL_SHAPES["qwen"]["vocab_size"], (4, 24), generator=g)
    resp_BT = torch.zeros(4, 24)
    resp_BT[:, 8:] = 1.0
    return TokenBatch(input_ids=ids_BT, attention_mask=torch.ones_like(ids_BT), response_mask=resp_BT)
