"""A directory in its own process (run inside a namespace by the tests): prints its
address on stdout, serves until SIGTERM or until its parent (pytest) dies."""

from __future__ import annotations

import os
import signal
import sys
import threading

from asyncflow.core.directory import start_directory
from asyncflow.core.host import PARENT_ENV, _die_with_parent
from asyncflow.core.transport import TransportConfig

if __name__ == "__main__":
    _die_with_parent(int(os.environ.get(PARENT_ENV, "0")))
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    directory = start_directory(TransportConfig.from_env().validate())
    print(directory.address, flush=True)
    stopped.wait()
    directory.stop()
    sys.exit(0)
