"""actors/_batching.token_batch (vectorised) against a row-by-row reference: the same
tensors, dtypes and starts, on ragged rows, read-only queue arrays and empty responses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asyncflow.actors.runtime.batching import token_batch


def reference(prompts, responses, per_token):
    B, T = len(prompts), max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids, attn, resp = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T)
    extra = {n: torch.zeros(B, T) for n in per_token}
    for b, (p, r) in enumerate(zip(prompts, responses)):
        P, L = len(p), len(r)
        ids[b, :P], ids[b, P : P + L] = torch.tensor(p.tolist()), torch.tensor(r.tolist(), dtype=torch.long)
        attn[b, : P + L], resp[b, P : P + L] = 1, 1.0
        for n, col in per_token.items():
            extra[n][b, P : P + L] = torch.tensor(col[b].tolist())
    return ids, attn, resp, extra, [len(p) for p in prompts]


@pytest.mark.timeout(30)
def test_vectorised_token_batch_equals_the_row_by_row_reference():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 99, rng.integers(1, 9)).astype(np.int64) for _ in range(37)]
    responses = [rng.integers(3, 99, rng.integers(0, 7)).astype(np.int64) for _ in range(37)]
    responses[0] = responses[0][:0]  # an empty response
    per_token = {
        "rollout_logp": [rng.standard_normal(len(r)).astype(np.float32) for r in responses],
        "ref_logp": [rng.standard_normal(len(r)).astype(np.float32) for r in responses],
    }
    for arrays in (prompts, responses, *per_token.values()):
        for a in arrays:
            a.flags.writeable = False  # queue arrays are read-only views
    tb, starts = token_batch(prompts, responses, per_token)
    ids, attn, resp, extra, want_starts = reference(prompts, responses, per_token)
    assert torch.equal(tb.input_ids, ids) and tb.input_ids.dtype == torch.long
    assert torch.equal(tb.attention_mask, attn) and tb.attention_mask.dtype == torch.long
    assert torch.equal(tb.response_mask, resp) and tb.response_mask.dtype == torch.float32
    for name, want in extra.items():
        assert torch.equal(getattr(tb, name), want), name
    assert starts == want_starts


@pytest.mark.timeout(60)
def test_right_padded_batches_train_without_the_mask_and_give_the_same_logprobs(qwen2_dir):
    """The training engine drops the attention mask of a right-padded batch (causal
    attention alone is exact there); its log-probs equal those with the mask."""
    from asyncflow.engines.config import TrainEngineConfig
    from asyncflow.engines.torch_train import TorchTrainEngine, right_padded, shift_logp

    engine = TorchTrainEngine(TrainEngineConfig(), qwen2_dir)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 50, rng.integers(2, 6)) for _ in range(9)]
    responses = [rng.integers(3, 50, rng.integers(1, 5)) for _ in range(9)]
    tb, _ = token_batch(prompts, responses)
    assert right_padded(tb.attention_mask) and not right_padded(tb.attention_mask.flip(1))
    with torch.no_grad():
        got = engine.forward(tb).logp
        logits, _ = engine.net(tb.input_ids, tb.attention_mask)  # the model with the mask
        want = shift_logp(logits, tb.input_ids, 1.0)
    diff = ((got - want) * tb.response_mask).abs().max().item()
    assert diff < 1e-5, diff  # the same math; the kernels may round differently (seen: 5e-7)


@pytest.mark.timeout(30)
def test_the_reward_joins_two_batches_row_for_row():
    from asyncflow.actors.roles.reward import joined
    from asyncflow.core import protocol
    from asyncflow.core.tq.client import Batch

    def batch(indices):
        meta = protocol.BatchMeta(
            task="reward", indices=indices, metas=[protocol.RowMeta(index=i) for i in indices], shards=[0] * len(indices)
        )
        return Batch("reward", meta, {"x": [np.asarray([i]) for i in indices]})

    both = joined(batch([4]), batch([7, 9]))
    assert both.task == "reward" and both.indices == [4, 7, 9] and [m.index for m in both.metas] == [4, 7, 9]
    assert [int(a[0]) for a in both.columns["x"]] == [4, 7, 9]
    one = batch([4])
    assert joined(one, batch([])) is one


@pytest.mark.timeout(60)
def test_the_native_engines_slot_table_rows_are_each_sequences_block_slots(qwen2_dir):
    """NativeRolloutEngine._fill_slots (one scatter) writes, for each admitted sequence,
    exactly the slots KVBlockPool.slots gives for its blocks, and leaves other rows alone."""
    from asyncflow.engines.config import RolloutEngineConfig
    from asyncflow.engines.native_rollout import NativeRolloutEngine, _Seq

    engine = NativeRolloutEngine(RolloutEngineConfig(kv_block_tokens=4), qwen2_dir)
    seqs = []
    for row, need in ((3, 5), (0, 13), (6, 4)):
        q = _Seq(prompt_index=row, sample_index=0, prompt=[1] * need)
        q.blocks, q.row = engine.pool.allocate(need), row
        seqs.append(q)
    table = torch.full((8, 16), -1, dtype=torch.long)
    engine._fill_slots(seqs, table)
    for q in seqs:
        want = engine.pool.slots(q.blocks)
        assert torch.equal(table[q.row, : want.numel()], want)
    assert (table[[1, 2, 4, 5, 7]] == -1).all()
