"""Code, tests and docs say why in their own words, never by pointing at this project's
issue tracker ("issue N", "issues N-M", "#N", "PR N"): a reader has the repository, not
the tracker, and a number tells them nothing the sentence could not.

Citations of another project's issues stay allowed: they name that project's repository,
as a URL (``github.com/owner/name/issues/N``) or as ``owner/name#N`` (``owner/name #N``,
``owner/name issue N``). Ordinary numbers are not references: ``step 54``, ``cuda:0``,
colour codes (``#444444``, ``#ff0000``), markdown headings (``## Title``), ``$#`` in a
shell script, a word with a number glued to it (``guess#1``). The verb followed by a count
("the driver may issue N calls") reads as a reference too: say "send" or "make".
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import asyncflow

pytestmark = pytest.mark.timeout(60)

ROOT = Path(asyncflow.__file__).resolve().parent.parent
SUFFIXES = (".py", ".md", ".toml", ".sh", ".txt")

WORDED = re.compile(r"\b(?:[Ii]ssues?|ISSUES?|PRs?|[Pp]ull requests?) ?#?\d+")
"""``issue N``, ``Issues N-M``, ``issue #N``, ``PR N`` (N a number)."""
HASHED = re.compile(r"(?<![\w&/#$\\\[^])#(\d+)\b(?![\w-])")
"""``(#N)``, ``see #N`` (N a number); not ``guess#1``, ``&#38;``, ``$#``, ``[^#0-9]``."""
REPOSITORY = re.compile(r"[\w.-]+/[\w.-]+ ?(?:(?:issues? )?#?\d+(?:,| and) ?)*$")
"""What ends the text just before a citation of another project's issue: ``owner/name``, or
``owner/name #1813,`` before the next of a list."""


def _colour(line: str, m: re.Match[str]) -> bool:
    """A colour code of digits only: ``#444444`` (six or eight digits), ``"#123"`` (three, quoted)."""
    digits = len(m.group(1))
    quoted = line[m.start() - 1 : m.start()] in ("'", '"') and line[m.end() : m.end() + 1] in ("'", '"')
    return digits in (6, 8) or (digits == 3 and quoted)


def references(line: str) -> list[str]:
    """The references to this project's issues in one line of text."""
    found = [m for m in WORDED.finditer(line)] + [m for m in HASHED.finditer(line) if not _colour(line, m)]
    return [m.group() for m in sorted(found, key=lambda m: m.start()) if not REPOSITORY.search(line[: m.start()])]


def tracked_text_files(root: Path = ROOT) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True).stdout
    return [root / name for name in out.split("\0") if name.endswith(SUFFIXES) and (root / name).is_file()]


def test_no_tracked_file_refers_to_an_issue_by_its_number():
    hits = []
    for path in tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for ref in references(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {ref!r}")
    assert not hits, (
        f"{len(hits)} references to issues by number (say why in the comment's own words; cite another "
        "project's issue by its repository, owner/name#N, or its URL):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize(
    "line",
    [
        f"The trace is streamed (issue {31}): the collector holds",
        f"as issues {40}-{42} asked",
        f"see Issue #{54}.",
        f"Issue {26}'s target",
        f"fixed in (#{54})",
        f"# why: #{54}",
        f"landed with PR {7}",
        f"TRL #{6789} and verl #{6240}",  # another project, but not named by its repository
    ],
)
def test_a_reference_to_an_issue_by_number_is_found(line):
    assert references(line), line


@pytest.mark.parametrize(
    "line",
    [
        f"at step {54}, on cuda:{0}, rank {3}",
        f'    "checkpoint": "#{444444}", "error": "#ff0000", "warn": "#{123}"',
        f"## The queue host as replicas grow; {3}. a list item",
        f"a hang (nanomsg/nng #{1813}, #{1236}) under load",
        f"see https://github.com/vllm-project/vllm/issues/{1234} and vllm-project/vllm#{1234}",
        f'if [ "$#" -gt {0} ]; then',
        f'assert env.reset(row) == "guess my number (guess#{1})"',
        f"the issue is {2} steps later",  # the word, not a reference
        f"re.compile(r'[^#{0}-{9}]')",
        f"&#{38}; in HTML",
    ],
)
def test_ordinary_numbers_and_other_projects_citations_are_not_flagged(line):
    assert references(line) == [], line
