"""``cluster.huge_pages``: worker processes start with THP_MEM_ALLOC_ENABLE=1, and torch
then backs its large CPU tensors with 2 MB pages (where the kernel's mode is madvise)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from asyncflow.actors.launcher import worker_env
from asyncflow.config.load import load_config
from asyncflow.engines.huge_pages import ENV, huge_pages_env, kernel_mode

LOCAL = str(Path(__file__).resolve().parents[2] / "examples" / "local.toml")


@pytest.mark.timeout(30)
def test_kernel_mode_is_the_bracketed_word_and_unknown_without_the_file(tmp_path):
    f = tmp_path / "enabled"
    for text, mode in (("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"), ("garbled", "unknown")):
        f.write_text(text)
        assert kernel_mode(f) == mode
    assert kernel_mode(tmp_path / "missing") == "unknown"


@pytest.mark.timeout(60)
def test_workers_start_with_the_variable_unless_the_config_turns_it_off(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    off = load_config(LOCAL, ())
    assert off.cluster.huge_pages is False  # the default: no faster on this machine (docs/real-model.md)
    assert ENV not in worker_env(off, tmp_path)  # the driver's environment (its own value, or torch's default) stands
    on = load_config(LOCAL, ("cluster.huge_pages=true",))
    assert worker_env(on, tmp_path)[ENV] == "1"
    assert worker_env(msgspec.structs.replace(on, cluster=off.cluster), tmp_path) == worker_env(off, tmp_path)
    assert huge_pages_env(True) == {ENV: "1"} and huge_pages_env(False) == {}


ALLOCATE = textwrap.dedent(
    """
    import torch
    x = torch.empty(64 * 2**20, dtype=torch.uint8)
    x.fill_(1)  # fault every page in
    text = open("/proc/self/smaps_rollup").read()
    kb = [int(line.split()[1]) for line in text.splitlines() if line.startswith("AnonHugePages:")][0]
    print(kb // 1024)
    """
)


def _huge_mb(value: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != ENV}
    if value is not None:
        env[ENV] = value
    done = subprocess.run([sys.executable, "-c", ALLOCATE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(240)
@pytest.mark.skipif(kernel_mode() != "madvise", reason="only a kernel in THP madvise mode tells the two apart")
def test_torch_backs_a_large_tensor_with_huge_pages_only_with_the_variable():
    on = _huge_mb(huge_pages_env(True)[ENV])
    assert on >= 32, f"{on} MB of the 64 MB tensor in huge pages with {ENV}=1: torch no longer reads it?"
    assert _huge_mb(None) < 16  # 4 KB pages: the default this setting changes
