"""Teardown: what the driver's start has built, as the list of its undos, which the
stop unwinds.

Each stage of ``Launcher.start`` that builds something (the ipc directory, Ray, the
directory, the loggers, the collector, the roster, the processes, the online planner)
pushes its undo as soon as it exists. The stop runs them last in, first out, so the
processes stop before the collector that records them, and the directory last of the
actors; a start that failed half way unwinds exactly the stages that ran, with no
question of which of them did.

``unwind`` runs each undo through the caller's ``stage`` runner (the stop's: it logs
an error and goes on) and goes on after an interrupt too (Ctrl-C again, SIGTERM):
every undo runs, and the first interrupt is raised once they have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

StageRunner = Callable[..., None]
"""``stage(name, fn, *args)``: run ``fn(*args)``, containing what it raises."""


class Teardown:
    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []

    def push(self, name: str, fn: Callable[..., Any], *args: Any) -> None:
        """Undo ``name`` with ``fn(*args)`` at the stop (before everything pushed earlier)."""
        self._undo.append((name, fn, args))

    def names(self) -> list[str]:
        """The undos still to run, in the order the stop runs them."""
        return [name for name, _, _ in reversed(self._undo)]

    def unwind(self, stage: StageRunner) -> None:
        """Run every undo, newest first, each through ``stage``; each runs once (a second
        unwind finds nothing). An interrupt between two undos is raised after the last."""
        interrupted: KeyboardInterrupt | None = None
        while self._undo:
            name, fn, args = self._undo.pop()
            try:
                stage(name, fn, *args)
            except KeyboardInterrupt as exc:  # ``stage`` lets one through: the rest still run
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
