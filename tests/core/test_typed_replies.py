"""Requests declare their reply type (``Request[R]`` in core/protocol.py): ``ActorRef.ask``
returns it to mypy, and a reply of another type raises a clear error at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import msgspec
import pytest

from asyncflow.core import frames, protocol
from asyncflow.core.actor import Actor, serve_actor
from asyncflow.core.echo import EchoActor
from asyncflow.core.ref import ActorRef, WrongReply
from asyncflow.core.transport import TransportConfig


class _OkForEcho(Actor):
    """Answers an Echo with Ok: the wrong reply type."""

    Inbox = protocol.EchoIn

    def handle(self, msg, pending):
        return protocol.Ok()


@pytest.mark.timeout(30)
def test_a_reply_of_the_declared_type_is_returned_as_is():
    actor = serve_actor(EchoActor, "echo", TransportConfig(scheme="inproc"))
    try:
        reply = ActorRef("echo", actor.address).ask(protocol.Echo(payload=b"hi"))
        assert isinstance(reply, protocol.Echo) and bytes(reply.payload) == b"hi"
    finally:
        actor.stop()


@pytest.mark.timeout(30)
def test_a_reply_of_another_type_raises_naming_the_request_the_expected_and_the_received_type():
    actor = serve_actor(_OkForEcho, "liar", TransportConfig(scheme="inproc"))
    try:
        with pytest.raises(WrongReply, match=r"liar answered Echo with Ok, but Echo is answered with Echo"):
            ActorRef("liar", actor.address).ask(protocol.Echo())
    finally:
        actor.stop()


def test_every_request_names_a_reply_type_that_resolves_to_a_message():
    import asyncflow.actors.runtime.messages  # noqa: F401  (the RL roles' requests, defined above core)

    requests = [
        cls for cls in frames._all_messages(protocol._Msg) if issubclass(cls, protocol.Request) and cls is not protocol.Request
    ]
    assert len(requests) > 40
    for cls in requests:
        replies = protocol.reply_types(cls)
        assert replies, cls.__name__
        assert all(issubclass(r, protocol._Msg) for r in replies), (cls.__name__, replies)


def test_the_reply_type_is_a_class_attribute_and_never_travels_on_the_wire():
    msg = protocol.Lookup(name="rollout.0")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(msg)) == {"type": "Lookup", "name": "rollout.0", "wait_s": 0.0}
    assert protocol.reply_types(protocol.Lookup) == (protocol.Found,)
    assert protocol.reply_types(protocol.Pong) == ()  # a reply, not a request: any answer


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("mypy") is None and not __import__("importlib").util.find_spec("mypy"), reason="needs mypy")
def test_mypy_infers_the_reply_type_of_an_ask(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent("""
        from asyncflow.actors.runtime import messages
        from asyncflow.core import protocol
        from asyncflow.core.ref import ActorRef

        def check(ref: ActorRef) -> None:
            reveal_type(ref.ask(protocol.Lookup(name="x")))
            reveal_type(ref.ask(messages.GetLatestWeights()))
    """)
    )
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports", "--no-incremental", str(probe)],
        capture_output=True,
        text=True,
        timeout=280,
    ).stdout
    assert 'Revealed type is "asyncflow.core.protocol.Found"' in out, out
    assert 'Revealed type is "asyncflow.actors.runtime.messages.WeightsReady"' in out, out


def test_a_reply_of_a_message_module_imported_after_the_first_decode_is_decoded():
    """The any-message decoder of replies is built at the first reply; the RL roles'
    messages (actors/runtime/messages.py) may be imported after it: it is built again."""
    import subprocess
    import sys

    code = (
        "import msgspec\n"
        "from asyncflow.core import frames, protocol\n"
        "assert frames.decode_any(memoryview(msgspec.msgpack.encode(protocol.Ok()))) == protocol.Ok()\n"
        "from asyncflow.actors.runtime import messages\n"
        "msg = messages.Paused(role='reward.0', state=b'x')\n"
        "assert frames.decode_any(memoryview(msgspec.msgpack.encode(msg))) == msg\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
