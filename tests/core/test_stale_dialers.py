"""A process keeps no client socket to an actor's old address once it has learnt the
actor's new one. Every restarted actor listens at a fresh address (pid and counter in
its ipc path, a new tcp port), so a cached nng dialer to the old one redials an address
nobody listens on, every 20-500 ms, for the rest of the process: one more such dialer
in the trainer, the supervisor and the driver's heartbeat after each restart."""

from __future__ import annotations

import pytest

from asyncflow.actors.driver._heartbeat import Heartbeat
from asyncflow.core import protocol, ref
from asyncflow.core.actor import serve_actor
from asyncflow.core.directory import DirectoryClient, start_directory
from asyncflow.core.echo import EchoActor
from asyncflow.core.transport import TransportConfig


def _cached(address: str) -> bool:
    return any(key[0] == address for key in ref._sockets)


@pytest.fixture
def transport(tmp_path):
    return TransportConfig(scheme="ipc", ipc_dir=str(tmp_path))


@pytest.mark.timeout(30)
def test_a_refresh_that_finds_a_new_address_closes_the_socket_to_the_old_one(transport):
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    first = serve_actor(EchoActor, "echo", transport)
    second = None
    try:
        client.register(first.entry())
        assert client.ref("echo").ask(protocol.Ping()).pid > 0
        assert _cached(first.address)
        first.stop()  # the actor dies; its successor registers under the same name
        second = serve_actor(EchoActor, "echo", transport)
        client.register(second.entry())
        fresh = client.ref("echo", refresh=True)
        assert fresh.address == second.address != first.address
        assert not _cached(first.address), "the dialer to the dead instance is still cached"
        assert fresh.ask(protocol.Ping()).pid > 0
        # a refresh that finds the same address keeps the socket
        sock = ref._sockets[(second.address, transport.max_message_bytes, transport.tls_dir)]
        assert client.ref("echo", refresh=True).address == second.address
        assert ref._sockets[(second.address, transport.max_message_bytes, transport.tls_dir)] is sock
        # unregistering a name closes this process's socket to it
        client.unregister("echo", second.address)
        assert not _cached(second.address)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        directory.stop()


@pytest.mark.timeout(30)
def test_the_heartbeat_closes_its_socket_to_a_host_it_rewatches_elsewhere_or_forgets(transport):
    first, second = serve_actor(EchoActor, "host.h", transport), serve_actor(EchoActor, "host.h", transport)
    beat = Heartbeat(transport, interval_s=1.0, lost_after_s=5.0)
    try:
        beat.watch("h", "host.h", first.address)
        beat._ping("h", beat._refs["h"])
        assert _cached(first.address)
        beat.watch("h", "host.h", second.address)  # restarted: a new process, a new address
        assert not _cached(first.address), "the heartbeat's dialer to the old host is still cached"
        beat._ping("h", beat._refs["h"])
        assert _cached(second.address) and beat.lost() == {}
        beat.forget("h")
        assert not _cached(second.address)
    finally:
        first.stop()
        second.stop()


@pytest.mark.timeout(30)
def test_a_call_on_a_socket_another_thread_just_closed_says_the_actor_is_gone(transport, monkeypatch):
    """The race the closes above open: a thread takes the cached socket of an address, and
    before it opens its context there another thread closes that socket (a refresh found
    the actor elsewhere). The call must fail as ActorGone, which callers handle, not with
    pynng's own Closed, which no caller expects."""
    from asyncflow.core.errors import ActorGone

    address = f"ipc://{transport.ipc_dir}/gone.sock"
    sock = ref._socket_for(address, transport)
    ref.close_sockets(address.__eq__)
    monkeypatch.setattr(ref, "_socket_for", lambda address, config: sock)  # taken just before the close
    with pytest.raises(ActorGone, match="'echo' at ipc://.*gone.sock went away during Ping"):
        ref.ActorRef("echo", address, transport).ask(protocol.Ping(), timeout_s=1.0)
