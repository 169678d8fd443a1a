"""Imported first by every Python process whose PYTHONPATH lists this folder: the process
hosts the ``ray``-marked tests start (never Ray's own workers: the env goes to the host).

AF_TEST_BARRIER=DIR:N: wait until N processes have arrived in DIR (each adds a file)
before going on, so that hosts started one after another never get past it.
AF_TEST_EXIT=CODE: exit at once with CODE (a host that dies before it registers)."""

import os
import time

if os.environ.get("AF_TEST_EXIT"):
    os._exit(int(os.environ["AF_TEST_EXIT"]))  # sys.exit in sitecustomize is a fatal start-up error (code 1)
if os.environ.get("AF_TEST_BARRIER"):
    folder, count = os.environ["AF_TEST_BARRIER"].rsplit(":", 1)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < int(count) and time.monotonic() < deadline:
        time.sleep(0.05)  # a barrier between processes: the test itself never sleeps
