"""A local Ray cluster for the ``ray``-marked tests (``pip install -e '.[ray]' in the asyncflow checkout``).

Run: ``timeout 900 python -m pytest tests/ray -m ray -q``. The cluster is started by a
helper process (``_ray_head.py``) and shut down by it, so no other Ray on the machine
is touched (never ``ray stop``).
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from asyncflow.core.host import PARENT_ENV


@dataclass(frozen=True)
class RayHead:
    env: dict[str, str]  # what a driver joins the cluster with
    pid: int  # the process that started it (Ray's processes are its descendants)


@pytest.fixture(scope="session")
def ray_head():
    """The local Ray cluster, on 127.0.0.1 only. Its environment (address, auth token,
    loopback) is also set in this process before Ray is imported (Ray reads its auth
    mode and its loopback switch once), so that a test may be a Ray driver itself; one
    cluster and one token per session."""
    # Ray >= 2.5x authenticates with a token: ours, in the env (never written to ~/.ray).
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 keeps Ray on loopback (actors/driver/ray_hosts.py, LOOPBACK_ENV)
    auth = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }
    if importlib.util.find_spec("ray") is None:
        pytest.skip("the ray extra is not installed: pip install -e '.[ray]' in the asyncflow checkout")
    saved = {key: os.environ.get(key) for key in auth}
    os.environ.update(auth)
    env = dict(os.environ, **auth, **{PARENT_ENV: str(os.getpid())})
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    head = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "_ray_head.py"), "4"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        address = head.stdout.readline().strip()
        if not address:
            pytest.fail(f"the local Ray cluster did not start (exit {head.wait(timeout=60)})")
        yield RayHead(env={"RAY_ADDRESS": address, **auth}, pid=head.pid)
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def ray_env(ray_head):
    """The environment a driver joins the local cluster with (address, auth, loopback)."""
    return ray_head.env
