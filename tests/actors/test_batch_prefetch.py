"""BatchPrefetch (actors/trainer/_prefetch.py): the trainer's next request, sent from a thread."""

from __future__ import annotations

import threading

import pytest

from asyncflow.actors.trainer._prefetch import BatchPrefetch
from asyncflow.core import protocol


def _meta(step: int) -> protocol.BatchMeta:
    return protocol.BatchMeta(task="train", indices=[step], metas=[], shards=[])


def test_the_request_runs_in_the_background_and_its_batch_is_taken_for_its_step():
    asked = threading.Event()
    release = threading.Event()
    calls = []

    def take(step, ack):
        calls.append((step, list(ack), threading.current_thread().name))
        asked.set()
        assert release.wait(10)
        return _meta(step)

    p = BatchPrefetch(take, "trainer")
    p.start(3, [7, 8])
    assert asked.wait(10)  # sent at once, before anyone waits for it
    assert p.pending
    release.set()
    meta = p.take(3)
    assert meta is not None and meta.indices == [3]
    assert calls == [(3, [7, 8], "trainer-prefetch")]
    assert not p.pending and p.take(4) is None  # nothing in flight: ask yourself


def test_a_poll_that_timed_out_gives_none_and_an_error_is_raised_in_the_taker():
    p = BatchPrefetch(lambda step, ack: None, "trainer")
    p.start(1, [])
    assert p.take(1) is None

    def boom(step, ack):
        raise ConnectionError("controller gone")

    p = BatchPrefetch(boom, "trainer")
    p.start(2, [])
    with pytest.raises(ConnectionError, match="controller gone"):
        p.take(2)
    assert not p.pending


def test_a_request_for_a_later_step_stays_in_flight_and_starting_twice_is_refused():
    release = threading.Event()
    p = BatchPrefetch(lambda step, ack: (release.wait(10), _meta(step))[1], "trainer")
    p.start(5, [])
    with pytest.raises(RuntimeError, match="still in flight"):
        p.start(6, [])
    assert p.take(4) is None and p.pending  # step 4's refill round is asked for apart; 5's request waits
    release.set()
    meta = p.take(5)
    assert meta is not None and meta.indices == [5]
    p.close()
