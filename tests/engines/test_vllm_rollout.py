"""The vLLM adapter. Only the first test runs here (no GPU); the others need a CUDA
GPU with vLLM (``-m gpu``) or an Ascend NPU with vllm-ascend (``-m npu``)."""

import importlib.util

import pytest
import torch

from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5]]


def test_without_vllm_the_factory_says_what_to_install(qwen2_dir):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[gpu\]'"):
        build_rollout_engine(RolloutEngineConfig(type="vllm"), qwen2_dir)


def _consistency(model_dir, engine_type: str, device: str) -> None:
    rollout = build_rollout_engine(RolloutEngineConfig(type=engine_type, device=device, kv_cache_fraction=0.3), model_dir)
    out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=16, n=4, stop_token_ids=(2,), seed=0))
    assert len(out) == 8 and all(len(c.logprobs) == len(c.response_ids) for c in out)
    trainer = build_train_engine(TrainEngineConfig(device=device), model_dir)
    batch = make_token_batch([PROMPTS[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch).logp
    for b, c in enumerate(out):
        start = len(PROMPTS[c.prompt_index])
        assert torch.allclose(logp_BT[b, start : start + len(c.logprobs)], torch.tensor(c.logprobs), atol=1e-3)
    # In-place weight update: train towards a constant response, load, generate it greedily.
    ids = torch.tensor([PROMPTS[0] + [7] * 8])
    from asyncflow.engines.base import TokenBatch

    tb = TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(ids.shape))
    trainer2 = build_train_engine(TrainEngineConfig(device=device, lr=1e-2), model_dir)
    for _ in range(20):
        trainer2.train_step(tb, lambda o, mb, ctx: (-(o.logp * mb.response_mask).sum() / ctx.num_tokens, {}))
    rollout.load_weights(trainer2.export_weights(), version=trainer2.version)
    greedy = rollout.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
    assert greedy[0].response_ids == [7] * 8 and rollout.version == 20


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_vllm_logprobs_match_training_and_weights_update_in_place(qwen2_dir):
    _consistency(qwen2_dir, "vllm", "cuda")


@pytest.mark.npu
@pytest.mark.timeout(600)
def test_vllm_ascend_logprobs_match_training_and_weights_update_in_place(qwen2_dir):
    _consistency(qwen2_dir, "vllm_ascend", "npu")
