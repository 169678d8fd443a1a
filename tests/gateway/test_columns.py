"""A gateway session's row and a rollout row are built by one column table
(``config/columns.py``): the trainer reads each column in one dtype, whoever wrote it."""

import numpy as np
import pytest

from asyncflow.actors.rollout import pack
from asyncflow.config import columns
from asyncflow.core.protocol import RowMeta
from asyncflow.engines.base import Completion
from asyncflow.gateway import feed

pytestmark = pytest.mark.timeout(10)


def session_row() -> dict[str, np.ndarray]:
    row = {
        "prompt_ids": [5, 6],
        "response_ids": [7, 8, 9],
        "rollout_logp": [-0.5, 0.0, -0.25],
        "loss_mask": [1, 0, 1],
        "token_versions": [3, 3, 4],
        "version": 3,
        "finish": "stop",
        "reward": 0.5,
    }
    unit = [feed.Rewarded(session="s", row=row, digest=0, at_s=0.0)]
    cols, _ = feed.unit_rows(unit, [RowMeta(index=0, group_id=0, group_size=1)])
    return {name: values[0] for name, values in cols.items()}


def rollout_row() -> dict[str, np.ndarray]:
    c = Completion(0, 0, [7, 8, 9], [-0.5, -1.0, -0.25], "stop", 4, token_versions=[3, 4, 4])
    row = pack.completion_row(c, token_versions=True)
    row.update(pack.row(loss_mask=[1, 1, 1], env_reward=1.0, env_error=False, env_tool_calls=2))
    return row


def test_a_session_row_and_a_rollout_row_give_each_shared_column_the_same_dtype():
    session, rollout = session_row(), rollout_row()
    assert set(session) == {"prompt_ids", "response_ids", "rollout_logp", "loss_mask", "token_versions", "finish", "reward"}
    shared = set(session) & set(rollout)
    assert shared == {"response_ids", "rollout_logp", "loss_mask", "token_versions", "finish"}
    assert {n: session[n].dtype for n in shared} == {n: rollout[n].dtype for n in shared}
    for row in (session, rollout):
        assert {n: a.dtype for n, a in row.items()} == {n: np.dtype(columns.DTYPES[n]) for n in row}
        assert all(row[n].shape == (1,) for n in row if n in columns.SCALARS)
    assert session["finish"].tolist() == [1] and session["reward"].tolist() == [0.5]


def test_the_gateway_and_the_rollout_keep_no_column_table_of_their_own():
    assert pack.row is columns.row
    assert not hasattr(feed, "DTYPES") and not hasattr(pack, "DTYPES")


def test_an_unknown_column_is_refused_with_a_message_naming_the_known_columns():
    with pytest.raises(KeyError, match=r"no rollout column \['rewards'\]") as refused:
        columns.row(rewards=1.0)
    assert all(f"'{name}'" in str(refused.value) for name in columns.DTYPES)
