"""``python -m local_search build|serve|verify`` (also ``mia search ...``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mia.cli_support import cli_errors, dispatch, serve_app
from mia.config import add_help_config
from mia.errors import MiaError
from mia.http import add_server_args

from .config import FAISS_TYPES, METHODS, LocalSearchConfig, load_config


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="local_search build", description="Build a BM25 or dense index of a JSONL corpus."
    )
    p.add_argument("--corpus", required=True, help='JSONL, one {"id", "contents"} per line')
    p.add_argument("--out", required=True, help="index folder (replaced only on success)")
    p.add_argument("--method", choices=METHODS, default=None)
    p.add_argument("--model", default=None, help="dense: sentence-transformers model or folder")
    p.add_argument("--faiss", choices=FAISS_TYPES, default=None, help="dense: FAISS index type")
    p.add_argument("--batch-size", type=int, default=None, help="dense: encoder batch size")
    p.add_argument("--device", default=None, help="dense: torch device for the encoder (cpu)")
    p.add_argument("--max-seq-length", type=int, default=None)
    p.add_argument("--nlist", type=int, default=None, help="ivfpq: inverted lists (auto)")
    p.add_argument("--pq-m", type=int, default=None, help="ivfpq: PQ sub-quantizers (dim/4)")
    p.add_argument(
        "--no-rerank-vectors",
        action="store_true",
        help="ivfpq: do not store the float16 vectors used for exact re-ranking",
    )
    p.add_argument("--k1", type=float, default=None, help="bm25: k1")
    p.add_argument("--b", type=float, default=None, help="bm25: b")
    p.add_argument("--config", default=None, help="YAML (configs/local_search/default.yaml)")
    add_help_config(p, LocalSearchConfig)
    return p


def build_main(argv: list[str]) -> None:
    args = _build_parser().parse_args(argv)
    cfg = load_config(args.config).build
    overrides = {
        "model": args.model,
        "faiss": args.faiss,
        "batch_size": args.batch_size,
        "device": args.device,
        "max_seq_length": args.max_seq_length,
        "ivf_nlist": args.nlist,
        "pq_m": args.pq_m,
        "rerank_vectors": False if args.no_rerank_vectors else None,
    }
    if args.k1 is not None:
        cfg.bm25.k1 = args.k1
    if args.b is not None:
        cfg.bm25.b = args.b
    from .index import build_index

    start = time.perf_counter()
    m = build_index(args.corpus, args.out, args.method or cfg.method, cfg, **overrides)
    what = f"{m.method}" + (f" ({m.model}, {m.faiss})" if m.method == "dense" else "")
    print(
        f"built {what} index of {m.num_docs} passages in {time.perf_counter() - start:.1f}s "
        f"-> {args.out}",
        flush=True,
    )


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="local_search serve", description="Serve an index over the Search-R1 /retrieve API."
    )
    p.add_argument("--index", required=True, help="index folder made by `build`")
    p.add_argument("--topk", type=int, default=None, help="topk when a request omits it (3)")
    p.add_argument("--max-topk", type=int, default=None, help="largest topk accepted (100)")
    p.add_argument("--max-queries", type=int, default=None, help="queries per request (256)")
    p.add_argument("--nprobe", type=int, default=None, help="ivfpq: lists visited per query")
    p.add_argument("--ef-search", type=int, default=None, help="hnsw: search breadth")
    p.add_argument(
        "--rerank",
        type=int,
        default=None,
        help="ivfpq: re-score rerank*topk candidates (10; 0=off)",
    )
    p.add_argument("--device", default=None, help="dense: torch device for queries (cpu)")
    p.add_argument(
        "--verify",
        choices=("fast", "full"),
        default=None,
        help="index check before serving: fast (size, mtime, first/last 64 KiB; default) or "
        "full (sha256 of every byte)",
    )
    p.add_argument("--config", default=None, help="YAML (configs/local_search/default.yaml)")
    add_server_args(p, default_port=8001, env_prefix="LOCAL_SEARCH")
    add_help_config(p, LocalSearchConfig)
    return p


def serve_main(argv: list[str]) -> None:
    args = _serve_parser().parse_args(argv)
    cfg = load_config(args.config).serve
    for attr, value in (
        ("default_topk", args.topk),
        ("max_topk", args.max_topk),
        ("max_queries", args.max_queries),
        ("nprobe", args.nprobe),
        ("ef_search", args.ef_search),
        ("rerank", args.rerank),
        ("device", args.device),
        ("verify", args.verify),
    ):
        if value is not None:
            setattr(cfg, attr, value)
    cfg.validate()
    from .index import open_index
    from .server import create_search_app

    # Open (and so validate) the index before binding: a bad index exits 2 with one line.
    retriever = open_index(args.index, cfg)
    m = retriever.manifest
    print(f"local_search: {m.method} index of {m.num_docs} passages from {args.index}", flush=True)
    app = create_search_app(retriever, cfg, token=args.token, max_body_bytes=args.max_body_bytes)
    try:
        serve_app(app, args)
    finally:
        retriever.close()


def verify_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(
        prog="local_search verify",
        description="Check every byte of an index against the checksums in its manifest.",
    )
    p.add_argument("--index", required=True, help="index folder made by `build`")
    p.add_argument(
        "--update",
        action="store_true",
        help="record checksums in an index built without them, or refresh the recorded "
        "mtimes of an intact copy (after the full check)",
    )
    args = p.parse_args(argv)
    from dataclasses import asdict

    from mia.paths import atomic_write_text

    from .base import MANIFEST
    from .index import read_manifest
    from .integrity import record_all, touch_records, verify_index

    d = Path(args.index)
    manifest = read_manifest(d)  # sizes checked
    if not manifest.checksums:
        if not args.update:
            raise MiaError(
                f"index {d} has no checksums (built before they were recorded); "
                f"`python -m local_search verify --index {d} --update` records them"
            )
        manifest.checksums = record_all(d, list(manifest.files))
        what = "recorded checksums of"
    else:
        verify_index(d, manifest.files, manifest.checksums, "full")
        what = "verified"
        if args.update:
            touch_records(d, manifest.checksums)
            what = "verified (mtimes refreshed)"
    if args.update:
        atomic_write_text(d / MANIFEST, json.dumps(asdict(manifest), indent=2) + "\n")
    print(f"local_search: {what} {len(manifest.files)} files of {d}", flush=True)


_COMMANDS = {"build": build_main, "serve": serve_main, "verify": verify_main}


def main(argv: list[str] | None = None) -> None:
    """Dispatch ``build`` / ``serve``; MiaError propagates (the caller prints it)."""
    dispatch(
        sys.argv[1:] if argv is None else argv,
        _COMMANDS,
        usage="usage: python -m local_search {build,serve,verify} [options]  (-h after one for "
        "help; --help-config lists the --config keys)",
        schema=LocalSearchConfig,
        known="use build, serve or verify",
    )


def run() -> None:
    """Entry point of ``python -m local_search``: one line and exit 2 on a MiaError."""
    with cli_errors("local_search"):
        main()
