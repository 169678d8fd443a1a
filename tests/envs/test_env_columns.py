"""The multi-turn columns downstream of the rollout: the trainer's batch takes the
loss mask as its response mask, the reward role adds (or takes) the environment's
reward, and the trainer's environment figures."""

from __future__ import annotations

import numpy as np
import pytest

from asyncflow.actors.runtime.batching import token_batch
from asyncflow.actors.runtime.scoring import env_sums, with_env_rewards


def test_the_response_mask_is_the_loss_mask_on_response_tokens():
    prompts = [np.array([1, 2, 3]), np.array([4])]
    responses = [np.array([10, 11, 12, 13]), np.array([20, 21])]
    masks = [np.array([1, 0, 0, 1], dtype=np.uint8), np.array([1, 1], dtype=np.uint8)]
    logp = [np.array([-1.0, 0.0, 0.0, -2.0], dtype=np.float32), np.array([-3.0, -4.0], dtype=np.float32)]
    tb, starts = token_batch(prompts, responses, {"rollout_logp": logp}, masks)
    assert starts == [3, 1]
    assert tb.response_mask.tolist() == [[0, 0, 0, 1, 0, 0, 1], [0, 1, 1, 0, 0, 0, 0]]
    assert tb.attention_mask.tolist() == [[1] * 7, [1, 1, 1, 0, 0, 0, 0]]
    assert tb.input_ids[0].tolist() == [1, 2, 3, 10, 11, 12, 13]
    plain, _ = token_batch(prompts, responses, {"rollout_logp": logp})  # no loss mask: every response token counts
    assert plain.response_mask.tolist() == [[0, 0, 0, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0, 0]]


def test_the_environment_reward_is_added_and_a_failed_environment_gives_0():
    env_reward = [np.array([1.0], dtype=np.float32), np.array([0.5], dtype=np.float32), np.array([0.0], dtype=np.float32)]
    env_error = [np.array([0], dtype=np.uint8), np.array([0], dtype=np.uint8), np.array([1], dtype=np.uint8)]
    assert with_env_rewards([0.25, 0.0, 0.75], env_reward, env_error) == pytest.approx([1.25, 0.5, 0.0])


def test_the_trainer_counts_rows_with_tool_calls_calls_errors_env_reward_and_model_tokens():
    columns = {
        "env_tool_calls": [np.array([2], dtype=np.int32), np.array([0], dtype=np.int32), np.array([1], dtype=np.int32)],
        "env_error": [np.array([0], dtype=np.uint8), np.array([0], dtype=np.uint8), np.array([1], dtype=np.uint8)],
        "env_reward": [np.array([1.0], dtype=np.float32), np.array([0.0], dtype=np.float32), np.array([0.0], dtype=np.float32)],
        "loss_mask": [np.array([1, 0, 1], dtype=np.uint8), np.array([1, 1], dtype=np.uint8), np.array([0], dtype=np.uint8)],
    }
    assert env_sums(columns) == [2.0, 3.0, 1.0, 1.0, 4.0]
