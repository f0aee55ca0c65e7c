"""Tunables of local_search; defaults mirror ``configs/local_search/default.yaml``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from mia.errors import MiaError

DEFAULT_MODEL = "all-MiniLM-L6-v2"
METHODS = ("bm25", "dense")
FAISS_TYPES = ("flat", "ivfpq", "hnsw")
# bm25s' BM25L/BM25+ add a per-term "non-occurrence" score that the scorer does not model.
BM25_VARIANTS = ("lucene", "robertson", "atire")


@dataclass
class Bm25Config:
    k1: float = 0.9
    b: float = 0.4
    variant: str = "lucene"
    stopwords: str | None = "en"
    stemmer: str | None = "english"


@dataclass
class DenseConfig:
    model: str = DEFAULT_MODEL
    faiss: str = "flat"
    device: str = "cpu"
    batch_size: int = 64
    max_seq_length: int = 256
    ivf_nlist: int | None = None
    pq_m: int | None = None
    pq_nbits: int = 8
    rerank_vectors: bool = True
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200


@dataclass
class BuildConfig:
    method: str = "bm25"
    bm25: Bm25Config = field(default_factory=Bm25Config)
    dense: DenseConfig = field(default_factory=DenseConfig)

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
    default_topk: int = 3
    max_topk: int = 100
    max_queries: int = 256
    nprobe: int = 64
    ef_search: int = 128
    rerank: int = 10
    device: str = "cpu"
    # Index files checked before serving: fast (size, mtime, first/last 64 KiB; a changed mtime
    # means a full hash of that file) | full (every byte of every file).
    verify: str = "fast"

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
    build: BuildConfig = field(default_factory=BuildConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)


def load_config(path: str | os.PathLike[str] | None) -> LocalSearchConfig:
    """The defaults, overridden by a YAML file when given (unknown keys are an error)."""
    if path is None:
        return LocalSearchConfig()
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not Path(path).is_file():
        raise MiaError(f"config file not found: {path}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(LocalSearchConfig), OmegaConf.load(path))
        cfg = OmegaConf.to_object(merged)
    except (OmegaConfBaseException, ValueError) as err:
        raise MiaError(f"bad config {path}: {str(err).splitlines()[0]}") from None
    assert isinstance(cfg, LocalSearchConfig)
    return cfg
