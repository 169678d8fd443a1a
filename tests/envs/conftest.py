"""Fixtures of the environment tests: an untrained tiny model and its tokenizer."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from asyncflow.engines.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), arch="qwen2", seed=0)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir):
    from asyncflow.engines.hf import load_tokenizer

    return load_tokenizer(tiny_dir)
