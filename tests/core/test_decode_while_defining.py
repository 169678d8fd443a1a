"""A reply decoded while another thread is defining a message class (a module of messages
being imported): the any-message decoder waits for the class instead of failing the
reply with msgspec's "isn't fully defined" (seen once as a process failing at start)."""

from __future__ import annotations

import threading

import msgspec
import pytest

from asyncflow.core import frames, protocol

pytestmark = pytest.mark.timeout(30)


def test_a_reply_decoded_while_a_message_class_is_half_defined_waits_for_it(monkeypatch):
    started, release, tried = threading.Event(), threading.Event(), threading.Event()
    build = frames._any_message_decoder

    def spy(generation: int):
        try:
            return build(generation)
        finally:
            tried.set()  # the decode has met the half-defined class (it raised, or waits to retry)

    monkeypatch.setattr(frames, "_any_message_decoder", spy)

    class Blocker(protocol.Message):
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            started.set()  # the subclass exists, msgspec has not finished it
            release.wait(10)

    def define() -> None:
        class Late(Blocker):
            x: int = 0

    definer = threading.Thread(target=define)
    definer.start()
    assert started.wait(10)
    result: list = []
    decoder = threading.Thread(target=lambda: result.append(frames.decode_any(memoryview(msgspec.msgpack.encode(None)))))
    decoder.start()
    assert tried.wait(10)
    release.set()  # the class is finished after the decode first met it half-defined
    decoder.join(10)
    definer.join(10)
    assert result == [None]
