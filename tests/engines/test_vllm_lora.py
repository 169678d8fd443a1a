"""LoRA on the vLLM adapter (``engines/vllm_lora.py``). The config rule and the
engine-free parts run here; generation with vLLM's LoRA support needs a CUDA GPU
with vLLM (``-m gpu``)."""

import importlib.util

import pytest
import torch

from asyncflow.config.load import ConfigError
from asyncflow.config.run import RunConfig
from asyncflow.core.schema import check_tree
from asyncflow.engines.config import LoraConfig, RolloutEngineConfig, SamplingParams, TrainEngineConfig
from asyncflow.engines.factory import build_rollout_engine, build_train_engine
from asyncflow.engines.vllm_lora import llm_kwargs

PROMPT = [4, 9, 16, 10, 20, 5]


def test_vllm_starts_with_lora_only_when_asked_and_in_the_ranks_it_supports():
    assert llm_kwargs(0) == {}
    assert llm_kwargs(4) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    assert llm_kwargs(16)["max_lora_rank"] == 16
    with pytest.raises(ValueError, match="up to 512"):
        llm_kwargs(1024)


def test_a_lora_run_on_vllm_without_max_lora_rank_is_refused_naming_the_key():
    cfg = RunConfig()
    cfg.train.engine.lora = LoraConfig(rank=8)
    cfg.rollout.engine = RolloutEngineConfig(type="vllm")
    with pytest.raises(ConfigError, match=r"rollout\.engine\.max_lora_rank = 0: .*>= 8"):
        check_tree(cfg)
    cfg.rollout.engine = RolloutEngineConfig(type="vllm", max_lora_rank=8)
    check_tree(cfg)
    cfg.rollout.engine = RolloutEngineConfig(type="native")  # merges adapters itself: nothing to set
    check_tree(cfg)


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_vllm_generates_with_the_trained_adapter_and_replaces_it_at_the_next_sync(qwen2_dir):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    lora = LoraConfig(rank=8, alpha=16.0)
    trainer = build_train_engine(TrainEngineConfig(device="cuda", lr=3e-2, lora=lora), qwen2_dir)
    rollout = build_rollout_engine(
        RolloutEngineConfig(type="vllm", device="cuda", kv_cache_fraction=0.3, max_lora_rank=8), qwen2_dir
    )
    from asyncflow.engines.base import TokenBatch

    for target in (7, 8):  # train the adapter towards a constant response; the replica generates it
        ids = torch.tensor([PROMPT + [target] * 8])
        tb = TokenBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=torch.ones(ids.shape))
        for _ in range(40):
            trainer.train_step(tb, lambda o, mb, ctx: (-(o.logp * mb.response_mask).sum() / ctx.num_tokens, {}))
        snapshot = list(trainer.export_weights())
        assert all(".lora_" in name for name, _ in snapshot)
        rollout.load_weights(snapshot, version=trainer.version)
        greedy = rollout.generate([PROMPT], SamplingParams(temperature=0.0, max_new_tokens=8))
        assert greedy[0].response_ids == [target] * 8 and rollout.version == trainer.version
    rollout.close()
