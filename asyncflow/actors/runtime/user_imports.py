"""A user's ``module:name`` imported the way a worker process will import it: reward
functions, environments and custom roles, checked in the driver before any process
starts (``driver/preflight.py``) and resolved into role specs (``driver/topology.py``)."""

from __future__ import annotations

import os

MOVED_MODULES = {"asyncflow.algorithms.tasks": "asyncflow.toy.tasks", "asyncflow.engines.tiny": "asyncflow.toy.tiny"}
"""asyncflow modules a config may still name, and where they went."""


def importable(path: str, python_path: list[str]):
    """``module:attr`` imported the way a worker will (PYTHONPATH = cluster.python_path,
    then the working directory); raises ValueError saying what is missing."""
    import importlib
    import sys

    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{path!r} is not a dotted path 'package.module:name'")
    if module_name in MOVED_MODULES:
        raise ValueError(f"module {module_name!r} moved: write '{MOVED_MODULES[module_name]}:{attr}'")
    saved = list(sys.path)
    sys.path[:0] = [*python_path, os.getcwd()]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = ", ".join(python_path) if python_path else "nothing"
        raise ValueError(
            f"cannot import module {module_name!r} ({exc}); put the directory that holds it in "
            f"cluster.python_path (relative to the config file; now {where})"
        ) from None
    finally:
        sys.path[:] = saved
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no {attr!r}")
    return getattr(module, attr)
