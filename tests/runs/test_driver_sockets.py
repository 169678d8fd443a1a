"""A driver that ran a run keeps no client socket to the run's actors: a cached nng
dialer to an address nobody listens on any more redials it forever (every 20-500 ms),
which cost an idle driver about 8% of a core after one run and slowed every later run
of the same process (``afctl bench e2e`` and ``bench peer`` run sync, then async)."""

from __future__ import annotations

import os

import pytest
from wf_helpers import write_config

from asyncflow.actors.driver.launcher import run
from asyncflow.config.load import load_config
from asyncflow.core import ref


def _ipc_addresses() -> list[str]:
    return [address for (address, _, _) in ref._sockets if address.startswith("ipc://")]


@pytest.mark.timeout(180)
def test_after_a_run_the_driver_holds_no_socket_to_its_actors(tmp_path):
    before = set(_ipc_addresses())
    cfg = load_config(str(write_config(tmp_path, mode="async", num_steps=2, staleness=1)))
    summary = run(cfg, tmp_path / "run")
    assert summary["steps"] == 2
    left = [a for a in _ipc_addresses() if a not in before]
    # the run's actors (directory, collector, roles, queue) are all stopped: nothing left to dial
    assert left == [], left


@pytest.mark.timeout(30)
def test_close_sockets_closes_only_those_it_is_given():
    from asyncflow.core.transport import TransportConfig

    config = TransportConfig(scheme="ipc", ipc_dir="/tmp")
    a, b = f"ipc:///tmp/af-test-{os.getpid()}-a.sock", f"ipc:///tmp/af-test-{os.getpid()}-b.sock"
    sock_a, sock_b = ref._socket_for(a, config), ref._socket_for(b, config)
    try:
        assert ref.close_sockets(lambda address: address == a) == 1
        assert ref._socket_for(b, config) is sock_b  # kept
        assert ref._socket_for(a, config) is not sock_a  # a fresh one on demand
    finally:
        ref.close_sockets(lambda address: address in (a, b))
