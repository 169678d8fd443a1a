"""ARCHITECTURE.md stays a map of the tree as it is: every path it names exists, and it
stays short enough to read in one sitting.

A path is a backticked token ending in ``.py`` or ``/`` (``actors/trainer/actor.py``,
``core/tq/``; also the first token of a span such as ``actors/rollout/unit.py:
UnitRollout``), outside fenced code blocks; it must exist under ``asyncflow/`` or under
the repository root. A span that starts with ``RUN_DIR/`` names a run's files, not the
repository's, and is not checked. Every ``docs/<page>.md`` the page names, backticked or
not, must exist too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import asyncflow

pytestmark = pytest.mark.timeout(30)

PACKAGE = Path(asyncflow.__file__).resolve().parent
ROOT = PACKAGE.parent
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
MAX_LINES = 400
"""The page is under this many lines: a topic's detail belongs to its own page (docs/)."""

PATH = re.compile(r"^[\w][\w.-]*(?:/[\w.-]+)*(?:\.py|/)$")
DOCS_PAGE = re.compile(r"\bdocs/[\w.-]+\.md\b")


def _without_fences(text: str) -> str:
    """The text outside ``` fenced blocks (pseudo-code and diagrams name no file to check)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def named_paths(text: str) -> list[str]:
    """Every backticked path ending in ``.py`` or ``/``, in order, once each."""
    found: dict[str, None] = {}
    for span in re.findall(r"`([^`\n]+)`", _without_fences(text)):
        if span.startswith("RUN_DIR/"):
            continue
        for token in re.split(r"[\s:,()]+", span):
            if PATH.match(token):
                found[token] = None
    return list(found)


def missing(paths: list[str]) -> list[str]:
    return [p for p in paths if not ((PACKAGE / p).exists() or (ROOT / p).exists())]


def test_the_extraction_sees_paths_in_spans_and_skips_fences():
    text = (
        "See `actors/trainer/actor.py: TrainerActor.work_once`, `core/tq/` and `nope/gone.py`;\n"
        "not `afctl up`, `module:function`, `RUN_DIR/logs/` or `tls+tcp://`.\n"
        "```\n`engines/ghost.py` inside a fence\n```\n"
    )
    assert named_paths(text) == ["actors/trainer/actor.py", "core/tq/", "nope/gone.py"]
    assert missing(named_paths(text)) == ["nope/gone.py"]


def test_every_path_architecture_md_names_exists():
    text = ARCHITECTURE.read_text()
    paths = named_paths(text)
    assert paths, "ARCHITECTURE.md names no path: the extraction is broken"
    gone = missing(paths)
    assert not gone, (
        f"ARCHITECTURE.md names {len(gone)} path(s) that exist under neither asyncflow/ nor the repository root: {gone}"
    )


def test_every_docs_page_architecture_md_names_exists():
    pages = sorted(set(DOCS_PAGE.findall(ARCHITECTURE.read_text())))
    gone = [p for p in pages if not (ROOT / p).exists()]
    assert not gone, f"ARCHITECTURE.md links docs pages that do not exist: {gone}"


def test_architecture_md_is_under_the_line_budget():
    lines = len(ARCHITECTURE.read_text().splitlines())
    assert lines < MAX_LINES, f"ARCHITECTURE.md has {lines} lines; keep it under {MAX_LINES} (move detail to docs/)"
