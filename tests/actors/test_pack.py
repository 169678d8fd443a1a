"""The rollout's output columns are packed in one place, with one dtype each
(actors/rollout/pack.py)."""

import numpy as np
import pytest

from asyncflow.actors.rollout import pack
from asyncflow.engines.base import Completion

pytestmark = pytest.mark.timeout(10)


def test_a_completion_packs_into_the_columns_the_trainer_reads_with_their_dtypes():
    c = Completion(
        prompt_index=0,
        sample_index=1,
        response_ids=[5, 6, 2],
        logprobs=[-0.5, -1.0, -0.1],
        finish_reason="stop",
        version=3,
        token_versions=[2, 3, 3],
    )
    row = pack.completion_row(c, token_versions=True)
    assert {k: (v.dtype, v.shape) for k, v in row.items()} == {
        "response_ids": (np.dtype(np.int64), (3,)),
        "rollout_logp": (np.dtype(np.float32), (3,)),
        "finish": (np.dtype(np.uint8), (1,)),
        "token_versions": (np.dtype(np.int32), (3,)),
    }
    assert row["finish"][0] == 1 and row["token_versions"].tolist() == [2, 3, 3]
    cut = pack.completion_row(Completion(0, 0, [7], [-2.0], "length", 3))
    assert cut["finish"][0] == 0 and "token_versions" not in cut
    assert pack.columns([row, row])["response_ids"][1].tolist() == [5, 6, 2]


def test_a_column_with_no_dtype_here_is_refused_by_name():
    with pytest.raises(KeyError, match="no rollout column \\['rewards'\\]"):
        pack.row(rewards=1.0)
