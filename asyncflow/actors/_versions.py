"""The trainer's record of which weights each policy version had (version integrity).

The trainer records the weights digest (``engines/digest.py``) of its start weights
and of every version it publishes, and checks each row it trains on: the digest the
replica stamped on the row must be the digest of the version the row is tagged with.
Pure state, no actor: ``TrainerActor`` holds one.

Invariant: a row is "mismatched" only when both digests are known and differ; a row
without a stamp (0: an engine that cannot read its weights back, before its first
swap) or tagged with a version no longer (or never) recorded is "unverified".
"""

from __future__ import annotations

from collections.abc import Sequence

from asyncflow.core import protocol


class VersionMismatch(RuntimeError):
    """Rows generated with weights other than those of the version they are tagged with."""


class VersionLedger:
    def __init__(self) -> None:
        self._digests: dict[int, int] = {}

    def record(self, version: int, digest: int) -> None:
        self._digests[version] = digest

    def forget_before(self, version: int) -> None:
        """Drop versions older than ``version`` (no row of theirs can still be trained)."""
        for old in [v for v in self._digests if v < version]:
            del self._digests[old]

    def check(self, step: int, indices: Sequence[int], metas: Sequence[protocol.RowMeta], strict: bool) -> dict[str, float]:
        """``weights_mismatch`` and ``weights_unverified`` of these rows; with ``strict``,
        a mismatch raises VersionMismatch naming the first row."""
        unverified = mismatched = 0
        first = None
        for index, m in zip(indices, metas):
            expected = self._digests.get(m.version)
            if m.weights_digest == 0 or expected is None:
                unverified += 1
            elif m.weights_digest != expected:
                mismatched += 1
                first = first or (index, m, expected)
        if mismatched and strict:
            assert first is not None  # set at the first mismatch
            index, m, expected = first
            raise VersionMismatch(
                f"step {step}: {mismatched} of {len(indices)} rows were not generated with the weights of the version "
                f"they are tagged with (row {index}: tagged v{m.version}, whose digest is {expected:x}, generated with "
                f"{m.weights_digest:x}); a rollout replica mislabels its version or the published weights changed "
                'after their digest was taken. workflow.verify_weights = "count" counts such rows instead'
            )
        return {"weights_mismatch": float(mismatched), "weights_unverified": float(unverified)}
