"""Resent requests are served once (core/replay.py, core/retry.py): an actor that finds
several copies of one request (same sender and number) runs its handler once and
answers every copy with that answer; a caller resends to a peer that does not answer
until it does, and gives up with PeerFrozen after the freeze timeout."""

from __future__ import annotations

import logging
import threading

import pytest

from asyncflow.core import protocol, retry
from asyncflow.core.actor import Actor, serve_actor
from asyncflow.core.errors import ActorTimeout, PeerFrozen
from asyncflow.core.ref import ActorRef
from asyncflow.core.replay import ANSWERED, NEW, STALE, WAITING, ReplayCache
from asyncflow.core.transport import TransportConfig


def test_the_cache_serves_a_request_once_and_answers_every_copy_with_its_answer():
    cache = ReplayCache(max_senders=2)
    assert cache.begin("a", 1, "ctx1") == (NEW, None)
    assert cache.begin("a", 1, "ctx2") == (WAITING, None)  # a copy while the first is served
    assert cache.answered("a", 1, b"reply") == ["ctx2"]  # it gets the answer with the first
    assert cache.begin("a", 1, "ctx3") == (ANSWERED, b"reply")  # a later copy: the same answer
    assert cache.begin("a", 2, "ctx4") == (NEW, None)  # the sender's next request drops the old answer
    assert cache.begin("a", 1, "ctx5") == (STALE, None)
    assert cache.answered("a", 1, b"late") == []  # an answer of an older request is not kept
    assert cache.begin("b", 1, "x") == (NEW, None)
    assert cache.begin("c", 1, "x") == (NEW, None)  # a third sender: the least recently seen ("a") goes
    assert len(cache) == 2 and cache.begin("a", 2, "x") == (NEW, None)


class _Counter(Actor):
    """Counts what it handles; its first Echo blocks until ``release`` is set (a frozen peer)."""

    Inbox = protocol.EchoIn

    def __init__(self, ctx, release: threading.Event, started: threading.Event, handled: list[bytes]):
        super().__init__(ctx)
        self.release, self.started, self.handled = release, started, handled

    def handle(self, msg, pending):
        self.handled.append(bytes(msg.payload))
        if len(self.handled) == 1:
            self.started.set()
            self.release.wait(30)
        return protocol.Echo(payload=str(len(self.handled)).encode())


@pytest.fixture
def counter():
    release, started, handled = threading.Event(), threading.Event(), []
    transport = TransportConfig(scheme="inproc", ask_timeout_s=0.2, freeze_timeout_s=30)
    served = serve_actor(_Counter, "counter", transport, release=release, started=started, handled=handled)
    yield served, ActorRef("counter", served.address, transport), release, started, handled
    release.set()
    served.stop()


@pytest.mark.timeout(30)
def test_copies_of_one_request_run_the_handler_once_and_get_the_same_answer(counter):
    _, ref, release, _, handled = counter
    release.set()
    first = ref.ask(protocol.Echo(payload=b"x"), sender="s1", seq=7)
    again = ref.ask(protocol.Echo(payload=b"x"), sender="s1", seq=7)
    assert bytes(first.payload) == bytes(again.payload) == b"1"
    ref.tell(protocol.Echo(payload=b"t"), sender="s1", seq=8)
    ref.tell(protocol.Echo(payload=b"t"), sender="s1", seq=8)  # a resent notice: delivered once
    after = ref.ask(protocol.Echo(payload=b"y"), sender="s1", seq=9)
    assert bytes(after.payload) == b"3"
    assert handled == [b"x", b"t", b"y"]


@pytest.mark.timeout(30)
def test_a_request_to_a_peer_that_does_not_answer_is_resent_until_it_does_and_served_once(counter):
    served, ref, release, started, handled = counter
    resent = threading.Event()

    class _OnResend(logging.Handler):
        def emit(self, record):
            if "sending it again" in record.getMessage():
                resent.set()

    handler = _OnResend()
    logging.getLogger("asyncflow.core.retry").addHandler(handler)
    try:
        out: list = []
        asker = threading.Thread(target=lambda: out.append(retry.ask(ref, protocol.Echo(payload=b"z"))))
        asker.start()
        assert started.wait(10) and resent.wait(10)  # the handler holds the first copy; a second was sent
        release.set()
        asker.join(10)
    finally:
        logging.getLogger("asyncflow.core.retry").removeHandler(handler)
    assert [bytes(r.payload) for r in out] == [b"1"]
    assert handled == [b"z"]  # every copy answered by the one run of the handler
    assert served.num_replayed >= 1


@pytest.mark.timeout(30)
def test_a_peer_that_answers_none_of_the_copies_fails_with_peer_frozen_naming_the_timeout(counter):
    _, ref, _, started, _ = counter
    with pytest.raises(PeerFrozen, match=r"answered none of the copies of Echo .*freeze_timeout_s = 1\b"):
        retry.ask(ref, protocol.Echo(payload=b"z"), freeze_timeout_s=1.0)
    assert started.is_set()
    with pytest.raises(ActorTimeout):  # freeze_timeout_s = 0: sent once
        retry.ask(ref, protocol.Echo(payload=b"w"), freeze_timeout_s=0)


def test_the_config_refuses_a_freeze_timeout_shorter_than_the_ask_timeout():
    with pytest.raises(ValueError, match=r"freeze_timeout_s = 5 is shorter than ask_timeout_s = 10"):
        TransportConfig(ask_timeout_s=10, freeze_timeout_s=5).validate()
