"""The routes behind the memory inspector, over HTTP (real uvicorn, real SQLite): ``/memory``'s
explain mode against an independent recomputation with the store's scoring code, SQL paging /
filter / search (also over 100k rows), the memory history table and its migration from a
version-1 database, browser sessions (cookie, CSRF header, sign-in), the runs folder."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from role_fixtures import memory_client

from memory_serve.config import StoreConfig, load_config
from memory_serve.records import NewMemory
from memory_serve.scoring import combined_score, minmax, mixed_similarity, rank
from memory_serve.service import MemoryService
from memory_serve.store import MemoryStore
from mia.embedding import shared_embedder
from mia.errors import MiaError
from mia.http import session_cookie_name, session_value

TOKEN = "t0ken-for-tests"


class TinyEmbedder:
    """Deterministic 8-dim unit vectors from a hash (for stores too big for a real model)."""

    name = "tiny-hash"
    dim = 8

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            if t.strip():
                raw = np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], dtype=np.int16)
                v = raw[: self.dim].astype(np.float32)
                out[i] = v / (np.linalg.norm(v) or 1.0)
        return out


@contextlib.contextmanager
def running(
    tmp_path: Path,
    overrides: tuple[str, ...] = (),
    token: str | None = None,
    embedder=None,
) -> Iterator[tuple[httpx.Client, MemoryService]]:
    cfg = load_config(
        None,
        [
            "llm.enabled=false",
            "compress.mode=rules",
            f"ui.runs_dir={tmp_path / 'runs'}",
            *overrides,
        ],
    )
    store = MemoryStore(tmp_path / "memory.sqlite", embedder or shared_embedder(), cfg.store)
    with memory_client(cfg, store, token=token) as served:
        yield served


def save(client: httpx.Client, question: str, judgement: str = "correct", **kw) -> dict:
    body = {"question": question, "judgement": judgement, "workflow_summary": "1. s", **kw}
    r = client.post("/memories", json=body)
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


QUESTIONS = [
    "Where is the Eiffel Tower?",
    "Who designed the Eiffel Tower?",
    "Which river flows through Paris?",
    "What is the capital of Australia?",
    "Who painted the Mona Lisa?",
    "How long is the Nile?",
    "How deep is Lake Baikal?",
    "Which city hosts the Louvre?",
]


def recompute(db: Path, cfg: StoreConfig, question: str, caption: str, k: int) -> dict:
    """The ranking from the stored embeddings alone (an independent read of the SQLite file)."""
    conn = sqlite3.connect(db)
    rows = conn.execute(
        "SELECT id, judgement, win_rate, q_emb, c_emb FROM memories "
        "WHERE modality = ? AND category = 'others' ORDER BY id",
        ("text-image" if caption else "text-only",),
    ).fetchall()
    conn.close()
    ids = np.array([r[0] for r in rows])
    correct = np.array([r[1] == "correct" for r in rows])
    win = np.array([r[2] for r in rows], dtype=np.float64)
    qm = np.stack([np.frombuffer(r[3], dtype=np.float32) for r in rows])
    cm = np.stack([np.frombuffer(r[4], dtype=np.float32) for r in rows])
    vecs = shared_embedder().encode([question, caption])
    r = cfg.retrieval
    sim = mixed_similarity(qm, cm, vecs[0], vecs[1], r.question_weight, r.caption_weight)
    norm = minmax(sim)
    score = combined_score(norm, win, r.similarity_weight, r.win_rate_weight)
    order = rank(ids, score)
    out = {}
    for side, mask in (("positives", correct), ("negatives", ~correct)):
        picked = [i for i in order if mask[i]][:k]
        out[side] = [
            (int(ids[i]), float(sim[i]), float(norm[i]), float(win[i]), float(score[i]))
            for i in picked
        ]
    return out


def test_explain_equals_memory_and_the_scoring_code(tmp_path: Path) -> None:
    with running(tmp_path) as (client, service):
        for i, q in enumerate(QUESTIONS):
            save(client, q, "correct" if i % 3 else "incorrect")
            save(
                client,
                q + " (with a map)",
                "correct" if i % 2 else "incorrect",
                image_caption="a map",
            )
        # Credit moves win-rates away from 1.0 so the win-rate term matters.
        save(client, "Where exactly is the Eiffel Tower?", "incorrect", used_memory_ids=[1, 3, 5])
        save(client, "Who drew the Mona Lisa?", "correct", used_memory_ids=[9, 3])
        for question, caption, k in (
            ("Where can I see the Eiffel Tower?", "", 3),
            ("Which painter made the Mona Lisa?", "", 2),
            ("Where is the Eiffel Tower on this map?", "a map of Paris", 2),
        ):
            body = {"question": question, "mem_top_k": k}
            if caption:
                body["image_caption"] = caption
            plain = client.post("/memory", json=body).json()
            got = client.post("/memory", json={**body, "explain": True}).json()
            assert "explain" not in plain  # the reference payload is unchanged
            x = got.pop("explain")
            assert got == plain  # same context and ids: explain only adds the numbers
            assert [s["id"] for s in x["positives"]] == plain["positive_ids"]
            assert [s["id"] for s in x["negatives"]] == plain["negative_ids"]
            want = recompute(tmp_path / "memory.sqlite", service.cfg.store, question, caption, k)
            for side in ("positives", "negatives"):
                shown = [
                    (s["id"], s["similarity"], s["normalised"], s["win_rate"], s["score"])
                    for s in x[side]
                ]
                assert shown == want[side]  # exact: the same float operations
                assert [s["rank"] for s in x[side]] == list(range(1, len(shown) + 1))
                for s in x[side]:
                    assert s["score"] == 0.7 * s["normalised"] + 0.3 * s["win_rate"]
            assert x["caption_used"] is bool(caption)
            assert x["modality"] == ("text-image" if caption else "text-only")
            assert (x["category"], x["top_k"]) == ("others", k)
            assert x["bucket_size"] == (8 if caption else 10)
            sims = [s["similarity"] for side in ("positives", "negatives") for s in x[side]]
            assert x["similarity_min"] <= min(sims) and x["similarity_max"] >= max(sims)
        # pass_num and the similarity floor are applied as /memory applies them.
        body = {"question": "Where is the Eiffel Tower?", "pass_num": 1, "min_similarity": 0.3}
        plain = client.post("/memory", json=body).json()
        x = client.post("/memory", json={**body, "explain": True}).json()["explain"]
        assert [s["id"] for s in x["positives"]] == plain["positive_ids"]
        assert all(s["similarity"] >= 0.3 for s in x["positives"] + x["negatives"])
        assert (x["pass_num"], x["min_similarity"]) == (1, 0.3)
        # Batches explain per item; an empty bucket explains as empty.
        out = client.post(
            "/memory",
            json=[{"question": "q", "explain": True, "category": "time"}, {"question": "q"}],
        ).json()
        assert out[0]["explain"]["bucket_size"] == 0 and out[0]["explain"]["similarity_min"] is None
        assert "explain" not in out[1]


def test_paging_filters_search_and_history(tmp_path: Path) -> None:
    with running(tmp_path) as (client, service):
        for i, q in enumerate(QUESTIONS):
            save(client, q, "correct" if i % 2 else "incorrect", source="seed", data_id=f"d{i}")
        save(client, "What does 100% mean_here?", "correct", image_caption="a sign")
        save(client, "Where is the Eiffel Tower exactly?", "correct", used_memory_ids=[1, 2])
        save(
            client,
            "Where was the Eiffel Tower built?",
            "incorrect",
            used_memory_ids=[1],
            data_id="x",
        )

        def page(**params) -> dict:
            r = client.get("/memories", params=params)
            assert r.status_code == 200, r.text
            return r.json()

        records = service.store.records()
        everything = page(limit=500)
        assert everything["total"] == 11
        assert [m["id"] for m in everything["memories"]] == [r.id for r in reversed(records)]
        m1 = next(m for m in everything["memories"] if m["id"] == 1)
        assert (m1["usage_count"], m1["success_count"], m1["win_rate"]) == (3, 2, 2 / 3)
        # Paging walks the same order without overlap.
        pages = [page(limit=4, offset=o) for o in (0, 4, 8)]
        assert [m["id"] for p in pages for m in p["memories"]] == [
            m["id"] for m in everything["memories"]
        ]
        assert [len(p["memories"]) for p in pages] == [4, 4, 3]
        # Search: case-insensitive substring of question or summary; % and _ are literal.
        got = page(q="EIFFEL")
        assert {m["id"] for m in got["memories"]} == {
            r.id for r in records if "eiffel" in r.question.lower()
        }
        assert got["total"] == 4
        assert [m["id"] for m in page(q="100%")["memories"]] == [9]
        assert [m["id"] for m in page(q="n_h")["memories"]] == [9]
        assert page(q="0%m")["total"] == 0  # a literal %, not a wildcard
        assert page(q="s_t")["total"] == 0  # a literal _ ("is the" would match a wildcard)
        assert [m["id"] for m in page(q="#3")["memories"]] == [3]  # an id
        # Filters, alone and together.
        assert {m["id"] for m in page(judgement="incorrect")["memories"]} == {
            r.id for r in records if r.judgement == "incorrect"
        }
        assert [m["id"] for m in page(bucket="text-image/others")["memories"]] == [9]
        assert page(source="seed", judgement="correct", q="the")["total"] == len(
            [r for r in records if r.source == "seed" and r.correct and "the" in r.question.lower()]
        )
        ranked = page(sort="win_rate_asc", limit=1)["memories"][0]
        assert ranked["id"] == 1 and ranked["win_rate"] == 2 / 3
        assert page(sort="uses", limit=1)["memories"][0]["id"] == 1
        # Bad parameters are 422 with the envelope.
        for params in ({"sort": "x"}, {"judgement": "maybe"}, {"bucket": "nope"}, {"limit": 0}):
            r = client.get("/memories", params=params)
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"

        # History: which trajectories used a memory, and how they ended.
        d = client.get("/memories/1").json()
        assert d["uses"] == 2 and d["memory"]["question"] == QUESTIONS[0]
        assert [
            (h["question"], h["success"], h["data_id"], h["result_id"]) for h in d["history"]
        ] == [
            ("Where was the Eiffel Tower built?", False, "x", 11),
            ("Where is the Eiffel Tower exactly?", True, "", 10),
        ]
        assert client.get("/memories/2").json()["uses"] == 1
        assert (
            client.get("/memories/1", params={"history": 1}).json()["history"][0]["result_id"] == 11
        )
        r = client.get("/memories/999")
        assert r.status_code == 404 and r.json()["error"]["code"] == "no_such_memory"
        # A memory's history goes with it (replaced, evicted, cleared).
        service.store.delete([1])
        assert service.store.history(1) == (0, [])
        assert client.post("/clear_memory", json={}).status_code == 200
        assert page()["total"] == 0 and service.store.history(2) == (0, [])


def test_history_in_backups_and_migration_from_schema_1(tmp_path: Path) -> None:
    emb = TinyEmbedder()
    db = tmp_path / "old.sqlite"
    with MemoryStore(db, emb) as store:
        store.add(NewMemory("a question", "1. s", "correct"))
        store.add(NewMemory("another question", "1. s", "correct", used_memory_ids=[1]))
        store.backup(tmp_path / "v2.sqlite")
    # Make it a version-1 file: no history table, no new indexes, schema 1.
    conn = sqlite3.connect(db)
    conn.executescript(
        "DROP TABLE memory_uses; DROP INDEX memories_listing;"
        "UPDATE meta SET value = '1' WHERE key = 'schema_version';"
    )
    conn.close()
    with MemoryStore(db, emb) as store:
        version = store._conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()[0]
        assert version == "2"
        assert [r.id for r in store.records()] == [1, 2] and store.get(1).usage_count == 2
        assert store.history(1) == (0, [])  # nothing recorded uses before
        store.credit([1], success=False, question="later", data_id="z")
        assert [(h["question"], h["success"]) for h in store.history(1)[1]] == [("later", False)]
        # A version-2 backup brings its history; a version-1 file loads without one.
        store.restore(tmp_path / "v2.sqlite")
        assert [h["question"] for h in store.history(1)[1]] == ["another question"]
        store.credit([2], success=True, question="q")
        assert store.history(2)[1][0]["id"] == 2  # history ids continue after the backup's
        v1 = tmp_path / "v1.sqlite"
        store.backup(v1)
        conn = sqlite3.connect(v1)
        conn.executescript(
            "DROP TABLE memory_uses; UPDATE meta SET value = '1' WHERE key = 'schema_version';"
        )
        conn.close()
        store.restore(v1)
        assert len(store) == 2 and store.history(1) == (0, [])
    # A newer schema than this MIA knows is refused with one line.
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = '9' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(MiaError, match="memory schema version 9"):
        MemoryStore(db, emb)


def test_paging_over_100k_memories(tmp_path: Path) -> None:
    """100k rows inserted directly; pages, filters and search stay correct (timing: bench/)."""
    emb = TinyEmbedder()
    db = tmp_path / "big.sqlite"
    MemoryStore(db, emb).close()
    n = 100_000
    blob = np.zeros(8, dtype=np.float32)
    blob[0] = 1.0
    rows = [
        (
            f"question number {i}" + (" about rivers" if i % 1000 == 0 else ""),
            f"1. step {i}",
            "correct" if i % 3 else "incorrect",
            i % 7 + 1,
            (i % 7 + 1) // 2,
            ((i % 7 + 1) // 2) / (i % 7 + 1),
            "text-only",
            "others" if i % 10 else "location",
            1_700_000_000.0 + i,
            blob.tobytes(),
            np.zeros(8, dtype=np.float32).tobytes(),
        )
        for i in range(n)
    ]
    conn = sqlite3.connect(db)
    conn.executemany(
        "INSERT INTO memories (question, workflow_summary, judgement, usage_count, success_count,"
        " win_rate, modality, category, created_at, q_emb, c_emb) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.commit()
    conn.close()
    with MemoryStore(db, emb) as store:
        total, page = store.page(limit=50)
        assert total == n and [r.id for r in page] == list(range(n, n - 50, -1))
        total, page = store.page(offset=99_990, limit=50)
        assert [r.id for r in page] == list(range(10, 0, -1))
        total, page = store.page(query="about rivers", limit=200)
        assert total == 100 and {r.id for r in page} == {i + 1 for i in range(0, n, 1000)}
        total, page = store.page(judgement="incorrect", category="location", limit=5)
        assert total == len([i for i in range(n) if i % 3 == 0 and i % 10 == 0])
        assert all(r.judgement == "incorrect" and r.category == "location" for r in page)
        total, page = store.page(sort="win_rate", limit=3)
        assert [r.win_rate for r in page] == [0.5] * 3
        # Pages read the covering listing index, never the table with its embedding blobs.
        plan = store._conn.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM memories INDEXED BY memories_listing "
            "WHERE judgement = 'correct' AND question LIKE '%a%' ORDER BY win_rate DESC LIMIT 50"
        ).fetchall()
        assert "COVERING INDEX memories_listing" in str(plan)


def test_browser_sessions(tmp_path: Path) -> None:
    with running(tmp_path, token=TOKEN) as (client, _):
        url = str(client.base_url).rstrip("/")
        port = int(url.rsplit(":", 1)[1])
        anon = httpx.Client(base_url=url, timeout=30)
        # No token: API routes 401 in JSON, the page is a sign-in form (no data), /health open.
        assert anon.get("/memories").status_code == 401
        assert anon.get("/memories").json()["error"]["code"] == "unauthorized"
        r = anon.get("/ui")
        assert r.status_code == 401 and 'name="token"' in r.text and "memories" not in r.text
        assert "default-src 'self'" in r.headers["content-security-policy"]
        assert anon.get("/health").status_code == 200
        # A wrong token in the form or the URL: no cookie.
        r = anon.post("/login", data={"token": "nope", "next": "/ui"})
        assert r.status_code == 401 and "wrong token" in r.text and "set-cookie" not in r.headers
        r = anon.get("/ui", params={"token": "nope"})
        assert r.status_code == 401 and "set-cookie" not in r.headers
        # The right token: a redirect that sets an HttpOnly, SameSite=Strict cookie holding an
        # HMAC of the token (never the token), back to a local page only.
        r = anon.post("/login", data={"token": TOKEN, "next": "//evil.example/x"})
        assert r.status_code == 303 and r.headers["location"] == "/ui"
        cookie = r.headers["set-cookie"]
        name = session_cookie_name(port)
        assert cookie.startswith(f"{name}={session_value(TOKEN)};")
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and TOKEN not in cookie
        anon.cookies.clear()
        r = anon.get("/ui", params={"token": TOKEN, "x": "1"})
        assert r.status_code == 303 and r.headers["location"] == "/ui?x=1"
        # The cookie reads; a change needs the X-MIA-UI header (a cross-site form cannot set it).
        session = httpx.Client(base_url=url, timeout=30, cookies={name: session_value(TOKEN)})
        assert session.get("/ui").status_code == 200
        assert (
            session.get("/ui/static/app.js").headers["content-type"].startswith("text/javascript")
        )
        assert session.get("/memories").status_code == 200
        r = session.post("/memory", json={"question": "q"})
        assert r.status_code == 403 and "x-mia-ui" in r.json()["error"]["message"]
        assert (
            session.post("/memory", json={"question": "q"}, headers={"X-MIA-UI": "1"}).status_code
            == 200
        )
        # A cookie for another token, or for another port, is nobody.
        other = httpx.Client(base_url=url, timeout=30, cookies={name: session_value("other")})
        assert other.get("/memories").status_code == 401
        elsewhere = httpx.Client(
            base_url=url, timeout=30, cookies={session_cookie_name(port + 1): session_value(TOKEN)}
        )
        assert elsewhere.get("/memories").status_code == 401
        # The bearer header still works for everything.
        assert client.get("/ui").status_code == 200
        for c in (anon, session, other, elsewhere):
            c.close()
    # Without a token the page is open; with ui.enabled=false there is no page.
    with running(tmp_path / "open") as (client, _):
        assert client.get("/ui").status_code == 200
        assert client.get("/ui/static/nope.js").status_code == 404
    with running(tmp_path / "off", overrides=("ui.enabled=false",), token=TOKEN) as (client, _):
        assert client.get("/ui").status_code == 404
        assert client.post("/login", data={"token": TOKEN}).status_code in (401, 404, 415)
        assert client.get("/memories").status_code == 200  # the data routes stay


def test_runs_folder(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "a" / "ttrl").mkdir(parents=True)
    (runs / "a" / "ttrl" / "accuracy.jsonl").write_text(
        "\n".join(
            json.dumps({"batch": b, "accuracy": 0.5 + b / 10, "per_question": [{"x": 1}]})
            for b in (1, 0)
        )
        + "\n"
    )
    (runs / "b").mkdir()
    (runs / "b" / "summary.json").write_text(
        json.dumps({"policies": [{"policy": "mia", "accuracy": 0.75, "labels": {"correct": 3}}]})
    )
    (runs / "bad").mkdir()
    (runs / "bad" / "summary.json").write_text("{not json")
    (runs / ".hidden").mkdir()
    (runs / ".hidden" / "summary.json").write_text("{}")
    (tmp_path / "outside.json").write_text("{}")
    with running(tmp_path) as (client, _):
        listed = client.get("/runs").json()
        assert listed["root"] == str(runs) and not listed["truncated"]
        assert sorted((r["id"], r["kind"], r["name"]) for r in listed["runs"]) == [
            ("a/ttrl/accuracy.jsonl", "ttrl", "a/ttrl"),
            ("b/summary.json", "eval", "b"),
            ("bad/summary.json", "eval", "bad"),
        ]
        got = client.get("/runs/detail", params={"id": "a/ttrl/accuracy.jsonl"}).json()
        # Sorted by batch; nested detail (per_question) stays on disk.
        assert got["rows"] == [{"batch": 0, "accuracy": 0.5}, {"batch": 1, "accuracy": 0.6}]
        got = client.get("/runs/detail", params={"id": "b/summary.json"}).json()
        assert got["rows"] == [{"policy": "mia", "accuracy": 0.75}]
        for run_id, status, code in (
            ("bad/summary.json", 400, "bad_request"),
            ("../outside.json", 400, "bad_run_id"),
            ("/etc/passwd", 400, "bad_run_id"),
            ("b/other.json", 400, "bad_run_id"),
            ("zzz/summary.json", 404, "no_such_run"),
            ("b/\x00/summary.json", 400, "bad_run_id"),
        ):
            r = client.get("/runs/detail", params={"id": run_id})
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), run_id
