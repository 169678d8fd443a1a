"""A reward module whose import kills its process while a count file says so: a
reward worker that dies during its own (re)start (tests/runs/test_restart_faults.py).

``AF_TEST_CRASH_ON_IMPORT`` names the file; while it holds a number above 0, each
import lowers it by one and exits the process with code 3. Without the file the
module imports and scores like ``wf_rewards.length``.
"""

import os
from pathlib import Path

_count_file = os.environ.get("AF_TEST_CRASH_ON_IMPORT", "")
if _count_file and Path(_count_file).exists():
    _left = int(Path(_count_file).read_text().strip() or 0)
    if _left > 0:
        Path(_count_file).write_text(str(_left - 1))
        os._exit(3)

from wf_rewards import length  # noqa: E402,F401  (the function the config names)
