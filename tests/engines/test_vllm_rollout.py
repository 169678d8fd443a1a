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
    # eager: no CUDA graph capture, so each engine starts in seconds (scripts/gpu_check.sh has a time budget)
    return build_rollout_engine(
        RolloutEngineConfig(type=engine_type, device=device, kv_cache_fraction=0.3, enforce_eager=True, **kw), model_dir
    )


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


def _check_logprobs(rollout, model_dir, device: str) -> None:
    out = rollout.generate(PROMPTS, SamplingParams(max_new_tokens=16, n=4, stop_token_ids=(2,), seed=0))
    assert len(out) == 8 and all(len(c.logprobs) == len(c.response_ids) for c in out)
    assert all(c.token_versions == [0] * len(c.response_ids) for c in out)
    _assert_logprobs_match_training(build_train_engine(TrainEngineConfig(device=device), model_dir), PROMPTS, out)


def _check_multi_turn(rollout, model_dir, device: str) -> None:
    """Turn 2's prompt is turn 1's prompt, its response and an observation, as ids:
    the engine's log-probs of turn 2 match the trainer's over the whole concatenation."""
    params = SamplingParams(max_new_tokens=12, n=2, stop_token_ids=(2,), seed=1)
    turn1 = rollout.generate(PROMPTS, params)
    prompts2 = [PROMPTS[c.prompt_index] + c.response_ids + [30, 31, 32] for c in turn1]
    turn2 = rollout.generate(prompts2, params)
    assert len(turn2) == 2 * len(prompts2)
    _assert_logprobs_match_training(build_train_engine(TrainEngineConfig(device=device), model_dir), prompts2, turn2)


def _check_update_in_place(rollout, model_dir, device: str) -> None:
    trainer = _trained_to_say_7(model_dir, device)
    rollout.load_weights(trainer.export_weights(), version=trainer.version)
    greedy = rollout.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=8))
    assert greedy[0].response_ids == [7] * 8 and rollout.version == 20 and greedy[0].token_versions == [20] * 8


def _check_swap_mid_generation(rollout, model_dir, device: str) -> None:
    """A swap from the between-steps hook pauses the running requests, loads the
    weights and resumes them: each response has tokens of both versions, in order,
    and after the swap the new weights' greedy answer (7) dominates."""
    weights = list(_trained_to_say_7(model_dir, device).export_weights())
    swapped = []

    def between_steps():
        if not swapped and rollout.num_tokens_in_flight() >= 8:  # every request is under way
            rollout.load_weights(weights, version=20)
            swapped.append(True)

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


# One engine per test (an engine start is the slow part): each test runs its checks in
# an order that needs no other test.


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_vllm_over_ipc_matches_training_continues_turns_on_exact_ids_and_swaps_mid_generation(qwen2_dir):
    rollout = _engine(qwen2_dir, "vllm", "cuda", weight_transfer="ipc", partial_kv="keep")
    try:
        _check_logprobs(rollout, qwen2_dir, "cuda")
        _check_multi_turn(rollout, qwen2_dir, "cuda")
        _check_swap_mid_generation(rollout, qwen2_dir, "cuda")
    finally:
        rollout.close()


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_vllm_over_rpc_matches_training_and_updates_weights_in_place(qwen2_dir):
    rollout = _engine(qwen2_dir, "vllm", "cuda", weight_transfer="rpc")
    try:
        _check_logprobs(rollout, qwen2_dir, "cuda")
        _check_update_in_place(rollout, qwen2_dir, "cuda")
    finally:
        rollout.close()


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_vllm_swaps_mid_generation_with_the_prefix_recomputed(qwen2_dir):
    rollout = _engine(qwen2_dir, "vllm", "cuda", partial_kv="recompute")
    try:
        _check_swap_mid_generation(rollout, qwen2_dir, "cuda")
    finally:
        rollout.close()


@pytest.mark.npu
@pytest.mark.timeout(600)
def test_vllm_ascend_matches_training_continues_turns_and_updates_weights_in_place(qwen2_dir):
    rollout = _engine(qwen2_dir, "vllm_ascend", "npu")
    try:
        _check_logprobs(rollout, qwen2_dir, "npu")
        _check_multi_turn(rollout, qwen2_dir, "npu")
        _check_update_in_place(rollout, qwen2_dir, "npu")
    finally:
        rollout.close()
