"""Teardown (actors/driver/_teardown.py): the undos of what the driver's start built, unwound
newest first by the stop, each once, errors and interrupts contained by the runner."""

from __future__ import annotations

import pytest

from asyncflow.actors.driver._teardown import Teardown


def _runner(errors: list):
    def stage(name, fn, *args):
        try:
            fn(*args)
        except Exception as exc:
            errors.append((name, exc))

    return stage


@pytest.mark.timeout(10)
def test_the_undos_run_newest_first_each_once():
    done: list[str] = []
    undo = Teardown()
    for name in ("directory", "collector", "processes"):
        undo.push(f"stop the {name}", done.append, name)
    assert undo.names() == ["stop the processes", "stop the collector", "stop the directory"]
    undo.unwind(_runner([]))
    assert done == ["processes", "collector", "directory"]
    undo.unwind(_runner([]))  # a second stop finds nothing to undo
    assert done == ["processes", "collector", "directory"] and undo.names() == []


@pytest.mark.timeout(10)
def test_an_undo_that_fails_leaves_the_others_to_run():
    done: list[str] = []
    errors: list = []
    undo = Teardown()
    undo.push("stop the directory", done.append, "directory")
    undo.push("write trace.json", lambda: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    undo.push("stop the processes", done.append, "processes")
    undo.unwind(_runner(errors))
    assert done == ["processes", "directory"]
    assert [(name, type(exc)) for name, exc in errors] == [("write trace.json", OSError)]


@pytest.mark.timeout(10)
def test_an_interrupt_between_two_undos_is_raised_after_the_last_has_run():
    done: list[str] = []

    def interrupted():
        raise KeyboardInterrupt

    undo = Teardown()
    undo.push("stop the directory", done.append, "directory")
    undo.push("stop a host", interrupted)
    undo.push("stop the processes", done.append, "processes")
    with pytest.raises(KeyboardInterrupt):
        undo.unwind(lambda name, fn, *args: fn(*args))  # a runner that lets an interrupt through
    assert done == ["processes", "directory"]
