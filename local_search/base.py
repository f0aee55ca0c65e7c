"""What every retriever shares: the search hit, the index manifest and the Retriever interface.

The index builders (:mod:`local_search.bm25`, :mod:`local_search.dense`) implement these and
:mod:`local_search.index` dispatches to them, so the builders never import the dispatcher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .corpus import DocId, DocStore

MANIFEST = "index.json"
FORMAT = "mia-local-search"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Hit:
    """One retrieved passage. ``row`` is its position in the corpus."""

    row: int
    id: DocId
    contents: str
    score: float

    def document(self) -> dict[str, Any]:
        """The Search-R1 document object."""
        return {"id": self.id, "contents": self.contents}


@dataclass
class Manifest:
    method: str
    num_docs: int
    corpus_sha256: str
    created: str
    model: str | None = None
    faiss: str | None = None
    dim: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    # name -> {size, mtime_ns, sha256, edges_sha256}; empty in indexes built before checksums.
    checksums: dict[str, dict[str, Any]] = field(default_factory=dict)
    corpus_path: str = ""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def info(self) -> dict[str, Any]:
        """What ``GET /health`` shows about the index."""
        keys = ("method", "model", "faiss", "num_docs", "corpus_sha256", "created")
        return {k: getattr(self, k) for k in keys}


class Retriever(ABC):
    """Search an opened index. Thread-safe; ``search`` is batched over queries."""

    def __init__(self, index_dir: Path, manifest: Manifest) -> None:
        self.index_dir = index_dir
        self.manifest = manifest
        self.docs = DocStore(index_dir)

    @abstractmethod
    def _search_rows(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        """Best-first ``(row, score)`` pairs per query, at most ``k`` each."""

    def search(self, queries: list[str], topk: int = 3) -> list[list[Hit]]:
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise TypeError("queries must be a list of strings")
        if topk < 1:
            raise ValueError("topk must be >= 1")
        if not queries:
            return []
        k = min(topk, self.manifest.num_docs)
        out = []
        for pairs in self._search_rows(queries, k):
            hits = []
            for row, score in pairs:
                doc = self.docs.get(row)
                hits.append(Hit(row=row, id=doc["id"], contents=doc["contents"], score=score))
            out.append(hits)
        return out

    def close(self) -> None:
        self.docs.close()

    def __enter__(self) -> Retriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
