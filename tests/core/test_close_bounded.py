"""A socket whose nng_close never returns (an nng deadlock: nanomsg/nng #1813) must not
hang the actor that stops it: ``close_socket`` gives up after ``CLOSE_WAIT_S``, and a
send on one of its contexts afterwards raises Closed instead of touching it."""

from __future__ import annotations

import threading

import pynng
import pytest

from asyncflow.core import _nngio


@pytest.mark.timeout(30)
def test_a_close_that_never_returns_is_given_up_and_later_sends_raise_closed(monkeypatch):
    monkeypatch.setattr(_nngio, "CLOSE_WAIT_S", 0.2)
    sock = pynng.Rep0(listen="inproc://close-bounded")
    ctx = _nngio.new_context(sock)
    release, real_close = threading.Event(), sock.close

    def hung_close():  # what nng_close does in the deadlock: wait for what never comes
        release.wait()
        real_close()

    sock.close = hung_close  # type: ignore[method-assign]
    done = threading.Event()
    threading.Thread(target=lambda: (_nngio.close_socket(sock), done.set()), daemon=True).start()
    try:
        assert done.wait(10), "close_socket hung with nng_close"
        with pytest.raises(pynng.Closed):
            _nngio.send(ctx, bytearray(b"late"))
    finally:
        release.set()  # let the background close finish
