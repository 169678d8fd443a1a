"""Version integrity: every trained row was generated with exactly the weights of the
policy version it is tagged with (weights digests, ``engines/digest.py``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from wf_helpers import afctl, write_config

from asyncflow.actors.trainer._versions import VersionLedger, VersionMismatch
from asyncflow.core import protocol

HERE = Path(__file__).parent
FAULTS = HERE / "faults"


def _meta(index: int, version: int, digest: int) -> protocol.RowMeta:
    return protocol.RowMeta(index=index, version=version, weights_digest=digest)


def test_a_row_stamped_with_another_versions_digest_fails_the_step_naming_the_row():
    ledger = VersionLedger()
    ledger.record(3, 0x33)
    ledger.record(4, 0x44)
    metas = [_meta(10, 3, 0x33), _meta(11, 4, 0x33)]
    with pytest.raises(VersionMismatch, match=r"row 11: tagged v4, whose digest is 44, generated with 33"):
        ledger.check(5, [10, 11], metas, strict=True)
    assert ledger.check(5, [10, 11], metas, strict=False) == {"weights_mismatch": 1.0, "weights_unverified": 0.0}


def test_rows_without_a_stamp_or_of_a_forgotten_version_count_as_unverified():
    ledger = VersionLedger()
    ledger.record(1, 0x11)
    ledger.record(2, 0x22)
    ledger.forget_before(2)
    metas = [_meta(0, 1, 0x11), _meta(1, 2, 0), _meta(2, 2, 0x22)]
    assert ledger.check(3, [0, 1, 2], metas, strict=True) == {"weights_mismatch": 0.0, "weights_unverified": 2.0}


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "fault,message",
    [
        ("partial_load", "did not copy every tensor"),
        # the other two faults take 25 s each: -m slow runs them (the default suite stays under 10 minutes)
        pytest.param("mid_unit_swap", "weights changed during a generate call", marks=pytest.mark.slow),
        pytest.param("mislabel", "version changed during a generate call", marks=pytest.mark.slow),
    ],
)
def test_a_replica_that_generates_with_other_weights_than_its_tag_names_fails_the_run(tmp_path, fault, message):
    """The healthy run of the same config passes every check (test_e2e); each fault
    stops this one with the replica's error instead of training on mislabelled rows."""
    # a reward with varied values, so every step really changes the weights
    config = write_config(
        tmp_path,
        mode="async",
        num_steps=6,
        staleness=1,
        changes={"reward": {"functions": ["wf_rewards:length"]}, "train.engine": {"lr": 1e-3}},
    )
    env_path = os.pathsep.join(filter(None, [str(FAULTS), str(HERE), os.environ.get("PYTHONPATH", "")]))
    proc = afctl(
        "up", str(config), "--run-dir", str(tmp_path / "run"), env_extra={"AF_TEST_ROLLOUT_FAULT": fault, "PYTHONPATH": env_path}
    )
    out, _ = proc.communicate(timeout=140)
    assert proc.returncode != 0, out
    assert message in out, out
