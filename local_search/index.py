"""Index folders: build (atomically, manifest last) and open (validated) — the in-process API.

An index folder holds ``docs.jsonl`` + ``docs.offsets.npy`` (see corpus.py), the method's files
and ``index.json``, the manifest. The folder is assembled under a temporary sibling name and
renamed into place only when complete (``mia.paths.atomic_dir``), and the manifest is the last
file written, so an interrupted build never leaves a folder that looks valid. The manifest
records every file's size and checksums (:mod:`local_search.integrity`); ``open_index`` checks
them before loading anything heavy.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mia.errors import MiaError
from mia.paths import atomic_dir, atomic_write_text

from .base import FORMAT, FORMAT_VERSION, MANIFEST, Manifest, Retriever
from .config import BuildConfig, ServeConfig
from .corpus import write_docstore
from .integrity import record_all, verify_index

log = logging.getLogger("local_search")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def build_index(
    corpus_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    method: str = "bm25",
    config: BuildConfig | None = None,
    **dense_overrides: Any,
) -> Manifest:
    """Build an index of ``corpus_path`` into ``out_dir`` (replaced only on success).

    ``dense_overrides`` (e.g. ``model=``, ``faiss=``, ``batch_size=``) patch ``config.dense``.
    """
    cfg = config or BuildConfig()
    cfg.method = method
    for key, value in dense_overrides.items():
        if not hasattr(cfg.dense, key):
            raise MiaError(f"unknown dense build option {key!r}")
        if value is not None:
            setattr(cfg.dense, key, value)
    cfg.validate()
    out = Path(out_dir)
    if Path(corpus_path).resolve() == out.resolve():
        raise MiaError("output folder must differ from the corpus file")
    with atomic_dir(out) as tmp:
        stats = write_docstore(corpus_path, tmp)
        manifest = Manifest(
            method=method,
            num_docs=stats.num_docs,
            corpus_sha256=stats.sha256,
            created="",
            corpus_path=str(Path(corpus_path).resolve()),
        )
        if method == "bm25":
            from .bm25 import build_bm25

            build_bm25(tmp, cfg.bm25, manifest)
        else:
            from .dense import build_dense

            build_dense(tmp, cfg.dense, manifest)
        manifest.files = {
            p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.name != MANIFEST
        }
        # The rename into place keeps the files' mtimes, so the fast check holds after it.
        manifest.checksums = record_all(tmp, list(manifest.files))
        manifest.created = _now()
        # Last write: until this file exists the folder is not an index.
        atomic_write_text(tmp / MANIFEST, json.dumps(asdict(manifest), indent=2) + "\n")
    return manifest


def read_manifest(index_dir: str | os.PathLike[str]) -> Manifest:
    """Load and check ``index.json`` and the files it lists; MiaError names what is wrong."""
    d = Path(index_dir)
    if not d.is_dir():
        raise MiaError(f"index folder not found: {d}")
    path = d / MANIFEST
    if not path.is_file():
        raise MiaError(
            f"{d} is not a local_search index (no {MANIFEST}; an interrupted build never writes "
            "one): build it with `python -m local_search build`"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format") != FORMAT:
            raise ValueError(f"format is {raw.get('format')!r}, not {FORMAT!r}")
        if raw.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {raw.get('format_version')!r}")
        manifest = Manifest(**raw)
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise MiaError(f"index {d} is corrupt: unreadable {MANIFEST} ({err})") from None
    for name, size in manifest.files.items():
        f = d / name
        if not f.is_file():
            raise MiaError(f"index {d} is corrupt: missing file {name}")
        if f.stat().st_size != size:
            raise MiaError(
                f"index {d} is corrupt: {name} is {f.stat().st_size} bytes, manifest says {size}"
            )
    return manifest


def open_index(index_dir: str | os.PathLike[str], serve: ServeConfig | None = None) -> Retriever:
    """Open a built index for searching. ``serve`` holds query-time knobs (nprobe, ef_search)."""
    serve = serve or ServeConfig()
    d = Path(index_dir)
    manifest = read_manifest(d)
    for note in verify_index(d, manifest.files, manifest.checksums, serve.verify):
        log.warning("%s", note)
    try:
        if manifest.method == "bm25":
            from .bm25 import Bm25Retriever

            return Bm25Retriever(d, manifest)
        if manifest.method == "dense":
            from .dense import DenseRetriever

            return DenseRetriever(
                d,
                manifest,
                nprobe=serve.nprobe,
                ef_search=serve.ef_search,
                device=serve.device,
                rerank_factor=serve.rerank,
            )
    except MiaError:
        raise
    except Exception as err:  # any loader failure means the folder cannot be served
        msg = str(err).splitlines()[0] if str(err) else ""
        raise MiaError(f"index {d} is unreadable: {type(err).__name__}: {msg}") from None
    raise MiaError(f"index {d} is corrupt: unknown method {manifest.method!r}")
