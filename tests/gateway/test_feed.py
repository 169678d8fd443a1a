"""The feed of rewarded sessions into the queue: groups, lone sessions, timeouts (pure state)."""

import numpy as np
import pytest

from asyncflow.core.protocol import RowMeta
from asyncflow.gateway.feed import Rewarded, SessionFeed, unit_rows


def rewarded(session: str, reward: float = 1.0, at_s: float = 0.0, versions=(3, 3, 4, 4)) -> Rewarded:
    row = {
        "session": session,
        "prompt_ids": [5, 6],
        "response_ids": [7, 8, 9, 10],
        "rollout_logp": [-0.5, 0.0, -0.25, -1.0],
        "loss_mask": [1, 0, 1, 1],
        "token_versions": list(versions),
        "version": min(versions),
        "finish": "stop",
        "reward": reward,
    }
    return Rewarded(session=session, row=row, digest=0xABC, at_s=at_s)


@pytest.mark.timeout(10)
def test_a_lone_session_is_written_at_once_and_a_keyed_one_waits_for_its_whole_group():
    feed = SessionFeed(group_size=3, timeout_s=60)
    assert [u.session for u in feed.offer(rewarded("lone"), None)] == ["lone"]
    assert feed.offer(rewarded("a"), "task-1") == []
    assert feed.offer(rewarded("b"), "task-1") == []
    assert feed.counts.waiting == 2 and feed.waiting_groups() == {"task-1": ["a", "b"]}
    assert [u.session for u in feed.offer(rewarded("c"), "task-1")] == ["a", "b", "c"]
    assert feed.counts.waiting == 0 and feed.waiting_groups() == {}
    assert feed.offer(rewarded("d"), "task-1") == []  # a fourth session of the key starts a new group


@pytest.mark.timeout(10)
def test_a_group_not_complete_within_the_timeout_is_dropped_and_counted():
    feed = SessionFeed(group_size=2, timeout_s=10)
    feed.offer(rewarded("a", at_s=100.0), "g")
    feed.offer(rewarded("x", at_s=105.0), "h")
    assert feed.expire(now_s=110.0) == []
    assert [d.session for d in feed.expire(now_s=110.5)] == ["a"]
    assert (feed.counts.group_incomplete, feed.counts.waiting) == (1, 1)
    assert feed.counts.as_metrics()["gateway/sessions_group_incomplete"] == 1.0


@pytest.mark.timeout(10)
def test_a_group_whose_write_failed_waits_again_without_its_last_member():
    feed = SessionFeed(group_size=2, timeout_s=10)
    feed.offer(rewarded("a"), "g")
    unit = feed.offer(rewarded("b"), "g")
    feed.restore(unit, "g")
    assert feed.waiting_groups() == {"g": ["a"]}
    assert [u.session for u in feed.offer(rewarded("b"), "g")] == ["a", "b"]


@pytest.mark.timeout(10)
def test_a_sessions_row_keeps_its_ids_mask_log_probs_and_versions_and_is_tagged_with_its_oldest_version():
    metas = [RowMeta(index=40, group_id=7, group_size=1)]
    columns, out = unit_rows([rewarded("s", reward=0.5, versions=(3, 3, 4, 4))], metas)
    assert columns["response_ids"][0].tolist() == [7, 8, 9, 10] and columns["response_ids"][0].dtype == np.int64
    assert columns["loss_mask"][0].tolist() == [1, 0, 1, 1] and columns["loss_mask"][0].dtype == np.uint8
    assert columns["token_versions"][0].tolist() == [3, 3, 4, 4]
    assert columns["rollout_logp"][0].dtype == np.float32
    assert columns["reward"][0].tolist() == [0.5] and columns["finish"][0].tolist() == [1]
    (m,) = out
    assert (m.index, m.group_id, m.version, m.prompt_len, m.response_len, m.weights_digest, m.step) == (
        40,
        7,
        3,
        2,
        4,
        0xABC,
        -1,
    )
