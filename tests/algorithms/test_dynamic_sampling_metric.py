"""``[algorithm] dynamic_sampling_metric``: what dynamic sampling compares within a group
(verl's ``filter_groups.metric``): the reward as the advantages see it (the default),
the reward column alone (``score``: before custom roles' scores and the overlong
penalty), or a custom role's / the reward model's column."""

from __future__ import annotations

import pytest
from policy_helpers import columns, policy_update
from tiny_config import tiny_config_text

from asyncflow.config.load import ConfigError, load_config_text

pytestmark = pytest.mark.timeout(120)

ROWS = dict(
    prompts=[[1, 2]] * 4,
    responses=[[3] * 8, [3] * 2, [3] * 2, [3] * 2],  # the first at max_new_tokens: it gets the overlong penalty
    rewards=[1.0, 1.0, 0.0, 1.0],
    rollout_logp=[[-1.0] * 8, [-1.0] * 2, [-1.0] * 2, [-1.0] * 2],
)


def _policy(tiny_model_dir, metric):
    return policy_update(
        tiny_model_dir,
        {
            "rollout.sampling": {"max_new_tokens": 8},
            "algorithm": {
                "dynamic_sampling": True,
                "group_size": 2,
                "overlong_buffer": 4,
                "overlong_penalty": 1.0,
                "dynamic_sampling_metric": metric,
            },
        },
    )


def test_the_filter_compares_the_metric_the_config_names(tiny_model_dir):
    cols = columns(**ROWS)
    shaped = _policy(tiny_model_dir, "reward").filter_values(cols).tolist()
    score = _policy(tiny_model_dir, "score").filter_values(cols).tolist()
    assert score == [1.0, 1.0, 0.0, 1.0]  # group 0 (rows 0, 1): equal scores, filtered by "score"
    assert shaped[0] == pytest.approx(0.0) and shaped[1:] == [1.0, 0.0, 1.0]  # the penalty makes group 0 informative


def test_an_unknown_metric_names_the_columns_there_are():
    with pytest.raises(ConfigError, match=r"algorithm.dynamic_sampling_metric = 'acc'.*'reward', 'score'"):
        load_config_text(tiny_config_text({"algorithm": {"dynamic_sampling": True, "dynamic_sampling_metric": "acc"}}))
