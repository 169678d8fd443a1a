"""The reward-model role without processes: its hosts, queue task and devices in the
topology, its memory in the preflight estimate, and its column in the trainer's reward."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
import torch

from asyncflow.actors.driver import topology
from asyncflow.actors.driver.preflight import check, estimate
from asyncflow.actors.driver.supervisor import num_devices, visible_devices
from asyncflow.actors.roles.reward_model import RewardModelActor
from asyncflow.actors.trainer.policy import PolicyUpdate
from asyncflow.config import names
from asyncflow.config.load import load_config_text
from asyncflow.config.roles import REWARD_MODEL_COLUMN

ON = "[reward_model]\nenabled = true\n"


def _model_dir(path, hidden: int, layers: int):
    path.mkdir()
    config = {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_the_reward_model_role_runs_its_replicas_on_a_queue_task_of_its_own_only_when_enabled():
    off = topology.plan_hosts(load_config_text(""), "/run")
    assert not any(h.kind == names.REWARD_MODEL for h in off)
    assert f"tq.controller.{names.TASK_REWARD_MODEL}" not in [s.name for s in off[0].specs]
    cfg = load_config_text(ON + "num_replicas = 2\n")
    hosts = topology.plan_hosts(cfg, "/run")
    mine = [h for h in hosts if h.kind == names.REWARD_MODEL]
    assert [h.name for h in mine] == ["reward_model.0", "reward_model.1"]
    assert all(h.role is not None and h.role.actor is RewardModelActor and h.role.restartable for h in mine)
    assert mine[0].role is not None and mine[0].role.outputs == (REWARD_MODEL_COLUMN,)  # a restart acks rows already scored
    assert f"tq.controller.{names.TASK_REWARD_MODEL}" in [s.name for s in hosts[0].specs]
    assert msgspec.msgpack.decode(mine[1].specs[-1].kwargs) == {"run_dir": "/run"}
    # started before the training group, like the other workers
    kinds = [h.kind for h in hosts]
    assert kinds.index(names.REWARD_MODEL) < kinds.index(names.TRAINER)


def test_each_replica_sees_its_own_device_of_reward_model_devices():
    cfg = load_config_text(ON + "num_replicas = 2\ndevices = [3, 5]\n")
    role = topology.built_in(names.REWARD_MODEL)
    assert num_devices(role, cfg) == 1
    assert [visible_devices(role, f"reward_model.{i}", cfg) for i in range(2)] == ["3", "5"]


def test_the_preflight_estimate_counts_each_reward_model_replica_at_its_models_size(tmp_path):
    policy = _model_dir(tmp_path / "policy", hidden=64, layers=2)
    rm = _model_dir(tmp_path / "rm", hidden=128, layers=4)
    assert not any(k.startswith("reward_model") for k in estimate(load_config_text(""), policy, rm))
    cfg = load_config_text(ON + "num_replicas = 2\ndtype = 'bfloat16'\n")
    per_role = estimate(cfg, policy, rm)
    from asyncflow.planner.io import from_hf_config

    params = from_hf_config(rm).num_params
    assert per_role["reward_model.0"] == per_role["reward_model.1"] == pytest.approx(params * 2)
    assert "reward_model.1" in check(cfg, policy, rm)
    judge = estimate(load_config_text(ON + "kind = 'judge'\n"), policy)  # no path: the policy's model judges
    assert judge["reward_model.0"] == pytest.approx(from_hf_config(policy).num_params * 4 + (64 << 20))


def test_the_trainers_reward_adds_the_weighted_reward_model_score_to_the_functions_reward():
    cfg = load_config_text(ON + "weight = 0.5\n")
    policy = object.__new__(PolicyUpdate)  # only the reward sum: no engine
    policy.extra_rewards = cfg.reward_columns
    columns = {
        "reward": [np.asarray([1.0], np.float32), np.asarray([0.0], np.float32)],
        REWARD_MODEL_COLUMN: [np.asarray([0.4], np.float32), np.asarray([-2.0], np.float32)],
    }
    assert policy.rewards(columns).tolist() == pytest.approx([1.2, -1.0])
    off = load_config_text("")
    assert off.reward_columns == []
    assert cfg.reward_columns == [(REWARD_MODEL_COLUMN, 0.5)]
    assert torch.is_tensor(policy.rewards(columns))
