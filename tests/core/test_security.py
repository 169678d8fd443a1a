"""Transport and run-directory security (issue 11, item 8): secret files, ipc
directory checks, IPv6 loopback, receive limits, TLS."""

from __future__ import annotations

import json
import stat

import msgspec
import pytest

from asyncflow.core.config import load_config_text
from tiny_config import tiny_config_text

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cr3t-for-the-test"


def _config_with_secret(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    (tmp_path / "model").mkdir()
    text = tiny_config_text(
        {"data": {"path": str(tmp_path / "data.jsonl")}, "model": {"path": str(tmp_path / "model")}},
        extra=f'\n[cluster.transport]\nsecret = "{SECRET}"\n',
    )
    return load_config_text(text)


def test_the_run_directory_keeps_the_secret_out_of_config_json_and_in_a_file_of_mode_0600(tmp_path):
    from asyncflow.actors.launcher import prepare_new

    cfg = _config_with_secret(tmp_path)
    _, rd, _ = prepare_new(cfg, tmp_path / "run")
    config_text = (rd / "config.json").read_text()
    assert SECRET not in config_text
    assert json.loads(config_text)["cluster"]["transport"]["secret"] == ""
    secret_file = rd / "secret"
    assert secret_file.read_text() == SECRET
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600


def test_a_resumed_run_takes_its_secret_back_from_the_secret_file(tmp_path):
    from asyncflow.actors.launcher import read_run_config, prepare_new

    cfg = _config_with_secret(tmp_path)
    _, rd, _ = prepare_new(cfg, tmp_path / "run")
    assert read_run_config(rd).cluster.transport.secret == SECRET


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
