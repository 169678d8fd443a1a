"""A step streamed in parts (workflow.stream_step): the parts' gradients, rescaled to
the step's real totals, make the update that training the whole batch at once makes."""

import pytest
import torch
from policy_helpers import columns, policy_update

PROMPTS = [[8, 9, 10], [8, 9, 10], [11, 12], [11, 12], [13, 14, 15, 16], [13, 14, 15, 16], [17], [17]]
# response lengths differ between the parts, so the provisional token count is wrong for each
RESPONSES = [[20, 21, 2], [22, 2], [23, 24, 25, 26, 27, 2], [28, 2], [29, 2], [30, 31, 32, 2], [33, 34, 2], [35, 36, 37, 38, 2]]
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0]
GROUPS = [0, 0, 1, 1, 2, 2, 3, 3]


TRUNCATED = [False, False, True, False, False, False, False, True]  # dropped from the loss with mask_truncated


def _rows(sel: list[int]) -> tuple[dict, list[int]]:
    logp = [[-1.0 - 0.1 * t for t in range(len(RESPONSES[b]))] for b in sel]
    cols = columns(
        [PROMPTS[b] for b in sel],
        [RESPONSES[b] for b in sel],
        [REWARDS[b] for b in sel],
        logp,
        truncated=[TRUNCATED[b] for b in sel],
    )
    return cols, [GROUPS[b] for b in sel]


@pytest.mark.parametrize(
    "agg, mask_truncated",
    [("token-mean", False), ("seq-mean-token-mean", False), ("seq-mean-token-mean", True), ("token-sum", False)],
    ids=["token-mean", "seq-mean", "seq-mean-truncated-dropped", "token-sum"],
)
@pytest.mark.timeout(60)
def test_a_step_trained_in_parts_makes_the_update_of_the_whole_batch(tiny_model_dir, agg, mask_truncated):
    """With truncated rows dropped (mask_truncated) a step has fewer sequences than rows:
    the seq-mean denominator is then wrong in the provisional context too."""
    changes = {
        "algorithm": {"group_size": 2, "clip_against": "behaviour", "mask_truncated": mask_truncated},
        "algorithm.loss": {"agg": agg},
        "train": {"prompts_per_step": 4},
        "train.engine": {"lr": 1e-2, "grad_clip": 1.0, "micro_batch_size": 2},
    }
    whole, streamed = policy_update(tiny_model_dir, changes), policy_update(tiny_model_dir, changes)
    grads = {id(whole): [], id(streamed): []}
    for policy in (whole, streamed):  # the gradients the optimizer steps on (after scaling and clipping)
        step, seen = policy.engine.optimizer.step, grads[id(policy)]

        def recording_step(*args, _step=step, _seen=seen, _net=policy.engine.net, **kwargs):
            _seen.extend(p.grad.clone() for p in _net.parameters() if p.grad is not None)
            return _step(*args, **kwargs)

        policy.engine.optimizer.step = recording_step
    cols, groups = _rows(list(range(8)))
    figures = whole.train(cols, groups, [0] * 8, 0)

    streamed.begin_parts(8)
    for sel in ([0, 1, 2, 3, 4, 5], [6, 7]):  # three groups, then one
        part, part_groups = _rows(sel)
        streamed.train_part(part, part_groups, [0] * len(sel), 0)
    parts = streamed.finish_parts()

    assert parts["stream_parts"] == 2
    for key in ("loss", "pg_loss", "grad_norm", "clip_frac", "entropy", "mismatch_kl", "lr"):
        assert parts[key] == pytest.approx(figures[key], rel=1e-4, abs=1e-7), key
    # the gradients, compared (Adam's first step is lr * sign(g) where g is tiny: the weights
    # themselves differ wherever float noise flips the sign of a near-zero gradient)
    assert len(grads[id(whole)]) == len(grads[id(streamed)]) > 0
    for a, b in zip(grads[id(whole)], grads[id(streamed)]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    # and the step changed the weights (the comparison is not of two untouched models)
    fresh = policy_update(tiny_model_dir, changes)
    moved = [not torch.equal(a, b) for a, b in zip(whole.engine.net.parameters(), fresh.engine.net.parameters())]
    assert any(moved)


@pytest.mark.timeout(30)
def test_finish_parts_without_a_part_is_an_error(tiny_model_dir):
    policy = policy_update(tiny_model_dir, {"algorithm": {"group_size": 2}})
    policy.begin_parts(4)
    with pytest.raises(RuntimeError, match="without a part"):
        policy.finish_parts()
