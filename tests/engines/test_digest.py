"""Weights digests (engines/digest.py): what the version-integrity check compares."""

from __future__ import annotations

import pytest
import torch

from asyncflow.engines.config import RolloutEngineConfig, TrainEngineConfig
from asyncflow.engines.digest import sample_index, weights_digest
from asyncflow.engines.factory import build_rollout_engine, build_train_engine


def _tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [("a.weight", torch.randn(64, 48, generator=g)), ("b.bias", torch.randn(7, generator=g))]


@pytest.mark.timeout(30)
def test_the_digest_depends_on_names_and_values_not_on_order_or_layout():
    named = _tensors(0)
    assert weights_digest(named) == weights_digest(list(reversed(named)))
    assert weights_digest([(n, t.t().contiguous().t()) for n, t in named]) == weights_digest(named)
    assert weights_digest(named) != weights_digest(_tensors(1))
    assert weights_digest(named) != weights_digest([("c.weight", named[0][1]), named[1]])
    assert weights_digest([]) != 0


@pytest.mark.timeout(30)
def test_one_small_optimizer_step_on_a_large_tensor_changes_the_digest():
    big = torch.randn(4096, 1024)  # 4 M elements, of which the digest samples 1024
    stepped = big - 1e-6 * torch.sign(torch.randn_like(big))
    assert weights_digest([("w", big)]) != weights_digest([("w", stepped)])


@pytest.mark.timeout(30)
def test_a_float32_snapshot_and_a_bfloat16_copy_of_it_agree_when_cast_to_bfloat16():
    named = _tensors(2)
    as_bf16 = [(n, t.to(torch.bfloat16)) for n, t in named]
    assert weights_digest(named, torch.bfloat16) == weights_digest(as_bf16)
    assert weights_digest(named) != weights_digest(as_bf16)


@pytest.mark.timeout(60)
def test_the_native_rollout_engine_reads_back_the_digest_of_the_weights_the_trainer_exports(qwen2_dir):
    trainer = build_train_engine(TrainEngineConfig(lr=1e-2), qwen2_dir)
    rollout = build_rollout_engine(RolloutEngineConfig(), qwen2_dir)
    assert rollout.weights_digest() == weights_digest(trainer.export_weights())
    moved = [(n, t + 0.01) for n, t in trainer.export_weights()]
    rollout.load_weights(moved, version=1)
    assert rollout.weights_digest() == weights_digest(moved)
    rollout.load_weights(moved[1:], version=2)  # a partial load: the first tensor keeps v1's values
    assert rollout.weights_digest() == weights_digest(moved)
    rollout.load_weights([(n, t + 0.01) for n, t in moved[:1]], version=3)
    assert rollout.weights_digest() != weights_digest(moved)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("numel", [2**24 + 1, 49_152 * 576, 151_936 * 896, 128_256 * 2_048])
def test_the_sampled_positions_of_a_real_embedding_stay_inside_it(numel):
    # every real LLM's embedding passes 2^24 elements, where float32 cannot hold numel - 1 exactly
    index = sample_index(numel)
    assert index is not None and index.dtype == torch.int64
    assert int(index[0]) == 0 and int(index[-1]) == numel - 1
    assert bool((index[1:] > index[:-1]).all())


@pytest.mark.timeout(60)
def test_the_digest_of_a_smollm2_sized_embedding_is_computed():
    embed = torch.zeros(49_152, 576)  # SmolLM2-135M's: 28,311,552 elements
    embed[-1, -1] = 1.0  # the last element is sampled: a change there changes the digest
    before = weights_digest([("model.embed_tokens.weight", embed)])
    embed[-1, -1] = 2.0
    assert weights_digest([("model.embed_tokens.weight", embed)]) != before
