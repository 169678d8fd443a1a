import pytest


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    from asyncflow.toy.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("qwen2"), arch="qwen2", seed=0)
