"""A local Ray cluster owned by this process (the tests' fixture, scripts/ray_local_e2e.sh):
prints the address drivers join it at, and shuts it down (every Ray process it started)
when its stdin closes or its parent dies. It listens and dials on 127.0.0.1 only.
Usage: python _ray_head.py NUM_CPUS"""

from __future__ import annotations

import os
import sys

from asyncflow.actors.driver.ray_hosts import LOOPBACK_ENV
from asyncflow.core.host import PARENT_ENV, _die_with_parent

if __name__ == "__main__":
    _die_with_parent(int(os.environ.get(PARENT_ENV, "0")))
    os.environ.update(LOOPBACK_ENV)  # before Ray is imported: else Ray turns 127.0.0.1 into this machine's other address
    import ray

    ray.init(num_cpus=int(sys.argv[1]), include_dashboard=False, configure_logging=False, _node_ip_address="127.0.0.1")
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    ray.shutdown()
