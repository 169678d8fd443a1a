"""Sequence packing in the torch train engine: the packer's layout,
packed log-probs and train steps equal to the padded path's, and the model really
computing on fewer tokens."""

import pytest
import torch

from asyncflow.algorithms.grpo import PolicyLossConfig, policy_loss_fn
from asyncflow.engines.base import TokenBatch
from asyncflow.engines.batching import block_causal_mask, make_token_batch, pack_batch, plan_packing, sequence_ids
from asyncflow.engines.config import TrainEngineConfig
from asyncflow.engines.factory import build_train_engine


def long_tailed_batch(seed: int = 0, rows: int = 12) -> TokenBatch:
    """Most responses a few tokens, every fourth one 20 to 30: padding dominates."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for b in range(rows):
        n_p = int(torch.randint(3, 7, (1,), generator=g))
        n_r = int(torch.randint(20, 31, (1,), generator=g)) if b % 4 == 1 else int(torch.randint(1, 5, (1,), generator=g))
        prompts.append(torch.randint(6, 90, (n_p,), generator=g).tolist())
        responses.append(torch.randint(6, 90, (n_r,), generator=g).tolist())
    rollout = [(-2.0 - torch.rand(len(r), generator=g)).tolist() for r in responses]
    advantages_B = torch.randn(rows, generator=g)
    return make_token_batch(prompts, responses, pad_token_id=0, rollout_logprobs=rollout, advantages_B=advantages_B)


def count_fed_tokens(engine) -> list[int]:
    """Tokens (real and padding) of every forward the engine's model runs."""
    fed: list[int] = []
    engine.net.register_forward_pre_hook(lambda module, args: fed.append(args[0].numel()))
    return fed


def test_the_packer_places_every_token_once_within_the_budget_with_positions_restarting_per_sequence():
    batch = long_tailed_batch(rows=16)
    lengths = batch.attention_mask.sum(dim=1).tolist()
    budget = 40
    plan = plan_packing(lengths, budget, rows_per_micro_batch=2)
    assert sorted(b for mb in plan for row in mb for b in row) == list(range(16))
    assert all(1 <= len(mb) <= 2 for mb in plan)
    assert len(plan) < 16 / 2  # fewer micro-batches than the padded path's 8
    for mb in plan:
        sub_rows = [b for row in mb for b in row]
        packed = pack_batch(batch, mb)
        R, N = packed.input_ids.shape
        assert R == len(mb) and N <= budget
        for row in mb:
            assert sum(lengths[b] for b in row) <= budget
        # every real token of these rows placed exactly once, with its own id
        assert packed.src.numel() == sum(lengths[b] for b in sub_rows) == packed.dst.unique().numel()
        assert packed.src.unique().numel() == packed.src.numel()
        assert torch.equal(packed.input_ids.view(-1)[packed.dst], batch.input_ids.view(-1)[packed.src])
        # positions restart with each sequence: 0..len-1 in order, sequence by sequence
        for r, row in enumerate(mb):
            expected = torch.cat([torch.arange(lengths[b]) for b in row])
            assert torch.equal(packed.position_ids[r, : expected.numel()], expected)
            assert sequence_ids(packed.position_ids[r : r + 1])[0, : expected.numel()].unique().numel() == len(row)
        # unpack puts values back where they came from
        back_BT = packed.unpack(packed.input_ids.float())
        placed_BT = torch.zeros_like(batch.attention_mask, dtype=torch.bool)
        placed_BT[sub_rows] = batch.attention_mask[sub_rows].bool()
        assert torch.equal(back_BT[placed_BT], batch.input_ids[placed_BT].float())
        assert torch.equal(back_BT[~placed_BT], torch.zeros_like(back_BT[~placed_BT]))


def test_the_packer_splits_rows_to_reach_a_given_number_of_micro_batches_and_refuses_an_impossible_one():
    plan = plan_packing([3, 3, 3, 3], budget=12, rows_per_micro_batch=4, min_micro_batches=3)
    assert len(plan) == 3 and sorted(b for mb in plan for row in mb for b in row) == [0, 1, 2, 3]
    assert all(mb and all(mb) for mb in plan)  # no empty micro-batch, no empty row
    assert plan_packing([5, 0, 4], budget=0, rows_per_micro_batch=1) == [[[0]], [[2]]]  # empty rows left out, budget >= longest
    with pytest.raises(ValueError, match="same number of rows"):
        plan_packing([3, 3], budget=6, rows_per_micro_batch=1, min_micro_batches=3)


def test_the_explicit_mask_keeps_attention_causal_within_each_sequence():
    pos_RN = torch.tensor([[0, 1, 2, 0, 1, 0]])
    allowed = block_causal_mask(pos_RN, torch.float32)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [0, 0, 0, 1, 0, 0],
            [0, 0, 0, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("attention", ["auto", "mask"])
def test_packed_logprobs_entropy_and_values_equal_the_padded_ones_on_fewer_tokens(arch, attention, request):
    model_dir = request.getfixturevalue(f"{arch}_dir")
    batch = long_tailed_batch()
    real = batch.attention_mask.bool()
    for critic in (False, True):
        padded = build_train_engine(TrainEngineConfig(micro_batch_size=4, critic=critic), model_dir)
        packed = build_train_engine(
            TrainEngineConfig(micro_batch_size=4, critic=critic, packing=True, pack_attention=attention), model_dir
        )
        # transformers detects packing from the position ids on both families: auto takes that path
        assert packed.pack_attention == ("position_ids" if attention == "auto" else "mask")
        fed_padded, fed_packed = count_fed_tokens(padded), count_fed_tokens(packed)
        want, got = padded.forward(batch, with_entropy=True), packed.forward(batch, with_entropy=True)
        assert sum(fed_packed) < 0.6 * sum(fed_padded)
        if critic:
            assert torch.allclose(got.values[real], want.values[real], atol=1e-5)
            assert got.values[real].abs().max() > 0
            continue
        assert torch.equal(got.logp[:, 0], torch.zeros(batch.batch_size))
        resp = batch.response_mask.bool()  # the padded path computes log-probs from the first response token on
        assert torch.allclose(got.logp[resp], want.logp[resp], atol=1e-5)
        assert torch.allclose(got.entropy[resp], want.entropy[resp], atol=1e-5)
        assert torch.equal(got.logp[~real], torch.zeros_like(got.logp[~real]))


def capture_step(engine, batch, loss_fn):
    """One train_step; the gradients as the optimizer would see them (it does not step)."""
    grads = []
    engine.optimizer.step = lambda: grads.extend(p.grad.clone() for p in engine.net.parameters())
    return engine.train_step(batch, loss_fn), grads


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_a_packed_train_step_gives_the_padded_loss_metrics_and_gradients(arch, request):
    model_dir = request.getfixturevalue(f"{arch}_dir")
    batch = long_tailed_batch(seed=1)
    for agg in ("token-mean", "seq-mean-token-mean"):
        loss_fn = policy_loss_fn(PolicyLossConfig(agg=agg))
        padded = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=4), model_dir)
        packed = build_train_engine(TrainEngineConfig(lr=1e-3, micro_batch_size=4, packing=True), model_dir)
        fed_padded, fed_packed = count_fed_tokens(padded), count_fed_tokens(packed)
        want, want_grads = capture_step(padded, batch, loss_fn)
        got, got_grads = capture_step(packed, batch, loss_fn)
        assert len(fed_packed) < len(fed_padded) and sum(fed_packed) < 0.6 * sum(fed_padded)
        assert (got.num_fed_tokens, want.num_fed_tokens) == (sum(fed_packed), sum(fed_padded))
        assert got.loss == pytest.approx(want.loss, abs=1e-6) and got.loss != 0.0
        assert got.num_tokens == want.num_tokens
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-4)
        assert got.metrics == pytest.approx(want.metrics, abs=1e-5)
        for a, b in zip(got_grads, want_grads):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_pack_tokens_sets_the_packed_row_width(qwen2_dir):
    batch = long_tailed_batch()
    longest = int(batch.attention_mask.sum(dim=1).max())
    shapes = {}
    for pack_tokens in (0, 2 * longest):
        engine = build_train_engine(TrainEngineConfig(micro_batch_size=2, packing=True, pack_tokens=pack_tokens), qwen2_dir)
        seen: list[tuple[int, ...]] = []
        engine.net.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(tuple(args[0].shape)))
        engine.forward(batch)
        shapes[pack_tokens] = seen
    assert max(n for _, n in shapes[0]) <= longest
    assert max(n for _, n in shapes[2 * longest]) > longest  # rows hold more than the longest sequence
    assert len(shapes[2 * longest]) < len(shapes[0])


def test_packing_refuses_a_batch_that_is_not_right_padded(qwen2_dir):
    batch = long_tailed_batch()
    batch.attention_mask[0] = batch.attention_mask[0].flip(0)
    engine = build_train_engine(TrainEngineConfig(packing=True), qwen2_dir)
    with pytest.raises(ValueError, match="right-padded"):
        engine.forward(batch)


@pytest.mark.parametrize(
    "text,message",
    [
        ("[train.engine]\npack_tokens = 512", "train.engine.pack_tokens = 512: it applies only with packing = true"),
        (
            "[critic.engine]\npack_attention = 'mask'",
            "critic.engine.pack_attention = 'mask': it applies only with packing = true",
        ),
    ],
)
def test_a_packing_key_without_packing_is_refused_naming_the_key(text, message):
    from asyncflow.config.load import ConfigError, load_config_text

    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert message in str(info.value)
    load_config_text(text.replace("]\n", "]\npacking = true\n", 1))  # with packing on, the same key is fine
