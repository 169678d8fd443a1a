"""Dynamic sampling's pure parts: which groups a step keeps, how the kept rows are
split between trainer ranks, and the config keys (over-sampling, refusals)."""

from __future__ import annotations

import pytest

from asyncflow.actors.trainer.sources.dynamic import subset
from asyncflow.algorithms.dynamic_sampling import choose_groups, is_informative
from asyncflow.config.load import load_config_text
from asyncflow.core import protocol
from asyncflow.core.schema import ConfigError


def rows(rewards_by_group: dict[int, list[float]]) -> tuple[list[int], list[float]]:
    group_ids = [g for g, rs in rewards_by_group.items() for _ in rs]
    rewards = [r for rs in rewards_by_group.values() for r in rs]
    return group_ids, rewards


def test_groups_of_equal_rewards_are_filtered_and_informative_ones_kept_in_order():
    group_ids, rewards = rows({7: [1, 1], 3: [0, 1], 9: [0.5, 0.5], 4: [0.2, 0.1]})
    choice = choose_groups(group_ids, rewards, num_groups=4)
    assert choice.kept == [3, 4] and choice.filtered == [7, 9] and choice.surplus == [] and choice.padded == []


def test_informative_groups_beyond_the_batch_are_surplus():
    group_ids, rewards = rows({0: [0, 1], 1: [1, 0], 2: [0, 0], 3: [0, 0.5]})
    choice = choose_groups(group_ids, rewards, num_groups=2)
    assert choice.kept == [0, 1] and choice.surplus == [3] and choice.filtered == [2]


def test_with_several_ranks_the_kept_count_is_a_multiple_of_the_ranks():
    group_ids, rewards = rows({0: [0, 1], 1: [1, 0], 2: [0, 0], 3: [0, 0.5], 4: [1, 1]})
    choice = choose_groups(group_ids, rewards, num_groups=4, multiple=2)
    assert choice.kept == [0, 1] and choice.surplus == [3] and choice.filtered == [2, 4]


def test_a_step_without_enough_informative_groups_for_every_rank_is_padded_with_equal_ones():
    group_ids, rewards = rows({0: [1, 1], 1: [0, 1], 2: [0, 0]})
    choice = choose_groups(group_ids, rewards, num_groups=2, multiple=2)
    assert choice.kept == [1, 0] and choice.padded == [0] and choice.filtered == [2] and choice.surplus == []
    choice = choose_groups(*rows({0: [1, 1], 1: [0, 0]}), num_groups=2, multiple=1)
    assert choice.kept == [0] and choice.padded == [0] and choice.filtered == [1]


def test_every_group_lands_in_exactly_one_list():
    group_ids, rewards = rows({g: [g % 3 * 0.5, 0.5] for g in range(11)})
    choice = choose_groups(group_ids, rewards, num_groups=4, multiple=2)
    dropped = choice.filtered + choice.surplus
    assert sorted(choice.kept + dropped) == list(range(11)) and not set(choice.kept) & set(dropped)


def test_rewards_equal_within_float32_rounding_count_as_equal():
    assert not is_informative([0.1, 0.1 + 1e-9])
    assert is_informative([0.1, 0.1 + 1e-3])
    assert not is_informative([1.0])


def test_the_kept_rows_keep_their_groups_whole_in_balanced_rank_parts():
    metas = [protocol.RowMeta(index=10 + k, group_id=k // 2, group_size=2, prompt_len=4, response_len=k) for k in range(12)]
    meta = protocol.BatchMeta(task="train", indices=[m.index for m in metas], metas=metas, shards=[k % 2 for k in range(12)])
    keep = [0, 1, 4, 5, 6, 7, 10, 11]  # groups 0, 2, 3, 5
    kept = subset(meta, keep, num_ranks=2)
    assert kept.indices == [10 + p for p in keep] and kept.shards == [0, 1] * 4
    assert sorted(p for part in kept.parts for p in part) == list(range(8))
    for part in kept.parts:  # two whole groups per rank
        groups = [kept.metas[p].group_id for p in part]
        assert len(part) == 4 and all(groups.count(g) == 2 for g in groups)
    # balanced: the longest group (5) goes with the shortest (0)
    assert {frozenset(kept.metas[p].group_id for p in part) for part in kept.parts} == {frozenset({0, 5}), frozenset({2, 3})}
    assert subset(meta, keep, num_ranks=1).parts == []


def test_dynamic_sampling_loads_more_groups_per_step_only_when_on():
    base = "[train]\nprompts_per_step = 6\n"
    assert load_config_text(base).rows_per_step == 6 * 8
    on = load_config_text(base + "[algorithm]\ndynamic_sampling = true\ndynamic_sampling_oversample = 1.5\n")
    assert on.groups_per_step == 9 and on.rows_per_step == 72 and on.samples_per_step == 48
    off = load_config_text(base + "[algorithm]\ndynamic_sampling_oversample = 3.0\n")
    assert off.groups_per_step == 6


@pytest.mark.parametrize(
    "text,message",
    [
        (
            '[algorithm]\nname = "ppo"\ndynamic_sampling = true',
            "algorithm.dynamic_sampling = True: filters prompt groups by their rewards: use a group estimator",
        ),
        ("[algorithm]\ndynamic_sampling = true\ndynamic_sampling_oversample = 0.5", "dynamic_sampling_oversample"),
    ],
)
def test_dynamic_sampling_settings_that_cannot_work_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        load_config_text(text)
