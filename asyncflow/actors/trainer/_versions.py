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
                f"step {step + 1}: {mismatched} of {len(indices)} rows were not generated with the weights of the version "
                f"they are tagged with (row {index}: tagged v{m.version}, whose digest is {expected:x}, generated with "
                f"{m.weights_digest:x}); a rollout replica mislabels its version or the published weights changed "
                'after their digest was taken. workflow.verify_weights = "count" counts such rows instead'
            )
        return {"weights_mismatch": float(mismatched), "weights_unverified": float(unverified)}


def token_staleness(
    step: int, k: int, indices: Sequence[int], metas: Sequence[protocol.RowMeta], token_versions: Sequence
) -> dict[str, float]:
    """Partial rollout: the staleness of rows whose tokens carry their own versions
    (``token_versions``). A row's staleness is that of its oldest token, ``step -
    min(token_versions)``; its tag must be that version (what the rollout's staleness
    gate admitted it under), and no token may be older than ``step - k``. Either broken
    raises VersionMismatch naming the row: a tag newer than the row's oldest token would
    hide staleness from the bound. Returns ``token_staleness_max``,
    ``token_staleness_mean`` (over tokens) and ``mixed_version_frac`` (rows whose
    tokens come from more than one version)."""
    worst = total = count = mixed = 0
    for index, m, tv in zip(indices, metas, token_versions):
        if len(tv) == 0:
            continue
        oldest, newest = int(min(tv)), int(max(tv))
        if oldest != m.version or step - oldest > k:
            raise VersionMismatch(
                f"step {step + 1}: row {index} is tagged v{m.version} but its tokens come from versions {oldest}..{newest}: "
                f"its oldest token is {step - oldest} versions old (bound {k}); a partial rollout must tag a row "
                "with its oldest token's version and admit it only within the staleness bound"
            )
        worst = max(worst, step - oldest)
        total += sum(step - int(v) for v in tv)
        count += len(tv)
        mixed += oldest != newest
    return {
        "token_staleness_max": float(worst),
        "token_staleness_mean": total / count if count else 0.0,
        "mixed_version_frac": mixed / len(metas) if len(metas) else 0.0,
    }
