"""A row longer than the trainer's token budget (the model's context) is cut to it,
counted and reported, never trained whole (a 16k-token trajectory once grew the trainer
to 13 GB)."""

from __future__ import annotations

import pytest
import torch
from policy_helpers import columns, policy_update

from asyncflow.actors.runtime.batching import fit_to_budget
from asyncflow.engines.base import TrainStepResult

pytestmark = pytest.mark.timeout(120)

CONTEXT = 512  # the tiny model's max_position_embeddings


def test_rows_past_the_budget_are_cut_to_it_and_the_others_are_untouched():
    cols = columns([[1, 2], [1, 2, 3]], [[4] * 10, [5] * 3], [1.0, 0.0], [[-0.5] * 10, [-0.1] * 3])
    cols["loss_mask"] = [torch.ones(10, dtype=torch.uint8).numpy(), torch.ones(3, dtype=torch.uint8).numpy()]
    fitted, cut = fit_to_budget(cols, 8)
    assert cut == [0]
    assert [len(r) for r in fitted["response_ids"]] == [6, 3] and len(fitted["rollout_logp"][0]) == 6
    assert len(fitted["loss_mask"][0]) == 6 and fitted["finish"][0][0] == 0  # cut: not finished
    assert fitted["response_ids"][1] is cols["response_ids"][1] and fitted["finish"][1][0] == 1


def test_a_step_trains_a_row_past_the_context_cut_to_it_and_counts_it(tiny_model_dir):
    policy = policy_update(tiny_model_dir, {})
    long, short = [7] * 2000, [7] * 4
    cols = columns([[1, 2, 3], [1, 2, 3]], [long, short], [1.0, 0.0], [[-0.5] * len(long), [-0.5] * len(short)])
    seen = {}

    def train_step(tb, loss_fn, temperature=1.0, top_k=0, top_p=1.0):
        seen["T"] = tb.input_ids.shape[1]
        return TrainStepResult(loss=0.0, grad_norm=0.0, num_tokens=0, metrics={}, step=1)

    policy.engine.train_step = train_step
    policy.train(cols, [0, 0])
    assert seen["T"] == CONTEXT  # never the 2003 tokens
    assert policy.batch_figures(cols)["rows_cut_to_context"] == 1.0
