"""BM25 with bm25s: build (stopwords + PyStemmer stems) and a memory-mapped retriever.

The index is bm25s' own (eager BM25: a term x passage CSC matrix of precomputed scores) saved by
``BM25.save`` and opened with ``BM25.load(mmap=True)``, so a large index costs page cache rather
than heap. Queries are scored on those arrays by ``bm25_scoring.ImpactScorer`` (exact, with
MaxScore-style pruning), which is much faster than bm25s' own numpy ``retrieve``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from mia.errors import MiaError

from .base import Manifest, Retriever
from .bm25_scoring import ImpactScorer, term_max_and_sorted
from .config import Bm25Config
from .corpus import DocStore

if TYPE_CHECKING:
    from collections.abc import Iterator

# Corpus and queries split by one pattern, recorded in the index (``tokenizer_version``) so the
# query side always splits as that corpus was split. 1: bm25s' default splitter (scikit-learn's
# ``\w\w+``), which drops "7" and "b", so the query "tower 7" could not find "tower 7"; indexes
# built before the version was recorded are 1. 2: every word, one character included (the
# default for new indexes). Version 1 stays buildable so data made with it can be rebuilt
# byte for byte (the shipped warm-start adapter's gold, mia.apps.warm_start).
TOKEN_PATTERNS = {1: r"(?u)\b\w\w+\b", 2: r"(?u)\b\w+\b"}
TOKENIZER_VERSION = 2
TOKEN_PATTERN = TOKEN_PATTERNS[TOKENIZER_VERSION]
STOPWORDS_FILE = "stopwords.json"
TERM_MAX_FILE = "term_max.npy"


def _make_stemmer(name: str | None):  # type: ignore[no-untyped-def]
    if not name:
        return None
    import Stemmer

    return Stemmer.Stemmer(name)


def build_bm25(out_dir: Path, cfg: Bm25Config, manifest: Manifest) -> None:
    """Tokenise every passage of the doc store in ``out_dir`` and save a bm25s index there."""
    import bm25s
    from bm25s.tokenization import Tokenized, Tokenizer

    if cfg.tokenizer not in TOKEN_PATTERNS:
        raise MiaError(
            f"bm25.tokenizer must be one of {sorted(TOKEN_PATTERNS)}, got {cfg.tokenizer}"
        )
    pattern = TOKEN_PATTERNS[cfg.tokenizer]
    tokenizer = Tokenizer(
        splitter=pattern, stopwords=cfg.stopwords or None, stemmer=_make_stemmer(cfg.stemmer)
    )
    docs = DocStore(out_dir)
    try:

        def texts() -> Iterator[str]:
            for batch in docs.iter_contents():
                yield from batch

        # Streaming keeps only token ids in memory (ints shared with the vocab dict).
        stream = tokenizer.streaming_tokenize(texts(), update_vocab=True)
        ids = list(tqdm(stream, total=len(docs), unit="doc", desc="tokenize"))
    finally:
        docs.close()
    vocab = tokenizer.get_vocab_dict()
    model = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.variant)
    model.index(Tokenized(ids=ids, vocab=vocab), show_progress=True)
    del ids
    model.save(out_dir, show_progress=False)
    sc = model.scores
    term_max, postings_sorted = term_max_and_sorted(sc["data"], sc["indices"], sc["indptr"])
    np.save(out_dir / TERM_MAX_FILE, term_max)
    # The stopword list is saved rather than looked up again at serve time, so a bm25s upgrade
    # cannot silently change how queries are tokenised.
    (out_dir / STOPWORDS_FILE).write_text(json.dumps(list(tokenizer.stopwords)))
    manifest.params = {
        "k1": cfg.k1,
        "b": cfg.b,
        "variant": cfg.variant,
        "stemmer": cfg.stemmer,
        "token_pattern": pattern,
        "tokenizer_version": cfg.tokenizer,
        "vocab_size": len(vocab),
        "postings_sorted": postings_sorted,  # enables the pruned exact top-k
    }


class QueryTokenizer:
    """Stateless query tokenisation matching bm25s' Tokenizer on the corpus.

    bm25s' Tokenizer grows its word caches with every unseen query word; a long-running server
    must not, so queries map straight through the index vocabulary (stem -> column id).
    """

    def __init__(
        self,
        vocab: dict[str, int],
        stopwords: list[str],
        stemmer: str | None,
        pattern: str = TOKEN_PATTERN,
    ) -> None:
        self.vocab = vocab
        self.stopwords = frozenset(stopwords)
        self.split = re.compile(pattern).findall
        self.stemmer = _make_stemmer(stemmer)

    def __call__(self, queries: list[str]) -> list[list[int]]:
        out = []
        for query in queries:
            words = [w for w in self.split(query.lower()) if w not in self.stopwords]
            terms = self.stemmer.stemWords(words) if self.stemmer is not None else words
            # No known term -> no ids -> no hits (bm25s would score its "" token instead).
            out.append([self.vocab[t] for t in terms if t in self.vocab and t])
        return out


def check_tokenizer(index_dir: Path, manifest: Manifest) -> str:
    """The pattern the index's corpus was split with (its queries are split the same way);
    an unknown version, or a pattern that disagrees with its version, is refused."""
    version = manifest.params.get("tokenizer_version", 1)
    pattern = TOKEN_PATTERNS.get(version)
    recorded = manifest.params.get("token_pattern", pattern)
    if pattern is None or recorded != pattern:
        raise MiaError(
            f"index {index_dir} was built with an unknown BM25 tokenizer (version {version}, "
            f"pattern {recorded!r}); rebuild it with `python -m local_search build`"
        )
    return pattern


class Bm25Retriever(Retriever):
    def __init__(self, index_dir: Path, manifest: Manifest) -> None:
        import bm25s

        super().__init__(index_dir, manifest)
        pattern = check_tokenizer(index_dir, manifest)
        self.model = bm25s.BM25.load(index_dir, mmap=True, load_vocab=True)
        self.num_docs = int(self.model.scores["num_docs"])
        if self.num_docs != manifest.num_docs:
            raise ValueError("bm25 matrix and doc store disagree on the number of passages")
        term_max = None
        if manifest.params.get("postings_sorted"):
            term_max = np.load(index_dir / TERM_MAX_FILE, mmap_mode="r")
        self.scorer = ImpactScorer(
            self.model.scores["data"],
            self.model.scores["indices"],
            self.model.scores["indptr"],
            self.num_docs,
            term_max,
        )
        stopwords = json.loads((index_dir / STOPWORDS_FILE).read_text())
        self.tokenize = QueryTokenizer(
            self.model.vocab_dict, stopwords, manifest.params.get("stemmer"), pattern
        )

    def _search_rows(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        return [self.scorer.top_k(ids, k) for ids in self.tokenize(queries)]
