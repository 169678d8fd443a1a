"""A local Ray cluster owned by this process (the tests' fixture): prints the address
drivers join it at, and shuts it down (every Ray process it started) when its stdin
closes or its parent dies. Usage: python _ray_head.py NUM_CPUS"""

from __future__ import annotations

import os
import sys

import ray

from asyncflow.core.host import PARENT_ENV, _die_with_parent

if __name__ == "__main__":
    _die_with_parent(int(os.environ.get(PARENT_ENV, "0")))
    ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, configure_logging=False)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    ray.shutdown()
