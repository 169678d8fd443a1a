"""Fault hooks for the chaos suite, imported at start-up by every process of a run
(Python imports ``sitecustomize`` from the first directory on sys.path that has one;
tests/chaos/chaos_helpers.py puts this directory first on PYTHONPATH).

Without ``AF_CHAOS_MARKS`` nothing is patched. With it (a directory):

- a rollout engine's ``load_weights`` (a weight sync) writes ``MARKS/sync.<pid>.<n>``
  and waits ``AF_CHAOS_HOLD_S`` before it loads, so a test can kill a process while
  a weight sync is in progress;
- the trainer's checkpoint writes ``MARKS/checkpoint.<step>`` once its ``.tmp``
  directory holds the queue and the model, and waits ``AF_CHAOS_HOLD_S`` before the
  manifest, so a test can kill a process while a checkpoint is being written;
- the trainer's last checkpoint (complete, ``DONE`` written) writes ``MARKS/finished``
  and waits ``AF_CHAOS_HOLD_S`` before it tells the collector ``RunFinished``, so a
  test can kill a process while the run winds down, its work all done.

(A full disk is a real one: test_chaos_disk_full.py fills a tmpfs run directory.)
"""

import importlib.util
import os
import sys

# This file runs before ``python -m`` puts the working directory on sys.path: the asyncflow it
# patches must be this checkout's, not whichever one the installed (editable) package points to
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_SPEC = importlib.util.find_spec("asyncflow")
if _SPEC is not None and _SPEC.origin and not _SPEC.origin.startswith(_CHECKOUT + os.sep):
    sys.path.insert(0, _CHECKOUT)

# a Python of the test that cannot import asyncflow (a tool it runs) is left alone
MARKS = os.environ.get("AF_CHAOS_MARKS", "") if _SPEC is not None else ""

if MARKS:
    import itertools
    import time
    from pathlib import Path

    HOLD_S = float(os.environ.get("AF_CHAOS_HOLD_S", "0.5"))
    _syncs = itertools.count()

    def _mark(name: str) -> None:
        tmp = Path(MARKS) / f".{name}.tmp"
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, Path(MARKS) / name)  # a reader sees the whole mark or none

    from asyncflow.engines.native_rollout import NativeRolloutEngine

    _load_weights = NativeRolloutEngine.load_weights

    def load_weights(self, named_tensors, version):
        _mark(f"sync.{os.getpid()}.{next(_syncs)}")
        time.sleep(HOLD_S)
        return _load_weights(self, named_tensors, version)

    NativeRolloutEngine.load_weights = load_weights

    import asyncflow.actors.trainer.actor as _trainer
    import asyncflow.actors.trainer.checkpointer as _checkpointer

    _write_manifest = _checkpointer.write_manifest

    def write_manifest(path):
        _mark(f"checkpoint.{Path(path).name}")
        time.sleep(HOLD_S)
        return _write_manifest(path)

    _checkpointer.write_manifest = write_manifest

    _finish = _trainer.TrainerActor._finish

    def finish(self):
        checkpoint = self.checkpoint

        def checkpoint_then_hold():
            path = checkpoint()
            _mark("finished")
            time.sleep(HOLD_S)
            return path

        self.checkpoint = checkpoint_then_hold
        try:
            return _finish(self)
        finally:
            del self.checkpoint

    _trainer.TrainerActor._finish = finish
