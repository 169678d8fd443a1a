"""The chaos suite (``python -m pytest -m chaos tests/chaos``): wf_helpers of the whole-run tests (tests/runs)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "runs"))


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def no_run_left_behind():
    """Whatever a chaos test did (failed, timed out), its driver and hosts are killed after it."""
    from chaos_helpers import LIVE

    yield
    while LIVE:
        LIVE.pop().kill_everything()
