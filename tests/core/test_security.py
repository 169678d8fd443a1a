"""Transport and run-directory security: secret files, ipc
directory checks, IPv6 loopback, receive limits, TLS."""

from __future__ import annotations

import json
import stat

import msgspec
import pytest
from tiny_config import tiny_config_text

from asyncflow.config.load import load_config_text

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cr3t-for-the-test"


def _config_with_secret(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    from asyncflow.toy.tasks import make_task_model

    make_task_model(tmp_path / "model", warm_start_steps=0)  # preflight loads its tokenizer
    text = tiny_config_text(
        {"data": {"path": str(tmp_path / "data.jsonl")}, "model": {"path": str(tmp_path / "model")}},
        extra=f'\n[cluster.transport]\nsecret = "{SECRET}"\n',
    )
    return load_config_text(text)


def test_the_run_directory_keeps_the_secret_out_of_config_json_and_in_a_file_of_mode_0600(tmp_path):
    from asyncflow.actors.driver.prepare import prepare_new

    cfg = _config_with_secret(tmp_path)
    _, rd, _ = prepare_new(cfg, tmp_path / "run")
    config_text = (rd / "config.json").read_text()
    assert SECRET not in config_text
    assert json.loads(config_text)["cluster"]["transport"]["secret"] == ""
    secret_file = rd / "secret"
    assert secret_file.read_text() == SECRET
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600


def test_a_resumed_run_takes_its_secret_back_from_the_secret_file(tmp_path):
    from asyncflow.actors.driver.prepare import prepare_new, read_run_config

    cfg = _config_with_secret(tmp_path)
    _, rd, _ = prepare_new(cfg, tmp_path / "run")
    assert read_run_config(rd).cluster.transport.secret == SECRET


def test_a_loopback_tcp_run_without_a_secret_gets_its_own_and_its_hosts_refuse_frames_without_it(tmp_path, monkeypatch):
    """Loopback tcp with neither secret nor TLS: any local user could stop a process host.
    The run now makes a random secret of its own (RUN_DIR/secret,
    0600), its hosts require it, and `afctl status` reads it from there."""
    from asyncflow.actors.driver import cluster_file as _cluster_file
    from asyncflow.actors.driver.prepare import prepare_new, read_run_config
    from asyncflow.core import protocol
    from asyncflow.core.directory import DirectoryClient, start_directory
    from asyncflow.core.errors import Unauthorized
    from asyncflow.core.host import spawn_host
    from asyncflow.core.ref import ActorRef
    from asyncflow.core.transport import SECRET_ENV

    monkeypatch.delenv(SECRET_ENV, raising=False)
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    from asyncflow.toy.tasks import make_task_model

    make_task_model(tmp_path / "model", warm_start_steps=0)
    cfg = load_config_text(
        tiny_config_text(
            {"data": {"path": str(tmp_path / "data.jsonl")}, "model": {"path": str(tmp_path / "model")}},
            extra='\n[cluster.transport]\nscheme = "tcp"\nbind_host = "127.0.0.1"\n',
        )
    )
    assert cfg.cluster.transport.secret == ""
    cfg, rd, _ = prepare_new(cfg, tmp_path / "run")
    secret = cfg.cluster.transport.secret
    assert len(secret) == 32 and (rd / "secret").read_text() == secret
    assert stat.S_IMODE((rd / "secret").stat().st_mode) == 0o600 and secret not in (rd / "config.json").read_text()
    assert read_run_config(rd).cluster.transport.secret == secret  # a resume keeps it

    transport = cfg.cluster.transport
    directory = start_directory(transport)
    client = DirectoryClient(directory.address, transport)
    host = spawn_host("h", client, transport)
    try:
        address = client.lookup("host.h", wait_s=30).address
        no_secret = msgspec.structs.replace(transport, secret="")
        with pytest.raises(Unauthorized):
            ActorRef("host.h", address, no_secret).ask(protocol.Stop(), timeout_s=5)
        assert host.alive()
        (rd / "cluster.json").write_bytes(
            msgspec.json.encode(
                _cluster_file.ClusterFile(
                    run_dir=str(rd), directory=directory.address, transport=no_secret, driver_pid=0, started_at=0.0
                )
            )
        )
        assert _cluster_file.read(rd).transport.secret == secret  # what `afctl status RUN_DIR` uses
    finally:
        host.stop(timeout_s=5)
        directory.stop()


def test_an_ipc_directory_writable_by_others_is_refused_with_the_key_to_change(tmp_path):
    from asyncflow.core.transport import TransportConfig, new_address

    shared = tmp_path / "ipc"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match=r"\[cluster.transport\] ipc_dir.*0777"):
        new_address(TransportConfig(scheme="ipc", ipc_dir=str(shared)), "echo")


def test_an_ipc_directory_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    import os

    from asyncflow.core import transport

    private = tmp_path / "ipc"
    private.mkdir(mode=0o700)
    monkeypatch.setattr(transport.os, "getuid", lambda: os.stat(private).st_uid + 1)  # we are someone else
    with pytest.raises(PermissionError, match=r"owned by uid"):
        transport.new_address(transport.TransportConfig(scheme="ipc", ipc_dir=str(private)), "echo")


def test_a_private_ipc_directory_is_used(tmp_path):
    from asyncflow.core.transport import TransportConfig, new_address

    private = tmp_path / "ipc"
    private.mkdir(mode=0o700)
    assert new_address(TransportConfig(scheme="ipc", ipc_dir=str(private)), "echo").startswith(f"ipc://{private}/")


def _has_ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this kernel has no IPv6 loopback")
def test_an_actor_bound_on_the_ipv6_loopback_answers_over_tcp():
    from asyncflow.core import protocol
    from asyncflow.core.actor import serve_actor
    from asyncflow.core.echo import EchoActor
    from asyncflow.core.ref import ActorRef
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme="tcp", bind_host="::1", secret=SECRET)
    served = serve_actor(EchoActor, "echo", transport)
    try:
        assert served.address.startswith("tcp://[::1]:")
        assert ActorRef("echo", served.address, transport).ask(protocol.Echo(payload=b"v6"), timeout_s=5).payload == b"v6"
    finally:
        served.stop()


# -- TLS (tls+tcp://, mutual authentication) -------------------------------------------


@pytest.fixture(scope="module")
def cluster_certs(tmp_path_factory):
    pytest.importorskip("cryptography")
    from asyncflow.core.tls import make_cluster_certs

    return make_cluster_certs(tmp_path_factory.mktemp("certs") / "tls")


@pytest.fixture
def tls_echo(cluster_certs):
    from asyncflow.core.actor import serve_actor
    from asyncflow.core.echo import EchoActor
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme="tcp", tls_dir=str(cluster_certs))
    served = serve_actor(EchoActor, "echo", transport)
    yield served, transport
    served.stop()


def test_afctl_certs_writes_the_keys_at_mode_0600(tmp_path):
    pytest.importorskip("cryptography")
    from click.testing import CliRunner

    from asyncflow.cli.main import main

    result = CliRunner().invoke(main, ["certs", str(tmp_path / "tls")])
    assert result.exit_code == 0, result.output
    for name in ("ca.key", "node.key"):
        assert stat.S_IMODE((tmp_path / "tls" / name).stat().st_mode) == 0o600
    assert {p.name for p in (tmp_path / "tls").iterdir()} == {"ca.pem", "ca.key", "node.pem", "node.key"}


def test_a_tls_actor_answers_a_peer_of_its_cluster_and_no_other(tls_echo, tmp_path):
    from asyncflow.core import protocol
    from asyncflow.core.errors import ActorGone, ActorTimeout
    from asyncflow.core.ref import ActorRef
    from asyncflow.core.tls import make_cluster_certs

    served, transport = tls_echo
    assert served.address.startswith("tls+tcp://127.0.0.1:")
    assert ActorRef("echo", served.address, transport).ask(protocol.Echo(payload=b"hi"), timeout_s=5).payload == b"hi"
    other = msgspec.structs.replace(transport, tls_dir=str(make_cluster_certs(tmp_path / "other")))
    with pytest.raises((ActorTimeout, ActorGone)):
        ActorRef("echo", served.address, other).tell(protocol.Echo(payload=b"intruder"), timeout_s=1.5)
    plain = served.address.replace("tls+tcp://", "tcp://")
    with pytest.raises((ActorTimeout, ActorGone)):
        ActorRef("echo", plain, msgspec.structs.replace(transport, tls_dir="")).tell(protocol.Echo(), timeout_s=1.5)
    assert served.pykka_ref.proxy().num_told.get() == 0
    assert served.num_rejected_frames == 0  # refused by the TLS handshake: no frame reached the listener


class _Relay:
    """A tcp relay that records every byte the client sends (a wiretap)."""

    def __init__(self, target_port: int):
        import socket
        import threading

        self.sent = bytearray()
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._target_port = target_port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        client, _ = self._server.accept()
        upstream = socket.create_connection(("127.0.0.1", self._target_port))
        threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
        self._pump(upstream, client, False)

    def _pump(self, src, dst, record):
        while data := src.recv(65536):
            if record:
                self.sent += data
            dst.sendall(data)


def test_a_captured_tls_stream_replayed_delivers_nothing_and_the_actor_keeps_serving(tls_echo):
    import socket

    from asyncflow.core import protocol
    from asyncflow.core.ref import ActorRef

    served, transport = tls_echo
    port = int(served.address.rpartition(":")[2])
    relay = _Relay(port)
    tapped = ActorRef("echo", f"tls+tcp://127.0.0.1:{relay.port}", transport)
    tapped.tell(protocol.Echo(payload=b"once"), timeout_s=5)
    tapped.tell(protocol.Stop(), timeout_s=5)
    assert served.pykka_ref.proxy().num_told.get() == 1
    captured = bytes(relay.sent)
    assert b"once" not in captured  # encrypted on the wire
    for _ in range(50):  # a wiretapper replays the whole client stream on new connections
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            raw.sendall(captured)
            while raw.recv(65536):  # the listener closes the connection: the handshake failed
                pass
    direct = ActorRef("echo", served.address, transport)
    assert direct.ask(protocol.Echo(payload=b"after"), timeout_s=5).payload == b"after"
    assert served.pykka_ref.proxy().num_told.get() == 1  # none of the 50 replays was delivered


def test_a_control_listener_drops_a_frame_over_its_small_limit_and_keeps_answering(tmp_path):
    from asyncflow.core import protocol
    from asyncflow.core.directory import start_directory
    from asyncflow.core.errors import ActorGone, ActorTimeout
    from asyncflow.core.ref import ActorRef
    from asyncflow.core.transport import TransportConfig

    transport = TransportConfig(scheme="tcp", secret=SECRET, control_max_message_bytes=64 << 10)
    directory = start_directory(transport)
    try:
        ref = ActorRef(directory.name, directory.address, transport)
        with pytest.raises((ActorTimeout, ActorGone)):
            ref.ask(protocol.Register(entry=protocol.ActorEntry(name="x" * (1 << 20), address="inproc://x")), timeout_s=1.5)
        assert isinstance(ref.ask(protocol.Ping(), timeout_s=5), protocol.Pong)
    finally:
        directory.stop()


@pytest.mark.timeout(30)
def test_afctl_status_without_a_run_dir_follows_only_a_pointer_file_of_its_own_user(tmp_path, monkeypatch):
    """The pointer lives in the shared temp directory: another user may plant one under
    our name (or a link to theirs). Status follows it only when it is a plain file of
    this user, and says which run it picked."""
    import os
    import tempfile

    import msgspec

    from asyncflow.actors.driver import cluster_file as _cluster_file
    from asyncflow.core.transport import TransportConfig

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    rd = tmp_path / "run"
    rd.mkdir()
    info = _cluster_file.ClusterFile(
        run_dir=str(rd), directory="ipc:///x", transport=TransportConfig(), driver_pid=os.getpid(), started_at=0.0
    )
    _cluster_file.write(info)
    pointer = _cluster_file.pointer_path()
    assert _cluster_file.read(None).run_dir == str(rd)

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "cluster.json").write_bytes(msgspec.json.encode(msgspec.structs.replace(info, run_dir=str(theirs))))
    pointer.write_bytes(msgspec.json.encode({"run_dir": str(theirs), "at": 0.0}))
    os.chown(pointer, 4242, 4242)  # planted by another user (the tests run as root)
    with pytest.raises(FileNotFoundError, match=r"owned by uid 4242.*afctl status RUN_DIR"):
        _cluster_file.read(None)
    _cluster_file.write(info)  # our next run replaces it with a file of our own
    assert pointer.stat().st_uid == os.getuid() and _cluster_file.read(None).run_dir == str(rd)

    pointer.unlink()
    other = tmp_path / "planted.json"
    other.write_bytes(msgspec.json.encode({"run_dir": str(theirs), "at": 0.0}))
    pointer.symlink_to(other)
    with pytest.raises(FileNotFoundError, match=r"is a link"):
        _cluster_file.read(None)
