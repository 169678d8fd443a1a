"""Partial rollout ([workflow] partial_rollout): rows whose tokens come from several
policy versions, tagged with the oldest; the trainer's staleness check on each row's
tokens (actors/_versions.token_staleness); a run end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from wf_helpers import afctl, assert_trained_exactly_once, read_jsonl, write_config

from asyncflow.actors.trainer._versions import VersionLedger, VersionMismatch, token_staleness
from asyncflow.config.load import ConfigError, load_config_text
from asyncflow.core import protocol

HERE = Path(__file__).resolve().parent


def _meta(index: int, version: int) -> protocol.RowMeta:
    return protocol.RowMeta(index=index, version=version)


def test_a_row_tagged_newer_than_its_oldest_token_fails_the_staleness_check_naming_the_row():
    # step 5, k = 1: the row's tokens come from v3..v5; tagged v5, the row version alone says
    # "0 versions old" and the version ledger finds nothing wrong with it
    ledger = VersionLedger()
    ledger.record(5, 0x55)
    tagged_newest = protocol.RowMeta(index=7, version=5, weights_digest=0x55)
    assert ledger.check(5, [7], [tagged_newest], strict=True)["weights_mismatch"] == 0
    tv = [np.array([3, 3, 4, 5], dtype=np.int32)]
    with pytest.raises(
        VersionMismatch, match=r"row 7 is tagged v5 but its tokens come from versions 3..5: its oldest token is 2"
    ):
        token_staleness(5, 1, [7], [tagged_newest], tv)
    # tagged with its oldest token (v3) it is still 2 versions old: over the bound k = 1
    with pytest.raises(VersionMismatch, match="row 7 is tagged v3 .* 2 versions old"):
        token_staleness(5, 1, [7], [_meta(7, 3)], tv)


def test_the_staleness_of_rows_with_per_token_versions_is_their_oldest_tokens():
    rows = [np.array([4, 4, 5, 5], dtype=np.int32), np.array([5, 5], dtype=np.int32), np.array([4], dtype=np.int32)]
    figures = token_staleness(5, 1, [0, 1, 2], [_meta(0, 4), _meta(1, 5), _meta(2, 4)], rows)
    assert figures == {
        "token_staleness_max": 1.0,
        "token_staleness_mean": (1 + 1 + 0 + 0 + 0 + 0 + 1) / 7,
        "mixed_version_frac": 1 / 3,
    }


def test_partial_rollout_in_sync_mode_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match='workflow.partial_rollout.*needs workflow.mode = "async"'):
        load_config_text('[model]\ntiny = "qwen2"\n[workflow]\nmode = "sync"\npartial_rollout = true\n')


@pytest.mark.parametrize(
    "settings, streams, why",
    [
        ("", False, "async on cpu: the trainer is the long pole"),
        ('[rollout.engine]\ndevice = "cuda"\n', True, "async on cuda: the stream keeps the engine full"),
        ('[rollout.engine]\ndevice = "npu"\n', True, "async on npu"),
        ('[rollout.engine]\ndevice = "cuda"\ntype = "vllm"\n', False, "vLLM swaps weights inside its own generate calls"),
        ('[rollout.engine]\ndevice = "cuda"\n[workflow]\nmode = "sync"\n', False, "sync mode"),
        ("[workflow]\npartial_rollout = true\n", True, "workflow.partial_rollout = true"),
        ('[rollout.engine]\ndevice = "cuda"\n[workflow]\npartial_rollout = false\n', False, "partial_rollout = false"),
    ],
)
def test_partial_rollout_auto_streams_on_an_accelerator_and_goes_unit_by_unit_on_a_cpu(settings, streams, why):
    cfg = load_config_text('[model]\ntiny = "qwen2"\n' + settings)
    assert cfg.workflow.partial_rollout == ("auto" if "partial_rollout" not in settings else streams)
    assert cfg.rollout_streams is streams
    assert why in cfg.rollout_mode_why()[1]


def test_partial_rollout_with_an_environment_is_accepted():
    cfg = load_config_text(
        '[model]\ntiny = "qwen2"\n[workflow]\nmode = "async"\npartial_rollout = true\n'
        '[env]\npath = "asyncflow.envs.calc:CalcEnv"\n'
    )
    assert cfg.workflow.partial_rollout and cfg.env.path


def test_partial_rollout_with_the_gateway_is_accepted():
    cfg = load_config_text(
        '[model]\ntiny = "qwen2"\n[workflow]\nmode = "async"\npartial_rollout = true\n[rollout.gateway]\nenabled = true\n'
    )
    assert cfg.workflow.partial_rollout and cfg.rollout.gateway.enabled


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("partial", [True, False], ids=["on", "off"])
def test_a_partial_rollout_run_trains_rows_of_several_versions_each_once(tmp_path, partial):
    """With the flag, rows span weight swaps (mixed_version_frac > 0) within the bound, the
    digests check out and every group is trained once; without it no row has token versions."""
    num_steps = 6
    config = write_config(
        tmp_path,
        num_steps=num_steps,
        changes={
            "reward": {"functions": ["wf_rewards:length"]},
            "train.engine": {"lr": 1e-2},
            "rollout.sampling": {"max_new_tokens": 24},
            "workflow": {"partial_rollout": partial},
        },
        extra=f'[cluster]\npython_path = ["{HERE}"]\n',
    )
    proc = afctl("up", str(config), "--run-dir", str(tmp_path / "run"))
    out, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, out
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(r["weights_mismatch"] == 0 and r["staleness_max"] <= 1 for r in rows)
    if partial:
        assert all(r["token_staleness_max"] <= 1 for r in rows)
        assert max(r["mixed_version_frac"] for r in rows) > 0, rows
    else:
        assert not any("mixed_version_frac" in r for r in rows)
    assert_trained_exactly_once(tmp_path / "run", num_steps, prompts_per_step=2, group_size=2)


@pytest.mark.timeout(300)
def test_a_partial_rollout_run_scores_its_rows_in_the_rollout_with_placement_rollout(tmp_path):
    """reward.placement = "rollout" with partial rollout: each finished group is scored in the
    replica and put with its reward (no reward process); the run trains every group once,
    and its rewards are the reward function's (wf_rewards:length, > 0 for any response)."""
    num_steps = 4
    config = write_config(
        tmp_path,
        num_steps=num_steps,
        changes={
            "reward": {"functions": ["wf_rewards:length"], "placement": "rollout"},
            "rollout.sampling": {"max_new_tokens": 12},
            "workflow": {"partial_rollout": True},
        },
        extra=f'[cluster]\npython_path = ["{HERE}"]\n',
    )
    proc = afctl("up", str(config), "--run-dir", str(tmp_path / "run"))
    out, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, out
    assert "reward.0" not in out  # scored in the replica: no reward process started
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(rows) == num_steps and all(r["reward_mean"] > 0 for r in rows), rows
    assert_trained_exactly_once(tmp_path / "run", num_steps, prompts_per_step=2, group_size=2)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_partial_rollout_run_with_an_environment_trains_multi_turn_rows_of_several_versions_each_once(tmp_path):
    """Partial rollout with [env]: every trajectory takes its two turns (TwoTurnEnv), rows span
    weight swaps within the bound, their token versions pass the trainer's check, the digests
    check out and every group is trained once."""
    num_steps = 6
    config = write_config(
        tmp_path,
        num_steps=num_steps,
        changes={
            "reward": {"functions": ["wf_rewards:length"]},
            "train.engine": {"lr": 1e-2},
            "rollout.sampling": {"max_new_tokens": 24},
            "workflow": {"partial_rollout": True},
            "env": {"path": "wf_envs:TwoTurnEnv", "max_turns": 3},
        },
        extra=f'[cluster]\npython_path = ["{HERE}"]\n',
    )
    proc = afctl("up", str(config), "--run-dir", str(tmp_path / "run"))
    out, _ = proc.communicate(timeout=280)
    assert proc.returncode == 0, out
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert all(r["weights_mismatch"] == 0 and r["staleness_max"] <= 1 and r["token_staleness_max"] <= 1 for r in rows)
    assert all(r["env/tool_call_rate"] == 1 and r["env/error_rate"] == 0 for r in rows), rows  # two turns each
    assert max(r["mixed_version_frac"] for r in rows) > 0, rows
    assert_trained_exactly_once(tmp_path / "run", num_steps, prompts_per_step=2, group_size=2)
