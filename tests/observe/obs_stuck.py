"""An actor whose process has a thread stuck in a recognisable function, for the stall
report's stacks file (tests/observe/test_stall_report.py). Imported by a process host:
its directory is put on PYTHONPATH by the test."""

import threading

from asyncflow.core.echo import EchoActor

_never = threading.Event()


def stuck_in_a_unit_of_work() -> None:
    _never.wait()  # set by nobody: the thread stays here until the process ends


class StuckActor(EchoActor):
    def __init__(self, ctx):
        super().__init__(ctx)
        threading.Thread(target=stuck_in_a_unit_of_work, name="stuck-unit", daemon=True).start()
