"""The vLLM adapter. Only the first test runs here (no GPU); the others need a CUDA
GPU with vLLM (``-m gpu``) or an Ascend NPU with vllm-ascend (``-m npu``).
scripts/gpu_check.sh runs the ``gpu`` ones on a fresh one-GPU machine."""

import importlib.util

import pytest
import torch

from asyncflow.engines.base import TokenBatch
from asyncflow.engines.batching import make_token_batch
from asyncflow.engines.config import RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine

PROMPTS = [[4, 9, 16, 10, 20, 5], [4, 12, 5]]


def test_without_vllm_the_factory_says_what_to_install(qwen2_dir):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[gpu\]'"):
        build_rollout_engine(RolloutEngineConfig(type="vllm"), qwen2_dir)


def _engine(model_dir, engine_type: str, device: str, **kw):
    return build_rollout_engine(RolloutEngineConfig(type=engine_type, device=device, kv_cache_fraction=0.3, **kw), model_dir)


def _assert_logprobs_match_training(trainer, prompts, out) -> None:
    batch = make_token_batch([prompts[c.prompt_index] for c in out], [c.response_ids for c in out], pad_token_id=0)
    logp_BT = trainer.forward(batch).logp
    for b, c in enumerate(out):
        start = len(prompts[c.prompt_index])
        assert torch.allclose(logp_BT[b, start : start + len(c.logprobs)].cpu(), torch.tensor(c.logprobs), atol=1e-3)


def _trained_to_say_7(model_dir, device: str):
    """A trainer whose greedy response to PROMPTS[0] is 7, 7, 7, ... (20 steps)."""
    ids = torch.tensor([PROMPTS[0] + [7] * 8])
    tb = TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(ids.shape))
    trainer = build_train_engine(TrainEngineConfig(device=device, lr=1e-2), model_dir)
    for _ in range(20):
        trainer.train_step(tb, lambda o, mb, ctx: (-(o.logp * mb.response_mask).sum() / ctx.num_tokens, {}))
    return trainer


def _consistency(model_dir, engine_type: str, device: str, weight_transfer: str = "auto") -> None:
    rollout = _engine(model_dir, engine_type, device, weight_transfer=weight_transfer)
    try:
        out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=16, n=4, stop_token_ids=(2,), seed=0))
        assert len(out) == 8 and all(len(c.logprobs) == len(c.response_ids) for c in out)
        assert all(c.token_versions == [0] * len(c.response_ids) for c in out)
        _assert_logprobs_match_training(build_train_engine(TrainEngineConfig(device=device), model_dir), PROMPTS, out)
        # In-place weight update through the weight-transfer path, then generate greedily.
        trainer = _trained_to_say_7(model_dir, device)
        rollout.load_weights(trainer.export_weights(), version=trainer.version)
        greedy = rollout.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
        assert greedy[0].response_ids == [7] * 8 and rollout.version == 20 and greedy[0].token_versions == [20] * 8
    finally:
        rollout.close()


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("weight_transfer", ["ipc", "rpc"])
def test_vllm_logprobs_match_training_and_weights_update_in_place(qwen2_dir, weight_transfer):
    _consistency(qwen2_dir, "vllm", "cuda", weight_transfer)


@pytest.mark.npu
@pytest.mark.timeout(600)
def test_vllm_ascend_logprobs_match_training_and_weights_update_in_place(qwen2_dir):
    _consistency(qwen2_dir, "vllm_ascend", "npu")


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_vllm_continues_a_multi_turn_trajectory_on_the_exact_token_ids(qwen2_dir):
    """Turn 2's prompt is turn 1's prompt, its response and an observation, as ids:
    vLLM's log-probs of turn 2 match the trainer's over the whole concatenation."""
    rollout = _engine(qwen2_dir, "vllm", "cuda")
    try:
        params = SamplingParams(max_new_tokens=12, n=2, stop_token_ids=(2,), seed=1)
        turn1 = rollout.generate(PROMPTS, params)
        observation = [30, 31, 32]
        prompts2 = [PROMPTS[c.prompt_index] + c.response_ids + observation for c in turn1]
        turn2 = rollout.generate(prompts2, params)
        assert len(turn2) == 2 * len(prompts2)
        _assert_logprobs_match_training(build_train_engine(TrainEngineConfig(device="cuda"), qwen2_dir), prompts2, turn2)
    finally:
        rollout.close()


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.parametrize("partial_kv", ["keep", "recompute"])
def test_vllm_swaps_weights_mid_generation_and_records_each_tokens_version(qwen2_dir, partial_kv):
    """A swap from the between-steps hook pauses the running requests, loads the
    weights and resumes them: each response has tokens of both versions, in order,
    and after the swap the new weights' greedy answer (7) dominates."""
    rollout = _engine(qwen2_dir, "vllm", "cuda", partial_kv=partial_kv)
    trainer = _trained_to_say_7(qwen2_dir, "cuda")
    weights = list(trainer.export_weights())
    swapped = []

    def between_steps():
        if not swapped and rollout.num_tokens_in_flight() >= 8:  # every request is under way
            rollout.load_weights(weights, version=20)
            swapped.append(True)

    try:
        out = rollout.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=400, n=2), between_steps=between_steps)
        assert swapped and rollout.version == 20
        for c in out:
            versions = c.token_versions
            assert versions is not None and len(versions) == len(c.response_ids) == 400
            assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 20
            assert c.version == 0  # the oldest token's version
            after = [t for t, v in zip(c.response_ids, versions) if v == 20]
            assert sum(t == 7 for t in after) > 0.9 * len(after)
        # the next call starts from the new weights only
        again = rollout.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
        assert again[0].response_ids == [7] * 8 and again[0].token_versions == [20] * 8
    finally:
        rollout.close()
