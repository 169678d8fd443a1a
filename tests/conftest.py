"""Shared test setup: keep torch to one thread per process on this 2-core machine."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))  # tests/tiny_config.py, shared by every test directory
