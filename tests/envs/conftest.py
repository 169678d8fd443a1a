"""The environment tests run torch on one thread; their tiny model and tokenizer are
tests/conftest.py's ``tiny_dir`` and ``tokenizer``."""

import torch

torch.set_num_threads(1)
