"""Overlong shaping in a real run (`afctl up` on the tiny config): with a
``max_new_tokens`` the untrained tiny model often reaches, responses are truncated,
and every step's metrics show the truncation rate, the length penalty and the rows
dropped from the loss, in sync mode and in async mode with two trainer ranks."""

from __future__ import annotations

import pytest
from wf_helpers import afctl, read_jsonl, write_config

MAX_NEW_TOKENS = 3
BUFFER = 2
PENALTY = 0.5


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "mode,num_ranks",
    [("sync", 1), pytest.param("async", 2, marks=pytest.mark.slow)],  # async, 2 ranks: 20 s, with -m slow
)
def test_truncated_responses_are_counted_penalised_and_masked_in_every_step(tmp_path, mode, num_ranks):
    run_dir = tmp_path / "run"
    config = write_config(
        tmp_path,
        mode=mode,
        num_steps=4,
        staleness=0 if mode == "sync" else 1,
        changes={
            "rollout.sampling": {"max_new_tokens": MAX_NEW_TOKENS},
            "algorithm": {"overlong_buffer": BUFFER, "overlong_penalty": PENALTY, "mask_truncated": True},
            "train": {"num_ranks": num_ranks},
            "train.engine": {"fsdp": num_ranks > 1},
        },
    )
    proc = afctl("up", str(config), "--run-dir", str(run_dir))
    out, _ = proc.communicate(timeout=110)
    assert proc.returncode == 0, out
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert len(metrics) == 4
    assert any(m["truncated_frac"] > 0 for m in metrics), metrics  # the untrained model runs into the cap
    for m in metrics:
        # every sample of the step counts (all ranks): fractions in steps of 1 / samples
        assert (m["truncated_frac"] * m["samples"]) == pytest.approx(round(m["truncated_frac"] * m["samples"]))
        # a truncated response is MAX_NEW_TOKENS long and pays the whole penalty; a shorter one
        # pays PENALTY / BUFFER per token in the buffer
        assert m["overlong_penalty_mean"] >= PENALTY * m["truncated_frac"] - 1e-6, m
        assert m["truncated_masked_frac"] == m["truncated_frac"], m
        if m["truncated_masked_frac"] == 1.0:  # every row out of the loss: nothing to learn from
            assert m["loss"] == 0.0 and m["grad_norm"] == 0.0, m
    assert all(m["num_ranks"] == num_ranks for m in metrics)
