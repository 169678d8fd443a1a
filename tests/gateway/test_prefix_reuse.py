"""The prefix-reuse ledger (gateway/prefix.py): of each turn's prompt tokens, how many
this replica had already run for the session (the KV a prefix cache would hold)."""

import pytest

from asyncflow.gateway.prefix import PrefixLedger


@pytest.mark.timeout(10)
def test_a_first_turn_reuses_nothing_and_the_next_turn_reuses_the_prompt_and_the_reply_but_its_last_token():
    ledger = PrefixLedger(max_sessions=4)
    assert ledger.turn("s", [1, 2, 3], version=0) == 0
    ledger.ran("s", [1, 2, 3], [7, 8, 9], version=0)  # the last reply token was sampled, never run through the model
    assert ledger.turn("s", [1, 2, 3, 7, 8, 9, 4, 5], version=0) == 5
    assert (ledger.prompt_tokens, ledger.reused_tokens, ledger.reused_same_version_tokens) == (11, 5, 5)


@pytest.mark.timeout(10)
def test_a_turn_after_a_weight_swap_counts_as_reused_but_not_at_the_same_version():
    ledger = PrefixLedger(max_sessions=4)
    ledger.turn("s", [1, 2], version=0)
    ledger.ran("s", [1, 2], [3, 4], version=0)
    assert ledger.turn("s", [1, 2, 3, 4, 5], version=1) == 3
    assert (ledger.reused_tokens, ledger.reused_same_version_tokens) == (3, 0)


@pytest.mark.timeout(10)
def test_a_session_this_replica_never_ran_reuses_nothing_and_the_ledger_forgets_the_least_recent_beyond_its_bound():
    ledger = PrefixLedger(max_sessions=2)
    for s in ("a", "b", "c"):
        ledger.turn(s, [1, 2], version=0)
        ledger.ran(s, [1, 2], [3, 4], version=0)
    assert ledger.turn("a", [1, 2, 3, 4, 5], version=0) == 0  # forgotten: "b" and "c" came after it
    assert ledger.turn("c", [1, 2, 3, 4, 5], version=0) == 3
    assert ledger.turn("x", [1, 2, 3], version=0) == 0


@pytest.mark.timeout(10)
def test_only_the_common_prefix_counts_when_a_prompt_does_not_extend_what_ran():
    ledger = PrefixLedger(max_sessions=2)
    ledger.turn("s", [1, 2, 3, 4], version=0)
    ledger.ran("s", [1, 2, 3, 4], [5], version=0)
    assert ledger.turn("s", [1, 2, 9, 9, 9], version=0) == 2
    assert ledger.as_metrics() == {
        "gateway/prompt_tokens": 9.0,
        "gateway/prefix_reused_tokens": 2.0,
        "gateway/prefix_reused_same_version_tokens": 2.0,
    }
