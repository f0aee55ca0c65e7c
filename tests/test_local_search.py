"""local_search: index building, the Search-R1 /retrieve service, failures that must be clean."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers import sole_error_line

from local_search import ServeConfig, build_index, open_index
from local_search.bm25 import TOKEN_PATTERN, TOKENIZER_VERSION
from local_search.bm25_scoring import ImpactScorer, term_max_and_sorted
from local_search.cli import main as cli_main
from local_search.corpus import iter_corpus
from local_search.server import create_search_app
from mia.errors import MiaError
from mia.http import ServerThread, wait_for_port_file

ROOT = Path(__file__).resolve().parents[1]

FACTS = [
    ("Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
    ("Amazon River", "The Amazon River in South America carries more water than any other river."),
    (
        "Marie Curie",
        "Marie Curie was a physicist who researched radioactivity and won two Nobel Prizes.",
    ),
    (
        "Photosynthesis",
        "Photosynthesis lets green plants turn sunlight, water and carbon dioxide into sugar.",
    ),
    ("Python", "Python is a programming language created by Guido van Rossum, released in 1991."),
    (
        "Eiffel Tower",
        "The Eiffel Tower is a wrought-iron lattice tower in Paris, completed in 1889.",
    ),
    (
        "Honey bee",
        "Honey bees are flying insects that live in colonies and make honey and beeswax.",
    ),
    (
        "Jupiter",
        "Jupiter is the largest planet in the Solar System, a gas giant fifth from the Sun.",
    ),
    ("Mozart", "Wolfgang Amadeus Mozart was a composer of the Classical period born in Salzburg."),
    ("Sahara", "The Sahara is the largest hot desert in the world, covering much of North Africa."),
    ("Penicillin", "Penicillin is an antibiotic discovered by Alexander Fleming in 1928."),
    ("Chess", "Chess is a board game for two players on a checkered board of 64 squares."),
    (
        "Tea",
        "Tea is a beverage made by pouring hot water over leaves of the Camellia sinensis plant.",
    ),
    (
        "Blue whale",
        "The blue whale is a marine mammal and the largest animal known to have existed.",
    ),
    (
        "William Shakespeare",
        "William Shakespeare was an English playwright who wrote Hamlet and Macbeth.",
    ),
    ("Bitcoin", "Bitcoin is a decentralized digital currency recorded on a blockchain ledger."),
    (
        "Apollo 11",
        "Apollo 11 was the spaceflight that first landed humans on the Moon in July 1969.",
    ),
    ("Violin", "The violin is a wooden string instrument played with a bow."),
    ("Tokyo", "Tokyo is the capital of Japan and its most populous city."),
    (
        "Great Barrier Reef",
        "The Great Barrier Reef off Australia is the largest coral reef system.",
    ),
]
# (query, id of the passage that must come first) - ids are "doc-<row>", except row 7 (int 7).
QUERIES = [
    ("highest mountain in the Himalayas", "doc-0"),
    ("who wrote Hamlet", "doc-14"),
    ("largest animal that ever existed", "doc-13"),
    ("antibiotic discovered by Fleming", "doc-10"),
    ("biggest planet in the solar system", 7),
]


def _doc_id(row: int) -> str | int:
    return 7 if row == 7 else f"doc-{row}"


def _passages() -> list[dict]:
    docs = [{"id": _doc_id(i), "contents": f"{t}\n{x}"} for i, (t, x) in enumerate(FACTS)]
    for i in range(len(FACTS), len(FACTS) + 20):  # unrelated filler, so ranking has to work
        docs.append({"id": _doc_id(i), "contents": f"Notice {i}\nTown notice {i}: roads closed."})
    return docs


def _write_corpus(path: Path) -> Path:
    lines = [json.dumps({**d, "url": "ignored extra field"}) for d in _passages()]
    lines.insert(3, "")  # blank lines are skipped
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl")


@pytest.fixture(scope="module")
def bm25_dir(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bm25") / "idx"
    cli_main(["build", "--corpus", str(corpus), "--out", str(out), "--method", "bm25"])
    return out


@pytest.fixture(scope="module")
def bm25(bm25_dir: Path):  # type: ignore[no-untyped-def]
    with open_index(bm25_dir) as r:
        yield r


@pytest.fixture(scope="module")
def bm25_url(bm25) -> str:  # type: ignore[no-untyped-def]
    with ServerThread(create_search_app(bm25, ServeConfig(max_queries=4))) as url:
        yield url


def _error(resp: httpx.Response, status: int, code: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert list(body) == ["error"] and set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]["message"]


# ---------------------------------------------------------------- corpus and BM25 in process


def test_bm25_manifest_and_files(bm25_dir: Path, corpus: Path) -> None:
    import hashlib

    manifest = json.loads((bm25_dir / "index.json").read_text())
    assert manifest["method"] == "bm25"
    assert manifest["num_docs"] == 40
    assert manifest["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert manifest["model"] is None and manifest["faiss"] is None
    assert set(manifest["files"]) == {p.name for p in bm25_dir.iterdir()} - {"index.json"}
    row7 = json.loads((bm25_dir / "docs.jsonl").read_text().splitlines()[7])
    assert row7 == {"id": 7, "contents": f"{FACTS[7][0]}\n{FACTS[7][1]}"}


def test_bm25_search_ranks_the_right_passage(bm25) -> None:  # type: ignore[no-untyped-def]
    results = bm25.search([q for q, _ in QUERIES], topk=3)
    assert [hits[0].id for hits in results] == [want for _, want in QUERIES]
    for hits in results:
        assert len(hits) <= 3
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert all(h.score > 0 for h in hits)
    top = results[0][0]
    assert top.row == 0 and top.document() == {"id": "doc-0", "contents": top.contents}
    assert top.contents == "Mount Everest\n" + FACTS[0][1]


def test_bm25_query_without_known_terms_returns_nothing(bm25) -> None:  # type: ignore[no-untyped-def]
    # Stopwords only / unknown words: like Pyserini, no passage matches.
    assert bm25.search(["the of and", "xyzzyplugh"], topk=3) == [[], []]
    # topk larger than the corpus is clipped to it.
    assert len(bm25.search(["roads closed notice"], topk=100)[0]) == 20


def test_query_tokenizer_matches_bm25s_corpus_tokenizer(bm25) -> None:  # type: ignore[no-untyped-def]
    import Stemmer
    from bm25s.tokenization import Tokenizer

    texts = [d["contents"] for d in _passages()] + [
        "Composers researching THE planets' waters, zorblax!"
    ]
    tok = Tokenizer(splitter=TOKEN_PATTERN, stopwords="en", stemmer=Stemmer.Stemmer("english"))
    corpus_ids = tok.tokenize(texts, update_vocab=True, return_as="string", show_progress=False)
    ours = bm25.tokenize(texts)
    vocab_inv = {v: k for k, v in bm25.tokenize.vocab.items()}
    for mine, theirs in zip(ours[:-1], corpus_ids[:-1], strict=True):
        assert [vocab_inv[i] for i in mine] == theirs
    # Unseen surface forms map through the stem; unknown stems are dropped.
    assert [vocab_inv[i] for i in ours[-1]] == ["compos", "research", "planet", "water"]


def test_one_character_tokens_are_indexed_and_queried(tmp_path: Path) -> None:
    """Regression: the old ``\\w\\w+`` pattern dropped "7", so "tower 7" could not find tower 7."""
    docs = [
        {"id": f"t{n}", "contents": f"Tower {n}\nTower {n} of the harbour, block {n}."}
        for n in (9, 7, 3)
    ] + [{"id": "b", "contents": "Vitamin B\nVitamin b is a nutrient group."}]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "idx"
    cli_main(["build", "--corpus", str(corpus), "--out", str(out), "--method", "bm25"])
    params = json.loads((out / "index.json").read_text())["params"]
    assert params["token_pattern"] == TOKEN_PATTERN
    assert params["tokenizer_version"] == TOKENIZER_VERSION == 2
    with open_index(out) as r:
        hits = r.search(["tower 7", "Tower 3", "vitamin b"], topk=2)
    assert [h[0].id for h in hits] == ["t7", "t3", "b"]
    # The number decides: the matching tower scores strictly above the others.
    assert hits[0][0].score > hits[0][1].score


def test_an_index_is_queried_with_its_own_tokenizer(corpus: Path, tmp_path: Path) -> None:
    """Version 1 (words of 2+ characters, bm25s' default) stays buildable and is queried with
    its own splitter; an index whose pattern disagrees with its version is refused."""
    from local_search import BuildConfig
    from local_search.config import Bm25Config

    cfg = BuildConfig(bm25=Bm25Config(tokenizer=1))
    old = build_index(corpus, tmp_path / "v1", "bm25", config=cfg)
    assert old.params["tokenizer_version"] == 1
    assert old.params["token_pattern"] == r"(?u)\b\w\w+\b"
    with open_index(tmp_path / "v1") as r:
        assert (
            r.tokenize(["tower 7 b"]) == r.tokenize(["tower"]) != [[]]
        )  # one-character words dropped
    d = _copy_index(tmp_path / "v1", tmp_path / "legacy")
    raw = json.loads((d / "index.json").read_text())
    del raw["params"]["tokenizer_version"]  # indexes before the version was recorded
    (d / "index.json").write_text(json.dumps(raw))
    with open_index(d) as r:
        assert r.tokenize(["tower 7"]) == r.tokenize(["tower"])
    raw["params"]["tokenizer_version"] = 2  # v2 with v1's pattern: inconsistent
    (d / "index.json").write_text(json.dumps(raw))
    with pytest.raises(MiaError, match=r"unknown BM25 tokenizer .* rebuild it with"):
        open_index(d)
    with pytest.raises(MiaError, match="bm25.tokenizer must be one of"):
        build_index(
            corpus, tmp_path / "v3", "bm25", config=BuildConfig(bm25=Bm25Config(tokenizer=3))
        )


def test_scores_match_bm25s_own_retriever(bm25) -> None:  # type: ignore[no-untyped-def]
    queries = [q for q, _ in QUERIES] + ["town notice roads", "capital city Japan Tokyo"]
    ours = bm25._search_rows(queries, 5)
    rows, scores = bm25.model.retrieve(bm25.tokenize(queries), k=5, show_progress=False)
    for mine, their_rows, their_scores in zip(ours, rows, scores, strict=True):
        expected = [float(s) for s in their_scores if s > 0]
        assert [s for _, s in mine] == pytest.approx(expected, rel=1e-6)
        if len(mine) == 1 or mine[0][1] > mine[1][1]:
            assert mine[0][0] == int(their_rows[0])
    # Equal scores (the 20 identical notices) are broken by row, so results are reproducible.
    assert [row for row, _ in ours[-2]] == [20, 21, 22, 23, 24]


def _csc(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cols = [np.flatnonzero(dense[:, t]) for t in range(dense.shape[1])]
    indptr = np.concatenate([[0], np.cumsum([len(c) for c in cols])]).astype(np.int64)
    indices = np.concatenate(cols).astype(np.int32)
    data = np.concatenate([dense[c, t] for t, c in enumerate(cols)]).astype(np.float32)
    return data, indices, indptr


def test_impact_scorer_is_exact_on_both_paths() -> None:
    rng = np.random.default_rng(0)
    n_docs, n_terms = 400, 50
    dense = np.zeros((n_docs, n_terms), dtype=np.float32)
    for t in range(n_terms):  # Zipf-like document frequencies: a few very common terms
        rows = rng.choice(n_docs, max(1, int(n_docs * 0.7 / (t + 1))), replace=False)
        dense[rows, t] = rng.uniform(0.1, 3.0, len(rows))
    data, indices, indptr = _csc(dense)
    term_max, ok = term_max_and_sorted(data, indices, indptr)
    assert ok and np.array_equal(term_max, dense.max(axis=0))
    pruned = ImpactScorer(data, indices, indptr, n_docs, term_max, budget=40)
    plain = ImpactScorer(data, indices, indptr, n_docs, None)
    exhaustive_calls = []
    inner = pruned._exhaustive
    pruned._exhaustive = lambda *a: exhaustive_calls.append(1) or inner(*a)  # type: ignore[method-assign]
    for trial in range(300):
        query = rng.choice(n_terms, size=int(rng.integers(1, 5))).tolist()  # repeats allowed
        k = int(rng.integers(1, 8))
        truth = dense[:, query].astype(np.float64).sum(axis=1)
        rows = np.flatnonzero(truth > 0)
        expected = rows[np.lexsort((rows, -truth[rows]))][:k].tolist()
        for scorer in (pruned, plain):
            got = scorer.top_k(query, k)
            assert [r for r, _ in got] == expected, (trial, query, k)
            assert [s for _, s in got] == pytest.approx(truth[expected].tolist(), rel=1e-5)
    assert 30 < len(exhaustive_calls) < 270  # both paths really ran
    assert pruned.top_k([], 3) == [] and pruned.top_k([1], 0) == []
    shuffled = indices.copy()
    shuffled[indptr[0] : indptr[1]] = shuffled[indptr[0] : indptr[1]][::-1]
    assert term_max_and_sorted(data, shuffled, indptr)[1] is False


def test_corpus_validation_names_the_line(tmp_path: Path) -> None:
    cases = {
        '{"id": "a", "contents": "ok"}\n{"id": "b", "contents": ': "line 2: invalid JSON",
        '{"id": "a", "contents": "ok"}\n\n[1, 2]\n': "line 3: expected a JSON object",
        '{"id": "a"}\n': 'line 1: "contents" must be a string',
        '{"id": true, "contents": "x"}\n': 'line 1: "id" must be a string or an integer',
        "\n\n": "has no passages",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"c{i}.jsonl"
        path.write_text(text)
        with pytest.raises(MiaError, match=message):
            build_index(path, tmp_path / f"idx{i}")
        assert not (tmp_path / f"idx{i}").exists()
    path = tmp_path / "titles.jsonl"
    path.write_text('{"title": "T", "text": "body", "id": "x"}\n{"contents": "no id"}\n')
    assert list(iter_corpus(path)) == [("x", "T\nbody"), ("1", "no id")]
    with pytest.raises(MiaError, match="corpus file not found"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "idx")


# ---------------------------------------------------------------- the Search-R1 service


def test_retrieve_roundtrip_subprocess(bm25_dir: Path, tmp_path: Path) -> None:
    """The real CLI: serve --port 0 --port-file, then the exact Search-R1 payloads."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_search", "serve", "--index", str(bm25_dir), "--port", "0"]
        + ["--port-file", str(port_file)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        port = wait_for_port_file(port_file, timeout=60, proc=proc)
        url = f"http://127.0.0.1:{port}"
        body = {"queries": ["who wrote Hamlet", "largest hot desert"], "topk": 2}
        resp = httpx.post(f"{url}/retrieve", json={**body, "return_scores": True}, timeout=30)
        assert resp.status_code == 200, resp.text
        result = resp.json()
        assert list(result) == ["result"] and len(result["result"]) == 2
        for row in result["result"]:
            assert len(row) <= 2
            for item in row:
                assert list(item) == ["document", "score"]
                assert list(item["document"]) == ["id", "contents"]
                assert isinstance(item["score"], float)
        first = result["result"][0][0]
        assert first["document"] == {
            "id": "doc-14",
            "contents": "William Shakespeare\n" + FACTS[14][1],
        }
        assert result["result"][1][0]["document"]["id"] == "doc-9"

        health = httpx.get(f"{url}/health", timeout=10).json()
        assert health["status"] == "ok" and health["service"] == "local_search"
        assert health["index"]["method"] == "bm25" and health["index"]["num_docs"] == 40
        assert health["default_topk"] == 3 and health["max_topk"] == 100
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_return_scores_false_gives_bare_documents(bm25_url: str) -> None:
    resp = httpx.post(
        f"{bm25_url}/retrieve",
        json={"queries": ["capital of Japan"], "topk": 1, "return_scores": False},
    )
    assert resp.status_code == 200
    assert resp.json() == {"result": [[{"id": "doc-18", "contents": "Tokyo\n" + FACTS[18][1]}]]}


def test_defaults_follow_search_r1(bm25_url: str) -> None:
    # No topk -> the server's --topk (3); no return_scores -> false (Search-R1's defaults).
    resp = httpx.post(f"{bm25_url}/retrieve", json={"queries": ["roads closed town notice"]})
    assert resp.status_code == 200
    (row,) = resp.json()["result"]
    assert len(row) == 3 and all(set(doc) == {"id", "contents"} for doc in row)


@pytest.mark.parametrize(
    ("payload", "status", "code", "fragment"),
    [
        ({"queries": [], "topk": 3}, 422, "invalid_request", "queries"),
        ({"queries": "who wrote Hamlet"}, 422, "invalid_request", "queries"),
        ({"queries": ["ok", 5]}, 422, "invalid_request", "queries.1"),
        ({"queries": [None]}, 422, "invalid_request", "queries.0"),
        ({"topk": 3}, 422, "invalid_request", "queries"),
        ({"queries": ["x"], "topk": 0}, 422, "invalid_request", "topk must be between 1 and 100"),
        ({"queries": ["x"], "topk": 101}, 422, "invalid_request", "topk must be between"),
        ({"queries": ["x"], "topk": "3"}, 422, "invalid_request", "topk"),
        ({"queries": ["x"], "topk": 2.5}, 422, "invalid_request", "topk"),
        ({"queries": ["x"], "return_scores": "yes"}, 422, "invalid_request", "return_scores"),
        ({"queries": ["ok", "  "]}, 422, "invalid_request", "queries.1: empty query"),
        ({"queries": ["a", "b", "c", "d", "e"]}, 422, "invalid_request", "at most 4 queries"),
        ([1, 2], 422, "invalid_request", "body"),
    ],
)
def test_bad_requests_get_4xx_envelope(
    bm25_url: str, payload: object, status: int, code: str, fragment: str
) -> None:
    msg = _error(httpx.post(f"{bm25_url}/retrieve", json=payload), status, code)
    assert fragment in msg


def test_malformed_json_and_oversized_body(bm25) -> None:  # type: ignore[no-untyped-def]
    app = create_search_app(bm25, max_body_bytes=300)
    with ServerThread(app) as url:
        headers = {"content-type": "application/json"}
        resp = httpx.post(f"{url}/retrieve", content=b'{"queries": [', headers=headers)
        _error(resp, 400, "bad_json")
        resp = httpx.post(f"{url}/retrieve", json={"queries": ["x" * 400]})
        assert "over 300 bytes" in _error(resp, 413, "payload_too_large")
        _error(httpx.get(f"{url}/retrieve"), 405, "method_not_allowed")


def test_bearer_token_enforced(bm25) -> None:  # type: ignore[no-untyped-def]
    with ServerThread(create_search_app(bm25, token="s3cret")) as url:
        body = {"queries": ["who wrote Hamlet"], "topk": 1}
        _error(httpx.post(f"{url}/retrieve", json=body), 401, "unauthorized")
        bad = {"authorization": "Bearer nope"}
        _error(httpx.post(f"{url}/retrieve", json=body, headers=bad), 401, "unauthorized")
        ok = httpx.post(f"{url}/retrieve", json=body, headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["result"][0][0]["id"] == "doc-14"
        assert httpx.get(f"{url}/health").status_code == 200  # health stays open


# ---------------------------------------------------------------- bad and interrupted indexes


def _copy_index(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _corrupt(kind: str, d: Path) -> None:
    if kind == "no_manifest":
        (d / "index.json").unlink()
    elif kind == "manifest_garbage":
        (d / "index.json").write_text("{not json")
    elif kind == "missing_file":
        (d / "indptr.csc.index.npy").unlink()
    elif kind == "truncated_file":
        with open(d / "docs.jsonl", "r+b") as f:
            f.truncate(10)
    elif kind == "garbage_same_size":
        f = d / "vocab.index.json"
        f.write_bytes(b"\x00" * f.stat().st_size)


CORRUPTIONS = {
    "no_manifest": "is not a local_search index",
    "manifest_garbage": "is corrupt: unreadable index.json",
    "missing_file": "is corrupt: missing file indptr.csc.index.npy",
    "truncated_file": "is corrupt: docs.jsonl is 10 bytes",
    # Same size: the checksum of the file's first/last 64 KiB (all of this small file) differs.
    "garbage_same_size": "is corrupt: vocab.index.json does not match its recorded checksum",
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_corrupt_index_is_a_clean_error(bm25_dir: Path, tmp_path: Path, kind: str) -> None:
    d = _copy_index(bm25_dir, tmp_path / "idx")
    _corrupt(kind, d)
    with pytest.raises(MiaError, match=CORRUPTIONS[kind]):
        open_index(d)


@pytest.mark.parametrize("kind", ["missing_dir", "no_manifest", "garbage_same_size"])
def test_serve_bad_index_exits_2_with_one_line(bm25_dir: Path, tmp_path: Path, kind: str) -> None:
    d = tmp_path / "idx"
    if kind != "missing_dir":
        _copy_index(bm25_dir, d)
        _corrupt(kind, d)
    proc = subprocess.run(
        [sys.executable, "-m", "local_search", "serve", "--index", str(d), "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = sole_error_line(proc)
    assert line.startswith("local_search: error: ")
    assert str(d) in line
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------- checksums


def _overwrite(path: Path, offset: int, data: bytes, *, keep_mtime: bool = False) -> None:
    """Overwrite bytes in place (the size stays); optionally put the old mtime back."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


def _serve_exit(d: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "local_search", "serve", "--index", str(d), "--port", "0", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_manifest_records_checksums(bm25_dir: Path) -> None:
    import hashlib

    manifest = json.loads((bm25_dir / "index.json").read_text())
    assert set(manifest["checksums"]) == set(manifest["files"])
    for name, rec in manifest["checksums"].items():
        f = bm25_dir / name
        assert rec["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
        assert (rec["size"], rec["mtime_ns"]) == (f.stat().st_size, f.stat().st_mtime_ns)


@pytest.mark.parametrize("name", ["indices.csc.index.npy", "docs.jsonl", "docs.offsets.npy"])
def test_same_size_overwrite_refuses_to_start(bm25_dir: Path, tmp_path: Path, name: str) -> None:
    d = _copy_index(bm25_dir, tmp_path / "idx")
    f = d / name
    _overwrite(f, f.stat().st_size // 2, b"\xff\x00\xfe")  # the middle; the mtime moves
    # (These files are under 128 KiB, so their edges' checksum covers every byte.)
    want = f"index {d} is corrupt: {name} does not match its recorded checksum"
    with pytest.raises(MiaError, match=want):
        open_index(d)
    if name == "docs.jsonl":  # the real command: exit 2, one line, before binding a port
        proc = _serve_exit(d)
        assert proc.returncode == 2 and proc.stdout == ""
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"local_search: error: {want}"), lines
        assert lines[0].endswith("(rebuild it, or restore the folder from a copy)")


def test_fast_check_trusts_mtime_full_check_reads_every_byte(tmp_path: Path) -> None:
    """A change in the middle of a big file with its mtime put back passes the fast check (it
    reads sizes, mtimes and the first/last 64 KiB) and fails --verify full; a change in the
    edges fails both."""
    from local_search.integrity import record_all, verify_index

    d = tmp_path / "idx"
    d.mkdir()
    (d / "big.bin").write_bytes(os.urandom(300_000))
    files = {"big.bin": 300_000}
    checksums = record_all(d, ["big.bin"])
    assert verify_index(d, files, checksums, "full") == []
    original = (d / "big.bin").read_bytes()
    # A write moves the mtime: the fast check hashes the whole file and sees the middle change.
    _overwrite(d / "big.bin", 150_000, b"tampered")
    with pytest.raises(MiaError, match="big.bin does not match its recorded sha256"):
        verify_index(d, files, checksums, "fast")
    # Put back byte for byte (new mtime): accepted after the full hash, with a note.
    _overwrite(d / "big.bin", 150_000, original[150_000:150_008])
    notes = verify_index(d, files, checksums, "fast")
    assert len(notes) == 1 and "big.bin changed mtime but not content" in notes[0]
    checksums["big.bin"]["mtime_ns"] = (d / "big.bin").stat().st_mtime_ns
    _overwrite(d / "big.bin", 150_000, b"tampered", keep_mtime=True)
    assert verify_index(d, files, checksums, "fast") == []  # documented blind spot
    with pytest.raises(MiaError, match="big.bin does not match its recorded sha256"):
        verify_index(d, files, checksums, "full")
    _overwrite(d / "big.bin", 299_990, b"tail", keep_mtime=True)
    with pytest.raises(MiaError, match=r"big.bin does not match its recorded checksum \(first"):
        verify_index(d, files, checksums, "fast")


def test_verify_full_flag_and_copied_index(
    bm25_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    # A copy that did not keep mtimes: the fast check hashes every file once and accepts it.
    d = tmp_path / "idx"
    shutil.copytree(bm25_dir, d, copy_function=shutil.copyfile)
    with caplog.at_level("WARNING", logger="local_search"), open_index(d) as r:
        assert r.search(["who wrote Hamlet"], 1)[0][0].id == "doc-14"
    assert "changed mtime but not content" in caplog.text
    cli_main(["verify", "--index", str(d), "--update"])  # records the copy's mtimes
    manifest = json.loads((d / "index.json").read_text())
    assert all(
        rec["mtime_ns"] == (d / n).stat().st_mtime_ns for n, rec in manifest["checksums"].items()
    )
    caplog.clear()
    with (
        caplog.at_level("WARNING", logger="local_search"),
        open_index(d, ServeConfig(verify="full")),
    ):
        pass
    assert caplog.text == ""
    # Damage with the mtime put back: --verify full compares every byte with the sha256.
    f = d / "docs.jsonl"
    _overwrite(f, f.stat().st_size // 2, b"#", keep_mtime=True)
    want = "docs.jsonl does not match its recorded sha256"
    with pytest.raises(MiaError, match=want):
        open_index(d, ServeConfig(verify="full"))
    proc = _serve_exit(d, "--verify", "full")
    assert proc.returncode == 2 and want in proc.stderr and len(proc.stderr.splitlines()) == 1
    with pytest.raises(MiaError, match=want):
        cli_main(["verify", "--index", str(d)])


def test_index_without_checksums_is_served_with_a_warning(
    bm25_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = _copy_index(bm25_dir, tmp_path / "idx")
    manifest = json.loads((d / "index.json").read_text())
    del manifest["checksums"]  # as built before checksums were recorded
    (d / "index.json").write_text(json.dumps(manifest))
    with caplog.at_level("WARNING", logger="local_search"), open_index(d) as r:
        assert r.search(["who wrote Hamlet"], 1)[0][0].id == "doc-14"
    assert f"index {d} has no checksums" in caplog.text
    with pytest.raises(MiaError, match="has no checksums"):
        cli_main(["verify", "--index", str(d)])
    cli_main(["verify", "--index", str(d), "--update"])
    assert set(json.loads((d / "index.json").read_text())["checksums"]) == set(manifest["files"])
    cli_main(["verify", "--index", str(d)])
    _overwrite(d / "docs.offsets.npy", 200, b"\x01")
    with pytest.raises(MiaError, match="docs.offsets.npy does not match"):
        open_index(d)


def test_mia_cli_search_command(tmp_path: Path) -> None:
    from mia.cli import main as mia_main

    with pytest.raises(SystemExit) as exc:
        mia_main(["search", "serve", "--index", str(tmp_path / "nope")])
    assert exc.value.code == 2


def test_failed_rebuild_keeps_the_old_index(bm25_dir: Path, tmp_path: Path) -> None:
    d = _copy_index(bm25_dir, tmp_path / "idx")
    before = (d / "index.json").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "contents": "fine"}\n' * 50 + "oops\n")
    with pytest.raises(MiaError, match="line 51: invalid JSON"):
        build_index(bad, d)
    assert (d / "index.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "idx"]  # no temp left
    with open_index(d) as r:
        assert r.search(["who wrote Hamlet"], 1)[0][0].id == "doc-14"


def test_killed_build_leaves_no_valid_looking_index(tmp_path: Path) -> None:
    """SIGKILL halfway through reading the corpus (fed through a FIFO, so 'halfway' is exact)."""
    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "idx"
    proc = subprocess.Popen(
        [sys.executable, "-m", "local_search", "build", "--corpus", str(fifo), "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fd = None
    try:
        deadline = time.monotonic() + 60
        while fd is None:  # O_NONBLOCK open fails with ENXIO until the builder opens the FIFO
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as err:
                if err.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise
                assert proc.poll() is None, "builder exited early"
                time.sleep(0.05)
        half = "".join(json.dumps(d) + "\n" for d in _passages()[:10])
        os.write(fd, half.encode())
        # The builder is mid-way for sure: its corpus is still open for writing here.
        temp_dirs: list[Path] = []
        while not temp_dirs:
            assert time.monotonic() < deadline, "builder never wrote its temp folder"
            temp_dirs = [t for t in tmp_path.glob(".idx.tmp-*") if (t / "docs.jsonl").exists()]
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=20)
    finally:
        if fd is not None:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not out.exists()
    (leftover,) = temp_dirs
    assert not (leftover / "index.json").exists()
    with pytest.raises(MiaError, match="is not a local_search index"):
        open_index(leftover)


# ---------------------------------------------------------------- dense


@pytest.fixture(scope="module")
def dense_dirs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dense")
    return {
        kind: build_index(corpus, root / kind, "dense", faiss=kind) and root / kind
        for kind in ("flat", "ivfpq", "hnsw")
    }


@pytest.mark.parametrize("kind", ["flat", "ivfpq", "hnsw"])
def test_dense_index_ranks_the_right_passage(dense_dirs: dict[str, Path], kind: str) -> None:
    manifest = json.loads((dense_dirs[kind] / "index.json").read_text())
    assert manifest["method"] == "dense" and manifest["faiss"] == kind
    assert manifest["model"] == "all-MiniLM-L6-v2" and manifest["dim"] == 384
    assert manifest["params"]["query_prefix"] == ""
    assert "embeddings.scratch.npy" not in manifest["files"]
    assert ("vectors.f16.npy" in manifest["files"]) == (kind == "ivfpq")
    with open_index(dense_dirs[kind]) as r:
        results = r.search([q for q, _ in QUERIES], topk=3)
    assert [hits[0].id for hits in results] == [want for _, want in QUERIES]
    for hits in results:
        assert len(hits) == 3
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(-1.0 <= s <= 1.0001 for s in scores)  # cosines (ivfpq: re-ranked exactly)


def test_ivfpq_rerank_matches_flat_and_can_be_off(dense_dirs: dict[str, Path]) -> None:
    queries = [q for q, _ in QUERIES] + ["a sweet drink from leaves", "roads closed"]
    with open_index(dense_dirs["flat"]) as flat, open_index(dense_dirs["ivfpq"]) as ivf:
        exact = flat.search(queries, 5)
        reranked = ivf.search(queries, 5)
    for a, b in zip(exact, reranked, strict=True):
        # 40 passages, one IVF list, 50 candidates: re-ranking sees everything.
        assert [h.row for h in a] == [h.row for h in b]
        assert [h.score for h in b] == pytest.approx([h.score for h in a], abs=2e-3)  # float16
    with open_index(dense_dirs["ivfpq"], ServeConfig(rerank=0)) as pq_only:
        assert pq_only.vectors is None
        hits = pq_only.search(queries, 3)
    assert all(len(row) == 3 for row in hits)


def test_dense_service_roundtrip(dense_dirs: dict[str, Path]) -> None:
    with open_index(dense_dirs["flat"]) as r, ServerThread(create_search_app(r)) as url:
        body = {"queries": ["who wrote Hamlet", "a sweet drink from leaves"], "topk": 2}
        resp = httpx.post(f"{url}/retrieve", json={**body, "return_scores": True}, timeout=30)
        assert resp.status_code == 200
        rows = resp.json()["result"]
        assert [row[0]["document"]["id"] for row in rows] == ["doc-14", "doc-12"]
        assert all(list(item) == ["document", "score"] for row in rows for item in row)
        health = httpx.get(f"{url}/health").json()
        assert health["index"]["faiss"] == "flat" and health["index"]["model"] == "all-MiniLM-L6-v2"


def test_dense_prefixes_and_unknown_model(tmp_path: Path, corpus: Path) -> None:
    from local_search.dense import prefixes

    assert prefixes("intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert prefixes("all-MiniLM-L6-v2") == ("", "")
    with pytest.raises(MiaError, match="cannot load embedder 'no-such-org/no-such-model'"):
        build_index(corpus, tmp_path / "idx", "dense", model="no-such-org/no-such-model")
    assert not (tmp_path / "idx").exists()
