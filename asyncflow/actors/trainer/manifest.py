"""``MANIFEST.json`` of a checkpoint: the size and sha256 of every file in it.

Written last before ``DONE`` by the trainer's save; checked on resume, so a damaged
checkpoint (a torn write, a truncated or flipped file, a missing file) is named and
skipped in favour of the newest one that verifies. A checkpoint saved before
manifests existed has none and is taken as it is.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "MANIFEST.json"
_NOT_LISTED = {MANIFEST, "DONE"}
_CHUNK_BYTES = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() not in _NOT_LISTED)


def write_manifest(root: Path) -> None:
    """List every file under ``root`` (but DONE and the manifest) with its size and sha256."""
    files = {p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in _files(root)}
    (root / MANIFEST).write_text(json.dumps({"files": files}, indent=1))


def damage(root: Path) -> str | None:
    """What is wrong with the checkpoint at ``root`` (naming the file), or None when it
    verifies or has no manifest."""
    path = root / MANIFEST
    if not path.exists():
        return None
    try:
        listed = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST}: unreadable ({type(exc).__name__}: {exc})"
    for name, want in listed.items():
        file = root / name
        if not file.is_file():
            return f"{name}: missing"
        size = file.stat().st_size
        if size != want["size"]:
            return f"{name}: {size} bytes, the manifest says {want['size']}"
        if _sha256(file) != want["sha256"]:
            return f"{name}: sha256 differs from the manifest"
    return None
