"""Checksums of an index folder's files: recorded at build time, checked before serving.

Each file listed in the manifest gets ``{"size", "mtime_ns", "sha256", "edges_sha256"}``:
the SHA-256 of the whole file and of its first and last 64 KiB (its "edges": headers such as
``.npy`` shapes, and the tail that a truncation or an append changes).

Verification before serving:

- ``fast`` (default): size, then the edges' checksum; a file whose mtime differs from the
  recorded one (it was written to, or copied without keeping times) is hashed in full and
  accepted only if the full checksum matches. The fast path trusts an unchanged mtime: bytes
  changed in the middle of a file whose mtime was put back are only seen by ``full``.
- ``full``: every byte of every file against its SHA-256.

Indexes built before checksums existed are served with a warning; ``python -m local_search
verify --index DIR --update`` records them (and refreshes the mtimes of a copied index after
checking every byte against the recorded checksums).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import file_sha256

EDGE_BYTES = 64 * 1024
VERIFY_MODES = ("fast", "full")


def edges_sha256(path: Path) -> str:
    """SHA-256 of the first and last ``EDGE_BYTES`` (the whole file when it is small)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as f:
        h.update(f.read(EDGE_BYTES))
        if size > EDGE_BYTES:
            f.seek(max(EDGE_BYTES, size - EDGE_BYTES))
            h.update(f.read(EDGE_BYTES))
    return h.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": file_sha256(path),
        "edges_sha256": edges_sha256(path),
    }


def record_all(index_dir: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: file_record(index_dir / name) for name in names}


def _corrupt(shown: str, name: str, what: str) -> MiaError:
    return MiaError(
        f"index {shown} is corrupt: {name} {what} (rebuild it, or restore the folder from a copy)"
    )


def verify_file(index_dir: Path, name: str, rec: dict[str, Any], mode: str, shown: str) -> bool:
    """Check one file against its record; True when its full checksum was computed."""
    path = index_dir / name
    st = path.stat()
    if st.st_size != rec.get("size"):
        raise _corrupt(
            shown, name, f"is {st.st_size} bytes, the checksum record says {rec.get('size')}"
        )
    if mode == "fast":
        if edges_sha256(path) != rec.get("edges_sha256"):
            raise _corrupt(shown, name, "does not match its recorded checksum (first/last 64 KiB)")
        if st.st_mtime_ns == rec.get("mtime_ns"):
            return False
    if file_sha256(path) != rec.get("sha256"):
        raise _corrupt(shown, name, "does not match its recorded sha256")
    return True


def verify_index(
    index_dir: Path, files: dict[str, int], checksums: dict[str, dict[str, Any]], mode: str
) -> list[str]:
    """Verify every manifest file; returns notes for the operator (MiaError when corrupt)."""
    if mode not in VERIFY_MODES:
        raise MiaError(f"unknown verify mode {mode!r} (choose from {', '.join(VERIFY_MODES)})")
    shown = str(index_dir)
    if not checksums:
        return [
            f"index {shown} has no checksums (built before they were recorded): its files are "
            f"not verified; run `python -m local_search verify --index {shown} --update`"
        ]
    missing = sorted(set(files) - set(checksums))
    if missing:
        raise _corrupt(shown, missing[0], "has no checksum record")
    hashed = [
        name for name in sorted(files) if verify_file(index_dir, name, checksums[name], mode, shown)
    ]
    if mode == "fast" and hashed:
        return [
            f"index {shown}: {', '.join(hashed)} changed mtime but not content (verified in "
            f"full; `python -m local_search verify --index {shown} --update` records the new times)"
        ]
    return []


def touch_records(index_dir: Path, checksums: dict[str, dict[str, Any]]) -> None:
    """Refresh the recorded mtimes (after a full verification said the content is intact)."""
    for name, rec in checksums.items():
        rec["mtime_ns"] = os.stat(index_dir / name).st_mtime_ns
