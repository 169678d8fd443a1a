"""Fixtures: tiny Hugging Face model directories, built once per session."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    from asyncflow.toy.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("qwen2"), arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    from asyncflow.toy.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("llama"), arch="llama", seed=0)
