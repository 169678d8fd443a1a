"""The wheel that ``pip install .`` builds, not the editable install the tests run from:
it holds every file of the ``asyncflow/`` package (a data file a run opens that the
wheel lacks works from the checkout and fails for every user who installed it), it is
named so that it is not the package index's unrelated ``asyncflow``, and ``afctl`` and
``afctl --version`` answer whatever the distribution is called.

The wheel is built from a copy of ``pyproject.toml``, ``README.md`` and ``asyncflow/``
(nothing is written into the checkout, which other processes share), with the build
backend already installed (``--no-build-isolation``: nothing is downloaded). The full
check, the wheel installed in a fresh virtual environment running ``examples/tiny.toml``
from outside the checkout, is a step of ``.ci/run``.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib
from click.testing import CliRunner

import asyncflow

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(asyncflow.__file__).resolve().parent
ROOT = PACKAGE.parent
TAKEN = "asyncflow"
"""The package index's ``asyncflow`` is another project ("Concurrency made easy", no ``afctl``)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        if (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "asyncflow", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(out),
        str(src),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    [path] = out.glob("*.whl")
    return zipfile.ZipFile(path)


def package_files() -> list[str]:
    """Every file of the package as the wheel names it (``asyncflow/engines/README.md``)."""
    return sorted(
        p.relative_to(ROOT).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    [member] = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(member).decode()


def test_every_file_of_the_package_is_in_the_wheel_pip_install_builds(wheel):
    in_wheel = set(wheel.namelist())
    missing = [f for f in package_files() if f not in in_wheel]
    assert missing == [], (
        f"not in the wheel `pip install .` builds, so missing from every installed copy: {missing}; "
        "add a glob that matches them to [tool.setuptools.package-data] in pyproject.toml"
    )


def test_the_wheel_is_not_the_index_s_asyncflow_and_installs_afctl_at_the_package_s_version(wheel):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    meta = Parser().parsestr(dist_info(wheel, "METADATA"))
    assert meta["Name"] == project["name"] != TAKEN
    assert meta["Version"] == asyncflow.__version__
    assert "afctl = asyncflow.cli.main:main" in dist_info(wheel, "entry_points.txt")
    assert dist_info(wheel, "top_level.txt").split() == ["asyncflow"]


def test_afctl_version_needs_no_distribution_named_like_the_import(monkeypatch):
    """The distribution's name is not the import's: ``--version`` must not look one up by ``asyncflow``."""
    from asyncflow.cli.main import main

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert asyncflow.__version__ in result.output
