"""Shared test setup: keep torch to one thread per process on this 2-core machine."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # tests/tiny_config.py, shared by every test directory

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """An untrained tiny Qwen2 model directory, built once per session (tests/envs, tests/gateway)."""
    from asyncflow.toy.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    """``tiny_dir``'s tokenizer."""
    from asyncflow.engines.hf import load_tokenizer

    return load_tokenizer(tiny_dir)


@pytest.fixture(autouse=True)
def _close_client_sockets():
    """After each test, close the test process's cached client sockets: a dialer to an
    actor the test stopped would redial its address every 20-500 ms for the rest of the
    session (asyncflow/core/ref.py ``close_sockets``). The next call dials afresh."""
    yield
    from asyncflow.core.ref import close_all_sockets

    close_all_sockets()
