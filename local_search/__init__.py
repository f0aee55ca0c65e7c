"""Offline retrieval: BM25 (bm25s) or dense (sentence-transformers + FAISS) indexes of a
Search-R1 JSONL corpus, served over the Search-R1 ``POST /retrieve`` protocol.

In-process use::

    from local_search import build_index, open_index
    build_index("corpus.jsonl", "idx", method="bm25")
    with open_index("idx") as r:
        hits = r.search(["who wrote hamlet"], topk=3)  # list[list[Hit]]

CLI: ``python -m local_search build|serve`` (see docs/local_search.md).
"""

from local_search.base import Hit, Manifest, Retriever
from local_search.config import BuildConfig, ServeConfig
from local_search.index import build_index, open_index, read_manifest

__all__ = [
    "BuildConfig",
    "Hit",
    "Manifest",
    "Retriever",
    "ServeConfig",
    "build_index",
    "open_index",
    "read_manifest",
]
