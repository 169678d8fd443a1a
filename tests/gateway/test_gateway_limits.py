"""What a hostile or careless client cannot do to the gateway:
fill its session store for good with anonymous requests, break a reply with an odd
session id, or fill the log with tracebacks by hanging up mid-upload."""

from __future__ import annotations

import json
import socket
import urllib.parse

import pytest
from gateway_helpers import call

from asyncflow.gateway.sessions import RequestError, SessionStore, Trajectory

pytestmark = pytest.mark.timeout(60)

HELLO = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def chat(gw, body: dict | str, session: str | None = None) -> tuple[int, dict]:
    """A raw chat request; ``session`` in the X-Session-Id header, percent-free bytes as given."""
    host, port = urllib.parse.urlsplit(gw.url).netloc.split(":")
    data = (body if isinstance(body, str) else json.dumps(body)).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\nConnection: close\r\n"
    raw = head.encode() + (b"X-Session-Id: " + session.encode("utf-8") + b"\r\n" if session is not None else b"") + b"\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(raw + data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    status = int(reply.split(b" ", 2)[1])
    return status, json.loads(reply.split(b"\r\n\r\n", 1)[1] or b"{}")


def test_anonymous_sessions_make_room_for_new_ones_and_named_open_ones_are_kept(make_gateway):
    gw = make_gateway(max_sessions=3)
    assert chat(gw, HELLO, session="agent-a")[0] == 200  # a named, open session
    for _ in range(6):  # twice as many anonymous requests as the store holds
        status, body = chat(gw, HELLO)
        assert status == 200, body
    assert "agent-a" in call(gw.url, "/v1/asyncflow/sessions")[1]["sessions"]  # never dropped for an anonymous one
    assert chat(gw, HELLO, session="agent-b")[0] == 200  # a new named session still gets in
    assert gw.sessions.dropped == 5
    # only named open sessions left: the store is full for good, and says what to do
    assert chat(gw, HELLO, session="agent-c")[0] == 200
    status, body = chat(gw, HELLO, session="agent-d")
    assert status == 429 and "named sessions are open" in body["error"]["message"]


def test_the_store_drops_an_anonymous_session_only_while_it_takes_no_turn():
    store = SessionStore(max_sessions=1)
    store.reserve("anon-1", anonymous=True)
    busy = Trajectory(session="anon-1", prompt_ids=[1])
    store.add(busy)
    with busy.lock:  # taking a turn
        with pytest.raises(RequestError) as info:
            store.reserve("anon-2", anonymous=True)
        assert info.value.status == 429
    store.reserve("anon-2", anonymous=True)
    assert store.lookup("anon-1") is None


def test_a_store_restored_over_max_sessions_makes_room_only_when_it_can_get_below_it():
    """A restore keeps every session (``max_sessions`` lowered since); a new one then needs the
    store back below ``max_sessions``: an anonymous session is dropped for nothing only if that
    is enough, and each one dropped is named so the journal can record it."""
    store = SessionStore(max_sessions=2)
    for session, anonymous in (("anon-1", True), ("named", False), ("anon-2", True), ("anon-3", True)):
        store.restore(Trajectory(session=session, prompt_ids=[1]), anonymous=anonymous)
    assert store.reserve("anon-4", anonymous=True) == ["anon-1", "anon-2", "anon-3"]
    store.add(Trajectory(session="anon-4", prompt_ids=[1]))
    store.restore(Trajectory(session="named-2", prompt_ids=[1]))  # now "named", "anon-4", "named-2"
    with pytest.raises(RequestError) as info:
        store.reserve("named-3")
    assert info.value.status == 429 and store.ids() == ["named", "anon-4", "named-2"]  # nothing dropped in vain


@pytest.mark.parametrize(
    "session", ["agent-€", "agent-😀", "a" * 129, "agent\t1", " agent", "agent/1", "agent\r\nX-Evil: 1", "agent\x00"]
)
def test_an_unusable_session_id_is_a_400_naming_the_rule_and_nothing_is_recorded(make_gateway, session):
    gw = make_gateway()
    status, body = chat(gw, {**json.loads(HELLO), "user": session})
    assert status == 400 and "use 1 to 128 printable ASCII characters, no '/'" in body["error"]["message"], body
    assert call(gw.url, "/v1/asyncflow/sessions")[1]["sessions"] == [] and gw.engine.prompts == []
    assert chat(gw, HELLO, session="agent-€")[0] == 400  # the header too (sent as UTF-8 bytes)


def test_a_free_text_user_field_is_a_session_id_and_its_header_comes_back_unchanged(make_gateway):
    gw = make_gateway()
    status, _ = chat(gw, {**json.loads(HELLO), "user": "what is 3*3? (ann@example.org)"})
    assert status == 200
    assert call(gw.url, "/v1/asyncflow/sessions")[1]["sessions"] == ["what is 3*3? (ann@example.org)"]


def test_a_client_that_hangs_up_mid_upload_costs_one_log_line(make_gateway, caplog):
    gw = make_gateway()
    host, port = urllib.parse.urlsplit(gw.url).netloc.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b"Content-Length: 100000\r\n\r\n" + b'{"model": "m", "messages": [')
    assert chat(gw, HELLO)[0] == 200  # served after the hang-up: the server went on
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_a_request_body_over_the_limit_is_a_413_by_its_length_or_as_it_streams(make_gateway):
    gw = make_gateway(max_request_bytes=4096)
    huge = {"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}
    status, body = chat(gw, huge)  # a Content-Length over the limit: refused before a byte is read
    assert status == 413 and "max_request_bytes" in body["error"]["message"], body
    host, port = urllib.parse.urlsplit(gw.url).netloc.split(":")
    data = json.dumps(huge).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:  # chunked: no length to read first
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        s.sendall(b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
        for i in range(0, len(data), 1000):
            part = data[i : i + 1000]
            try:
                s.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            except OSError:  # the server answered and closed while the body was still coming
                break
        reply = b""
        try:
            while chunk := s.recv(65536):
                reply += chunk
        except ConnectionResetError:  # the server closed on an unread body: the kernel may reset before the 413 is read
            pass
    assert reply == b"" or reply.split(b" ", 2)[1] == b"413", reply[:200]
    assert gw.engine.prompts == [] and call(gw.url, "/v1/asyncflow/sessions")[1]["sessions"] == []
    assert chat(gw, HELLO)[0] == 200  # and the next request is served


class Tokenised:
    """The real tokenizer, recording the length of every text it is asked to tokenise."""

    def __init__(self, inner):
        self.inner, self.lengths = inner, []

    def __call__(self, text, **kw):
        self.lengths.append(len(text))
        return self.inner(text, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


TINY_CONTEXT = 512  # the tiny model's max_position_embeddings


def test_a_request_surely_longer_than_the_context_is_a_413_before_it_is_tokenised(make_gateway, tokenizer):
    spy = Tokenised(tokenizer)
    gw = make_gateway(tokenizer=spy, context_tokens=TINY_CONTEXT)
    huge = {"model": "m", "messages": [{"role": "user", "content": "1" * 500_000}]}  # under max_request_bytes
    status, body = chat(gw, huge)
    message = body["error"]["message"]
    assert status == 413 and f"context of {TINY_CONTEXT} tokens" in message and "max_position_embeddings" in message, body
    assert max(spy.lengths, default=0) < 10_000 and gw.engine.prompts == []  # never tokenised, never generated
    # a later turn of a session is bounded the same way
    first = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body = chat(gw, first, session="agent-a")
    assert status == 200, body
    reply = body["choices"][0]["message"]["content"]
    later = {**first, "messages": [*first["messages"], {"role": "assistant", "content": reply}, huge["messages"][0]]}
    spy.lengths.clear()
    status, body = chat(gw, later, session="agent-a")
    assert status == 413 and "max_position_embeddings" in body["error"]["message"], body
    assert max(spy.lengths, default=0) < 10_000


def test_a_request_past_the_context_once_tokenised_is_a_400_naming_the_context_and_max_tokens(make_gateway):
    gw = make_gateway(context_tokens=TINY_CONTEXT)
    long = {"model": "m", "messages": [{"role": "user", "content": "1" * 600}]}  # passes the bound, not the context
    status, body = chat(gw, long)
    message = body["error"]["message"]
    assert status == 400 and f"context of {TINY_CONTEXT} tokens" in message and "max_tokens" in message, body
    assert gw.engine.prompts == []  # refused before the engine
    fits = {"model": "m", "messages": [{"role": "user", "content": "1" * 400}], "max_tokens": 4}
    assert chat(gw, fits)[0] == 200
