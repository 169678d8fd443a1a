"""Timer values are checked at the wire: a wait, timeout or delay outside 0 to
``MAX_WAIT_S`` in a message is refused when it is decoded (a ``rejected`` reply naming
the field and the range), so it never reaches the process's timers. One far deadline
used to end the one timer thread every actor of a process shares: no later wait of that
process ever timed out. Over real sockets, to a queue (and an echo actor) in a process of
their own; the config keys that feed timers have the same bound."""

from __future__ import annotations

import math

import msgspec
import pytest

from asyncflow.core import protocol
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.errors import RemoteError
from asyncflow.core.host import spawn_host
from asyncflow.core.tq.client import TQClient
from asyncflow.core.tq.errors import QueueFull
from asyncflow.core.tq.launch import queue_specs
from asyncflow.core.transport import TransportConfig

FAR = 9.3e9
"""Past the longest wait a thread can be told (``threading.TIMEOUT_MAX``, about 9.2e9 s)."""


@pytest.fixture
def queue_process(tmp_path):
    """A queue (capacity 4 rows) and an echo actor in one process host, over tcp with a
    secret: a directory client and a queue client."""
    transport = TransportConfig(scheme="tcp", secret="the-secret", ipc_dir=str(tmp_path / "ipc"))
    directory = start_directory(transport)
    dc = DirectoryClient(directory.address, transport)
    specs = queue_specs(["rollout"], capacity_rows=4).all()
    host = spawn_host("queue", dc, transport, [*specs, protocol.ActorSpec(name="echo", cls="asyncflow.core.echo:EchoActor")])
    tq = TQClient(DirectoryClient(directory.address, transport), reserve_rows=0)
    yield dc, tq
    tq.close()
    host.stop()
    directory.stop()


def refused(ref, msg, field: str) -> None:
    """``msg`` is refused as it is decoded, naming ``field`` and the bound."""
    with pytest.raises(RemoteError) as info:
        ref.ask(msg, timeout_s=10)
    assert info.value.kind == "rejected" and f"$.{field}" in str(info.value), info.value
    assert f"<= {protocol.MAX_WAIT_S}" in str(info.value), info.value


@pytest.mark.timeout(120)
def test_a_far_timer_value_is_refused_and_the_receiving_process_keeps_its_timers(queue_process):
    dc, tq = queue_process
    controller, manager, echo = dc.ref("tq.controller.rollout"), dc.ref("tq.manager"), dc.ref("echo")
    wait_for_rows = dict(consumer="c", columns=["prompt_ids"], batch_size=4, partial=True, min_rows=4, incarnation="i")
    refused(controller, protocol.GetBatch(**wait_for_rows, timeout_s=FAR), "timeout_s")
    refused(manager, protocol.Allocate(num_groups=8, timeout_s=FAR), "timeout_s")
    refused(echo, protocol.Echo(payload=b"x", delay_s=FAR), "delay_s")
    refused(dc._ref, protocol.Lookup(name="nobody", wait_s=FAR), "wait_s")  # the directory (this process)
    # the process's timers still fire: a delayed answer, a get and an allocation that time out
    assert bytes(echo.ask(protocol.Echo(payload=b"y", delay_s=0.05), timeout_s=30).payload) == b"y"
    assert tq.get_meta("rollout", ["prompt_ids"], 4, partial=True, min_rows=4, timeout_s=0.2).indices == []
    tq.allocate(1, 4, timeout_s=0.2)  # the queue is full now
    with pytest.raises(QueueFull):
        tq.allocate(1, 4, timeout_s=0.2)


WIRE_TIMERS = [
    (protocol.GetBatch, "timeout_s", {"consumer": "c", "columns": [], "batch_size": 1}),
    (protocol.Allocate, "timeout_s", {"num_groups": 1}),
    (protocol.Lookup, "wait_s", {"name": "x"}),
    (protocol.Echo, "delay_s", {}),
]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("cls,field,rest", WIRE_TIMERS, ids=[f"{c.__name__}.{f}" for c, f, _ in WIRE_TIMERS])
@pytest.mark.parametrize("value", [FAR, math.inf, math.nan, -1.0, protocol.MAX_WAIT_S * 1.001])
def test_every_timer_field_of_a_message_refuses_a_value_outside_its_range(cls, field, rest, value):
    body = msgspec.msgpack.encode({"type": cls.__name__, **rest, field: value})
    with pytest.raises(msgspec.ValidationError):
        msgspec.msgpack.decode(body, type=cls)
    for fine in (0.0, protocol.MAX_WAIT_S):
        assert (
            getattr(msgspec.msgpack.decode(msgspec.msgpack.encode({"type": cls.__name__, **rest, field: fine}), type=cls), field)
            == fine
        )


TIMER_NAMES = ("timeout_s", "wait_s", "delay_s", "deadline_s", "after_s", "every_s", "backoff_s")


@pytest.mark.timeout(10)
def test_every_wire_field_named_for_a_timer_is_bounded():
    """A message added later with a timeout, wait or delay field gets the bound too."""
    import asyncflow.actors.runtime.messages  # noqa: F401  # the RL roles' messages, on the same base
    from asyncflow.core.schema import field_info

    def messages(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from messages(sub)

    unbounded = []
    for cls in {*messages(protocol.Message), protocol.Header}:
        for name in cls.__struct_fields__:
            t = field_info(cls, name).type
            if name.endswith(TIMER_NAMES) and isinstance(t, msgspec.inspect.FloatType):
                if t.ge is None or t.le is None or t.le > 2 * protocol.MAX_WAIT_S:
                    unbounded.append(f"{cls.__name__}.{name}")
    assert unbounded == [], f"use protocol.Wait for {unbounded}"


@pytest.mark.timeout(30)
def test_the_timer_thread_outlives_a_far_deadline_and_a_timer_that_raises():
    import threading
    import time

    from asyncflow.core.actor import _Scheduler

    timers, fired = _Scheduler(), threading.Event()

    def fails() -> None:
        raise RuntimeError("a timer that fails")

    timers.call_at(time.monotonic() + FAR, fired.set)  # the earliest when the thread starts
    timers.call_at(time.monotonic(), fails)
    timers.call_at(time.monotonic() + 0.05, fired.set)
    assert fired.wait(20)


WINDOWS = {"GatewayConfig.session_move_after_s"}
"""Keys named like timers that only compare times (a huge value means "forever", as its
description says): no timer waits on them."""


@pytest.mark.timeout(10)
def test_every_config_key_that_feeds_a_timer_is_bounded_and_a_far_one_is_refused_naming_the_key():
    from asyncflow.config.load import load_config_text
    from asyncflow.config.roles import RoleEntry
    from asyncflow.config.run import RunConfig
    from asyncflow.core.schema import ConfigError, field_info, struct_types

    unbounded, seen = [], set()

    def walk(cls):
        if cls in seen:
            return
        seen.add(cls)
        for name in cls.__struct_fields__:
            t = field_info(cls, name).type
            t = t.type if isinstance(t, msgspec.inspect.Metadata) else t
            key = f"{cls.__name__}.{name}"
            if name.endswith(TIMER_NAMES) and isinstance(t, msgspec.inspect.FloatType) and key not in WINDOWS:
                if t.le is None or t.le > protocol.MAX_WAIT_S:
                    unbounded.append(key)
            for sub in struct_types(__import__("typing").get_type_hints(cls, include_extras=True)[name]):
                walk(sub)

    walk(RunConfig)
    walk(RoleEntry)
    assert unbounded == []
    with pytest.raises(ConfigError) as info:
        load_config_text("[cluster.transport]\nask_timeout_s = 9.3e9")
    assert f"cluster.transport.ask_timeout_s = 9300000000.0: out of range; use a value > 0 and <= {protocol.MAX_WAIT_S}" in str(
        info.value
    )
