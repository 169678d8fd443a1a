"""Fixtures: a tiny Hugging Face model directory, built once per session."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from asyncflow.toy.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny"), arch="qwen2", seed=0)
