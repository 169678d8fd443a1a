"""The chaos suite (``python -m pytest -m chaos tests/chaos``): wf_helpers of the workflow tests."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "workflow"))
