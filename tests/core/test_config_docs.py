"""docs/config.md, as generated: every key described, no empty table."""

from __future__ import annotations

import pytest

from asyncflow.config.docs import config_markdown


@pytest.mark.timeout(30)
def test_every_key_in_the_generated_reference_has_a_meaning():
    rows = [line for line in config_markdown().splitlines() if line.startswith("| `")]
    undocumented = [row.split("|")[1].strip() for row in rows if not row.split("|")[-2].strip()]
    assert undocumented == []


@pytest.mark.timeout(30)
def test_a_section_without_keys_of_its_own_has_no_empty_table():
    lines = config_markdown().splitlines()
    for i, line in enumerate(lines):
        if line == "|---|---|---|---|":
            assert lines[i + 1].startswith("| `"), f"an empty table under {lines[i - 5]}"
    critic = lines[lines.index("## `[critic]`") : lines.index("## `[critic.engine]`")]
    assert "No keys of its own: `[critic.engine]` below." in critic


@pytest.mark.timeout(30)
def test_no_doc_or_message_installs_asyncflow_from_the_package_index():
    """`pip install 'asyncflow[ray]'` would fetch another project of that name from PyPI."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("docs/*.md"), root / "README.md", *root.glob("asyncflow/**/*.py")]
    offenders = [str(p.relative_to(root)) for p in files if "install 'asyncflow[" in p.read_text()]
    assert offenders == []
