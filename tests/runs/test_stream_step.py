"""workflow.stream_step: the trainer trains a step's prompt groups as they come, one
optimizer step per step; refused where it cannot give the whole batch's update."""

from __future__ import annotations

import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

from asyncflow.actors.trainer.sources import check_step_shape
from asyncflow.config.load import ConfigError, load_config_text

BASE = '[model]\ntiny = "qwen2"\n'


@pytest.mark.parametrize(
    "toml, fix",
    [
        ('[workflow]\nmode = "sync"\nstream_step = true\n', "or set workflow.stream_step = false"),
        ("[workflow]\nstream_step = true\n[train]\nnum_ranks = 2\n[train.engine]\nfsdp = true\n", "set train.num_ranks = 1"),
        ("[workflow]\nstream_step = true\n[algorithm]\nepochs = 2\n", "set algorithm.epochs = 1"),
        ('[workflow]\nstream_step = true\n[algorithm]\nname = "reinforce_plus_plus"\n', "choose grpo or rloo"),
        ("[workflow]\nstream_step = true\n[algorithm]\ndynamic_sampling = true\n", "algorithm.dynamic_sampling = false"),
    ],
    ids=["sync", "ranks", "epochs", "batch-estimator", "dynamic-sampling"],
)
@pytest.mark.timeout(30)
def test_stream_step_where_it_cannot_give_the_whole_batch_update_is_refused_naming_the_fix(toml, fix):
    with pytest.raises(ConfigError, match="workflow.stream_step") as err:
        check_step_shape(load_config_text(BASE + toml))  # the step source's refusals, checked before launch
    assert fix in str(err.value)


@pytest.mark.timeout(240)
def test_a_streamed_on_policy_run_trains_every_group_once_in_several_parts_per_step(tmp_path):
    """staleness 0 and parts of one group: every row is trained at the version that made
    it (on-policy), each step in more than one part, every group exactly once."""
    num_steps = 4
    config = write_config(
        tmp_path,
        num_steps=num_steps,
        staleness=0,
        changes={
            "workflow": {"stream_step": True},
            "rollout": {"prompts_per_call": 1},
            "train": {"prompts_per_step": 3},
            "train.engine": {"micro_batch_size": 2},
        },
    )
    proc = afctl("up", str(config), "--run-dir", str(tmp_path / "run"))
    out, _ = proc.communicate(timeout=220)
    assert proc.returncode == 0, out
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(num_steps))
    assert all(r["staleness_max"] == 0 and r["weights_mismatch"] == 0 for r in rows), rows
    assert all(r["samples"] == 6 for r in rows)
    assert max(r["stream_parts"] for r in rows) > 1, [r["stream_parts"] for r in rows]
    assert_trained_exactly_once(tmp_path / "run", num_steps, prompts_per_step=3, group_size=2)
