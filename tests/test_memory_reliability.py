"""memory_serve under stress and abuse, as a real process (``python -m memory_serve``).

Every service here is the real command on an ephemeral port with real SQLite and the real MiniLM
embedder: 32 concurrent writers, SIGKILL in the middle of a write stream, malformed and oversized
bodies, a bounded schemathesis run over the OpenAPI schema, and a misbehaving OpenAI-compatible
LLM endpoint (a real local HTTP server) behind the manager and planner roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from helpers import run_sql, stop_process

from mia.http import ServerThread, wait_for_port_file

ROOT = Path(__file__).resolve().parents[1]
NO_LLM = ("compress.mode=identity", "llm.enabled=false")
EMBED_BYTES = 384 * 4  # one float32 MiniLM vector
MAX_BODY = 64 * 1024  # the shared service's --max-body-bytes (keeps the oversize cases small)
_ids = itertools.count()


# ----------------------------------------------------------------------------- service process


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # The service may run with a cwd outside the repo (schemathesis sandbox).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """The port file is written just before uvicorn listens: poll /health until it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"service at {url} never became healthy (exit {proc.poll()})")
        time.sleep(0.05)


@contextlib.contextmanager
def service(
    tmp: Path, db: Path, *overrides: str, args: tuple[str, ...] = (), cwd: Path | None = None
) -> Iterator[Service]:
    """``python -m memory_serve --db DB --port 0 --port-file F ARGS OVERRIDES``, stopped after."""
    n = next(_ids)
    port_file, log = tmp / f"port-{n}", tmp / f"service-{n}.log"
    cmd = [sys.executable, "-m", "memory_serve", "--db", str(db), "--port", "0"]
    cmd += ["--port-file", str(port_file), *args, *overrides]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=cwd or ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT
        )
    svc = Service(proc, "", log)
    try:
        try:
            port = wait_for_port_file(port_file, timeout=180, proc=proc)
            svc.url = f"http://127.0.0.1:{port}"
            _wait_healthy(svc.url, proc)
        except (RuntimeError, TimeoutError) as err:
            raise AssertionError(f"{err}\n--- service log ---\n{svc.log_tail()}") from None
        yield svc
    finally:
        if proc.poll() is None:
            stop_process(proc, timeout=30)


def db_rows(db: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db), timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def item(question: str, judgement: str = "correct") -> dict[str, Any]:
    """A trajectory with its summary given: stored as is (no LLM involved)."""
    return {"question": question, "judgement": judgement, "workflow_summary": f"1. {question}"}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path, Path]]:
    """One service for the concurrency, bad-input and schemathesis tests: ``(svc, db, sandbox)``.

    Its cwd and ``persist.allowed_root`` are a sandbox folder, so whatever paths a fuzzer sends
    to /save_memory, /load_memory or /batch_evaluate stay inside it.
    """
    tmp = tmp_path_factory.mktemp("shared")
    sandbox = tmp / "sandbox"
    sandbox.mkdir()
    db = tmp / "memory.sqlite"
    overrides = (
        *NO_LLM,
        f"persist.allowed_root={sandbox}",
        f"ttrl.output_dir={sandbox / 'out'}",
        "ttrl.rules=[random,first,shortest,longest]",  # "choice" needs an LLM
    )
    with service(tmp, db, *overrides, args=("--max-body-bytes", str(MAX_BODY)), cwd=sandbox) as s:
        yield s, db, sandbox


# ----------------------------------------------------------------------------- concurrency


def test_32_concurrent_writers_lose_nothing(shared: tuple[Service, Path, Path]) -> None:
    svc, db, _ = shared
    httpx.post(f"{svc.url}/clear_memory", json={}).raise_for_status()
    seed = httpx.post(f"{svc.url}/memories", json=item("Concurrency seed question?")).json()
    seed_id = seed["results"][0]["id"]
    writers, own = 32, 3
    shared_q = "What is the capital of France?"  # every writer also stores this one

    async def writer(client: httpx.AsyncClient, w: int, go: asyncio.Event) -> list[dict]:
        await go.wait()
        out = []
        items = [item(f"Writer {w} asks question number {j}?") for j in range(own)]
        items[1]["image_caption"] = f"photo {w}"  # a second bucket (text-image)
        items[2]["judgement"] = "incorrect"
        bodies: list[Any] = [items[0], items[1:]] if w % 2 else [[x] for x in items]
        bodies.append(item(shared_q, "correct"))
        for body in bodies:
            for b in body if isinstance(body, list) else [body]:
                b["used_memory_ids"] = [seed_id]
            r = await client.post("/memories", json=body)
            assert r.status_code == 200, r.text
            sent = body if isinstance(body, list) else [body]
            out += [
                {**res, "question": x["question"], "judgement": x["judgement"]}
                for res, x in zip(r.json()["results"], sent, strict=True)
            ]
        return out

    async def run_all() -> list[dict]:
        limits = httpx.Limits(max_connections=writers + 4)
        async with httpx.AsyncClient(base_url=svc.url, timeout=120, limits=limits) as client:
            go = asyncio.Event()
            tasks = [asyncio.create_task(writer(client, w, go)) for w in range(writers)]
            await asyncio.sleep(0.05)
            go.set()  # all 32 start together
            return [r for chunk in await asyncio.gather(*tasks) for r in chunk]

    results = asyncio.run(run_all())
    assert len(results) == writers * (own + 1)
    mine = [r for r in results if r["question"] != shared_q]
    dup = [r for r in results if r["question"] == shared_q]
    # Every distinct question was inserted once, under a distinct id.
    assert {r["action"] for r in mine} == {"inserted"}
    assert len({r["id"] for r in mine}) == writers * own
    # The shared question: exactly one insert, the 31 others deduplicated onto it.
    inserted = [r for r in dup if r["action"] == "inserted"]
    assert len(inserted) == 1
    assert sorted(r["action"] for r in dup) == ["inserted"] + ["kept_existing"] * (writers - 1)
    assert {r["id"] for r in dup} == {inserted[0]["id"]}

    rows = db_rows(db, "SELECT id, question, judgement FROM memories")
    by_id = {r[0]: r for r in rows}
    assert len(rows) == 1 + writers * own + 1  # seed + own + the shared one
    for r in mine + inserted:
        assert by_id[r["id"]][1:] == (r["question"], r["judgement"])
    questions = [r[1] for r in rows]
    assert len(questions) == len(set(questions))  # no duplicate question survived
    # Win-rate credit: every one of the 128 writes used the seed; no update was lost.
    correct_writes = sum(1 for r in results if r["judgement"] == "correct")
    assert db_rows(
        db, "SELECT usage_count, success_count FROM memories WHERE id = ?", (seed_id,)
    ) == [(1 + len(results), 1 + correct_writes)]
    stats = httpx.get(f"{svc.url}/stats").json()
    assert stats["memories"] == len(rows)
    assert stats["buckets"] == {
        "text-image/others": {"correct": writers, "incorrect": 0},
        "text-only/others": {"correct": 1 + writers + 1, "incorrect": writers},
    }
    # And the index agrees with the disk: each writer's own question comes back first.
    r = httpx.post(f"{svc.url}/memory", json={"question": "Writer 7 asks question number 0?"})
    assert r.json()["positive_ids"][0] == next(
        x["id"] for x in mine if x["question"] == "Writer 7 asks question number 0?"
    )


# ----------------------------------------------------------------------------- SIGKILL


@pytest.mark.slow  # two service starts
def test_sigkill_mid_write_stream_keeps_acknowledged_writes(tmp_path: Path) -> None:
    db = tmp_path / "killed.sqlite"
    acked: dict[int, str] = {}  # id -> question, only from answered requests
    errors: list[BaseException] = []
    last_acked_batch = -1
    stop = threading.Event()
    batch = 4

    def question(i: int, j: int) -> str:
        return f"Kill test batch {i} item {j}: which river flows through city {i * batch + j}?"

    with service(tmp_path, db, *NO_LLM) as svc:

        def stream() -> None:
            try:
                write_until_killed()
            except BaseException as err:  # surfaced by the main thread
                errors.append(err)

        def write_until_killed() -> None:
            nonlocal last_acked_batch
            with httpx.Client(base_url=svc.url, timeout=30) as client:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    body = [
                        item(question(i, j), "correct" if j % 2 else "incorrect")
                        for j in range(batch)
                    ]
                    try:
                        r = client.post("/memories", json=body)
                    except httpx.TransportError:
                        return  # the service died mid-request: this batch is unacknowledged
                    assert r.status_code == 200, r.text
                    for res, x in zip(r.json()["results"], body, strict=True):
                        acked[res["id"]] = x["question"]
                    last_acked_batch = i

        writer = threading.Thread(target=stream, daemon=True)
        writer.start()
        deadline = time.monotonic() + 120
        while last_acked_batch < 10 and writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not errors and last_acked_batch >= 10, (errors, svc.log_tail())
        os.kill(svc.proc.pid, signal.SIGKILL)  # while the next batch is in flight
        svc.proc.wait(timeout=30)
        stop.set()
        writer.join(timeout=30)
        assert not writer.is_alive() and not errors, errors
    assert svc.proc.returncode == -signal.SIGKILL

    # The file (with the WAL left by the dead process) is intact and holds every ack.
    assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]
    rows = dict(db_rows(db, "SELECT id, question FROM memories"))
    assert len(acked) == batch * (last_acked_batch + 1)
    assert {i: rows.get(i) for i in acked} == acked
    # Anything beyond the acks is whole rows of the one batch that was in flight.
    extra = {i: q for i, q in rows.items() if i not in acked}
    in_flight = {question(last_acked_batch + 1, j) for j in range(batch)}
    assert set(extra.values()) <= in_flight
    assert len(set(rows.values())) == len(rows)
    assert db_rows(
        db, "SELECT COUNT(*) FROM memories WHERE length(q_emb) != ?", (EMBED_BYTES,)
    ) == [(0,)]

    # The service restarts on it, serves what was stored, and keeps writing.
    with service(tmp_path, db, *NO_LLM) as svc:
        assert httpx.get(f"{svc.url}/health").json() == {
            "status": "ok",
            "service": "memory_serve",
            "memories": len(rows),
        }
        probe_q = question(3, 1)  # an acknowledged, correct memory
        probe_id = next(i for i, q in acked.items() if q == probe_q)
        r = httpx.post(f"{svc.url}/memory", json={"question": probe_q, "top_k": 1}).json()
        assert r["positive_ids"] == [probe_id]
        r = httpx.post(f"{svc.url}/memories", json=item("After the crash, a new question?"))
        assert r.status_code == 200 and r.json()["results"][0]["id"] > max(rows)
    assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert db_rows(db, "SELECT COUNT(*) FROM memories") == [(len(rows) + 1,)]


# ----------------------------------------------------------------------------- bad input


def _assert_envelope(r: httpx.Response, status: int, code: str, message_part: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == code
    assert message_part in body["error"]["message"], body["error"]["message"]


JSON = {"content-type": "application/json"}

BAD_BODIES = [
    # (route, raw body, status, code, part of the message)
    ("/memory", b'{"question": "x",', 400, "bad_json", "malformed JSON body"),
    ("/memories", b'[{"question": "q"', 400, "bad_json", "malformed JSON body"),
    ("/memory", b"\xff\xfe{}", 415, "unsupported_media_type", "JSON bodies must be UTF-8"),
    ("/memory", b'{"question": "\xff"}', 400, "bad_json", "not valid UTF-8"),
    ("/memory", b"", 422, "invalid_request", "Field required"),
    ("/memory", b'{"question": ["a"]}', 422, "invalid_request", "question: Input should be"),
    ("/memory", b'{"question": "q", "top_k": "many"}', 422, "invalid_request", "top_k: Input"),
    ("/memory", b'{"question": "q", "mem_top_k": -1}', 422, "invalid_request", "greater than"),
    ("/memory", b'{"question": "q", "pass_num": 1e309}', 422, "invalid_request", "pass_num"),
    ("/memory", b'{"question": "q", "category": "nope"}', 422, "invalid_request", "category"),
    ("/memory", b'{"mem_top_k": 2}', 422, "invalid_request", "question"),
    ("/memories", b'"just a string"', 422, "invalid_request", "valid dictionary"),
    ("/memories", b"null", 422, "invalid_request", "valid dictionary"),
    ("/memories", b'{"question": "q", "judgement": {"a": 1}}', 422, "invalid_request", "judgement"),
    (
        "/memories",
        b'{"question": "q", "judgement": "correct", "used_memory_ids": ["x"]}',
        422,
        "invalid_request",
        "used_memory_ids.0",
    ),
    ("/memories", b'{"question": "q", "messages": "hi"}', 422, "invalid_request", "messages"),
    ("/memories", b'{"question": "q"}', 422, "invalid_request", "judgement is required"),
    ("/clear_memory", b'{"rollouts": "maybe"}', 422, "invalid_request", "rollouts"),
    ("/load_memory", b"{}", 422, "invalid_request", "path: Field required"),
    # Paths the OS cannot take are bad input (each of these answered 500 before).
    ("/load_memory", b'{"path": "a\\u0000b"}', 422, "invalid_request", "invalid path"),
    ("/save_memory", b'{"path": "a\\u0000b"}', 422, "invalid_request", "invalid path"),
    ("/batch_evaluate", b'{"output_dir": "a\\u0000b"}', 422, "invalid_request", "invalid path"),
    ("/save_memory", b'{"path": "~no-such-user-here/x"}', 422, "invalid_request", "invalid path"),
    ("/load_memory", b'{"path": "LONG"}', 422, "invalid_request", "name of 300 bytes"),
]


@pytest.mark.parametrize(("route", "body", "status", "code", "part"), BAD_BODIES)
def test_bad_input_answers_4xx_envelope(
    shared: tuple[Service, Path, Path], route: str, body: bytes, status: int, code: str, part: str
) -> None:
    svc, _, sandbox = shared
    body = body.replace(b"LONG", str(sandbox / ("a" * 300)).encode())
    _assert_envelope(httpx.post(svc.url + route, content=body, headers=JSON), status, code, part)


def test_oversized_bodies_are_refused(shared: tuple[Service, Path, Path]) -> None:
    svc, db, _ = shared
    before = db_rows(db, "SELECT COUNT(*) FROM memories")
    big = item("x" * (MAX_BODY + 10))
    # With a Content-Length header: refused before the body is read.
    r = httpx.post(f"{svc.url}/memories", json=big)
    _assert_envelope(r, 413, "payload_too_large", f"request body over {MAX_BODY} bytes")

    # Chunked (no Content-Length): cut off while streaming.
    def chunks() -> Iterator[bytes]:
        data = httpx.Request("POST", "/", json=big).content
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    r = httpx.post(f"{svc.url}/memories", content=chunks(), headers=JSON)
    assert "content-length" not in r.request.headers
    _assert_envelope(r, 413, "payload_too_large", f"request body over {MAX_BODY} bytes")
    assert db_rows(db, "SELECT COUNT(*) FROM memories") == before  # nothing stored
    # Just under the limit is accepted.
    ok = {"question": "y" * (MAX_BODY - 500), "judgement": "correct", "workflow_summary": "s"}
    assert httpx.post(f"{svc.url}/memories", json=ok).status_code == 200
    assert httpx.get(f"{svc.url}/health").json()["status"] == "ok"


# ----------------------------------------------------------------------------- /load_memory

_RECREATE = (  # the memories table without its constraints, as a crafted file could hold it
    "CREATE TABLE m2 AS SELECT * FROM memories; DROP TABLE memories; "
    "ALTER TABLE m2 RENAME TO memories"
)
_NAN_BLOB = "x'" + "0000c07f" * 384 + "'"
BAD_BACKUPS: dict[str, tuple[list[str], str]] = {
    # name -> (SQL applied to a copy of a good backup, the error message after "<name>: ")
    "blob3": (
        ["UPDATE memories SET q_emb = x'000102' WHERE id = 2"],  # the reproduction
        "memories row 2 (id 2): q_emb holds 3 bytes, want 384 float32 values (1536)",
    ),
    "wrongdim": (
        ["UPDATE memories SET c_emb = zeroblob(1532) WHERE id = 3"],
        "memories row 3 (id 3): c_emb holds 1532 bytes, want 384 float32 values (1536)",
    ),
    "nan": (
        [f"UPDATE plan_pairs SET q_emb = {_NAN_BLOB}"],
        "plan_pairs row 1 (id 1): q_emb holds NaN or infinite values",
    ),
    "dupid": (
        [_RECREATE, "INSERT INTO memories SELECT * FROM memories WHERE id = 1"],
        "memories row 4 (id 1): duplicate id",
    ),
    "textid": (
        [_RECREATE, "UPDATE memories SET id = 'two' WHERE id = 2"],
        "memories row 2 (id 'two'): id must be a whole number in [1, 9007199254740991], got 'two'",
    ),
    "judgement": (
        [_RECREATE, "UPDATE memories SET judgement = 'maybe' WHERE id = 2"],
        "memories row 2 (id 2): judgement must be one of ['correct', 'incorrect'], got 'maybe'",
    ),
    "winrate": (
        [_RECREATE, "UPDATE memories SET win_rate = 7.5 WHERE id = 1"],
        "memories row 1 (id 1): win_rate must be a finite number in [0, 1], got 7.5",
    ),
    "extra": (
        ["UPDATE memories SET extra = '[1' WHERE id = 1"],
        "memories row 1 (id 1): extra is not valid JSON",
    ),
    "rollout": (
        [
            "INSERT INTO rollouts (question, judgement, messages, created_at) "
            "VALUES ('q', 'correct', 'not json', 1)"
        ],
        "rollouts row 1 (id 1): messages is not valid JSON",
    ),
    "notable": (["DROP TABLE plan_pairs"], "is not a MIA memory database (no table plan_pairs)"),
    "nocolumn": (
        [_RECREATE, "ALTER TABLE memories DROP COLUMN c_emb"],
        "table memories: no such column: c_emb",
    ),
    "meta": (
        ["UPDATE meta SET value = '512' WHERE key = 'dim'"],
        "holds embeddings of 'all-MiniLM-L6-v2' (dim 512) but the embedder is "
        "'all-MiniLM-L6-v2' (dim 384); pass reembed to convert it",
    ),
}


# A file that is a backup but holds a bad row is a 422 naming the row; the rest is a 400.
NOT_A_BACKUP = {"notable", "nocolumn", "meta", "text", "truncated"}


def _craft(good: Path, out: Path, statements: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(good.read_bytes())
    run_sql(out, *statements)


def _snapshot(db: Path) -> tuple[bytes, bytes, list[tuple[Any, ...]]]:
    wal = Path(f"{db}-wal")
    rows = db_rows(db, "SELECT id, question, judgement, usage_count, q_emb FROM memories")
    return db.read_bytes(), wal.read_bytes() if wal.exists() else b"", rows


@pytest.mark.slow  # two service starts
def test_load_memory_never_corrupts_the_live_store(tmp_path: Path) -> None:
    root = tmp_path / "backups"
    db = tmp_path / "live" / "memory.sqlite"
    overrides = (*NO_LLM, f"persist.allowed_root={root}")
    questions = ["Who wrote Hamlet?", "Where is the Louvre?", "When did Rome fall?"]
    with service(tmp_path, db, *overrides) as svc, httpx.Client(base_url=svc.url, timeout=60) as c:
        c.post("/memories", json=[item(q) for q in questions]).raise_for_status()
        r = c.post("/save_memory", json={"path": "good.sqlite"})
        assert r.status_code == 200
        good = root / "good.sqlite"
        # A plan pair in the backup (copied from a memory row: same embedding format).
        _craft(good, good, [
            "INSERT INTO plan_pairs (question, correct_plan, incorrect_plan, modality, category, "
            "created_at, q_emb, c_emb) SELECT question, 'a', 'b', modality, category, created_at, "
            "q_emb, c_emb FROM memories WHERE id = 1"
        ])  # fmt: skip
        c.post("/memories", json=item("A fifth question, only live?")).raise_for_status()
        health = c.get("/health").json()
        live_ids = [r[0] for r in db_rows(db, "SELECT id FROM memories ORDER BY id")]
        probe = c.post("/memory", json={"question": "Who wrote Hamlet?"}).json()
        before = _snapshot(db)

        cases = {f"{name}.sqlite": spec for name, spec in BAD_BACKUPS.items()}
        for name, (sql, _) in cases.items():
            _craft(good, root / name, sql)
        (root / "text.sqlite").write_text("not a database at all")
        cases["text.sqlite"] = ([], "is not a SQLite memory backup")
        (root / "truncated.sqlite").write_bytes(good.read_bytes()[:3000])
        cases["truncated.sqlite"] = ([], "")
        _craft(good, root / "folder" / "memory.sqlite", BAD_BACKUPS["blob3"][0])
        cases["folder"] = ([], "memories row 2 (id 2): q_emb holds 3 bytes")
        for name, (_, message) in cases.items():
            r = c.post("/load_memory", json={"path": name})
            bad_file = name.removesuffix(".sqlite") in NOT_A_BACKUP
            assert r.status_code == (400 if bad_file else 422), (name, r.text)
            error = r.json()["error"]
            assert error["code"] == ("bad_request" if bad_file else "invalid_backup")
            shown = "folder/memory.sqlite" if name == "folder" else name
            assert shown in error["message"] and message in error["message"], error
            assert str(tmp_path) not in error["message"]
            # Nothing changed: memory (health, retrieval), file bytes and rows.
            assert c.get("/health").json() == health
            assert c.post("/memory", json={"question": "Who wrote Hamlet?"}).json() == probe
            assert _snapshot(db) == before, name
        assert not [p.name for p in db.parent.iterdir() if ".load-" in p.name]  # no staging left

        # The next write takes the next id of the live store.
        r = c.post("/memories", json=item("After the bad loads?"))
        assert r.json()["results"][0]["id"] == max(live_ids) + 1
        # A good backup (even one carrying a trigger) loads; only rows come across, and ids
        # keep growing past everything the live store handed out.
        _craft(good, root / "trigger.sqlite", [
            "CREATE TRIGGER wipe AFTER INSERT ON memories BEGIN DELETE FROM memories; END"
        ])  # fmt: skip
        r = c.post("/load_memory", json={"path": "trigger.sqlite"})
        assert r.status_code == 200, r.text
        assert (r.json()["memories"], r.json()["plan_pairs"]) == (3, 1)
        assert db_rows(db, "SELECT name FROM sqlite_master WHERE type = 'trigger'") == []
        r = c.post("/memories", json=item("After the good load?"))
        assert r.json()["results"][0]["id"] == max(live_ids) + 2
        assert c.get("/health").json()["memories"] == 4
        hit = c.post("/memory", json={"question": "Where is the Louvre?", "top_k": 1}).json()
        assert hit["positive_ids"] == [2]
    # The service restarts on its database.
    assert db_rows(db, "PRAGMA integrity_check") == [("ok",)]
    with service(tmp_path, db, *overrides) as svc:
        assert httpx.get(f"{svc.url}/health").json()["memories"] == 4
        r = httpx.post(f"{svc.url}/memory", json={"question": "Where is the Louvre?", "top_k": 1})
        assert r.json()["positive_ids"] == [2]


# ----------------------------------------------------------------------------- schemathesis


SCHEMATHESIS_MAX_EXAMPLES = 6


@pytest.mark.slow
def test_schemathesis_finds_no_server_error(shared: tuple[Service, Path, Path]) -> None:
    """Property-based requests for every operation in /openapi.json: never a 5xx."""
    svc, _, sandbox = shared
    log_before = len(svc.log.read_text(errors="replace"))
    cmd = [
        sys.executable,
        "-c",
        "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())",
        "run",
        f"{svc.url}/openapi.json",
        "--checks",
        "not_a_server_error",
        "--phases",
        "examples,fuzzing",
        "--max-examples",
        str(SCHEMATHESIS_MAX_EXAMPLES),
        "--seed",
        "1",
        "--no-shrink",
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--no-color",
    ]
    proc = subprocess.run(cmd, cwd=sandbox, env=_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    # It really ran: every operation of the schema, and some cases each.
    ops = re.search(r"Operations:\s+(\d+) selected / (\d+) total", out)
    assert ops and ops.group(1) == ops.group(2) and int(ops.group(1)) >= 11, out[-3000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert cases and cases.group(1) == cases.group(2) and int(cases.group(1)) >= 11, out[-3000:]
    # No error was swallowed into a 4xx either: the service logged no unhandled exception.
    assert "unhandled error" not in svc.log.read_text(errors="replace")[log_before:]
    assert httpx.get(f"{svc.url}/health").json()["status"] == "ok"


# ----------------------------------------------------------------------------- LLM failures


@dataclass
class FakeLLM:
    """An OpenAI chat-completions endpoint that misbehaves as told; counts every attempt."""

    mode: str = "ok"  # ok | timeout | 500 | garbage | bad_usage | think
    stall_s: float = 3.0
    attempts: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            self.attempts += 1
            self.bodies.append(await request.json())
            if self.mode == "timeout":
                await asyncio.sleep(self.stall_s)
            if self.mode == "500":
                return JSONResponse({"error": {"message": "the model fell over"}}, 500)
            if self.mode == "garbage":
                return PlainTextResponse("<html>gateway says hello</html>", 200)
            think = self.mode == "think"  # a reply that only thinks: no plan, no decision
            content = "<think>Let me think.</think>\n" if think else "1. Search (q -> a)"
            usage: dict[str, Any] = {"prompt_tokens": 10, "completion_tokens": 5}
            if self.mode == "bad_usage":
                usage["prompt_tokens"] = "lots"
            return {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": "qwen",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }

        return app


@pytest.mark.slow
def test_llm_timeout_500_and_garbage_are_retried_then_clear_errors(tmp_path: Path) -> None:
    fake = FakeLLM()
    retries = 2
    with ServerThread(fake.app()) as llm_url:
        roles = []
        for role in ("manager", "planner"):
            o = f"llm.overrides.{role}"
            # 1 s: short, yet no false timeout when the shared CI box is busy.
            roles += [f"{o}.base_url={llm_url}/v1", f"{o}.timeout=1"]
            roles += [f"{o}.max_retries={retries}", f"{o}.backoff=0.05"]
        with (
            service(tmp_path, tmp_path / "m.sqlite", "llm.config=vllm", *roles) as svc,
            httpx.Client(base_url=svc.url, timeout=60) as client,
        ):
            # A memory stored without the LLM (summary given), so retrieval has something.
            r = client.post("/memories", json=item("Where is the Eiffel Tower?"))
            assert r.status_code == 200
            stored = r.json()["results"][0]["id"]
            trajectory = {
                "question": "Where is the Louvre?",
                "judgement": "correct",
                "messages": [{"role": "assistant", "content": "<answer>Paris</answer>"}],
            }
            why = {
                "timeout": "timed out after 1s",
                "500": "HTTP 500: the model fell over",
                "garbage": "malformed reply: body is not JSON",
                "bad_usage": "malformed reply: usage.prompt_tokens is not a number: 'lots'",
            }
            for mode, reason in why.items():
                fake.mode = mode
                for route, body, what in (
                    ("/plan", {"question": "Where is the Louvre?"}, "LLM call failed: "),
                    ("/memories", trajectory, "workflow summary failed: "),
                ):
                    fake.attempts = 0
                    r = client.post(route, json=body)
                    _assert_envelope(r, 502, "llm_error", what)
                    message = r.json()["error"]["message"]
                    assert f"failed after {retries + 1} attempt(s): {reason}" in message
                    assert f"{llm_url}/v1/chat/completions" in message
                    assert fake.attempts == retries + 1, (mode, route)
                    # Still alive, nothing half-stored, retrieval still answers.
                    assert client.get("/health").json()["memories"] == 1
                    r = client.post("/memory", json={"question": "Where is the Louvre?"})
                    assert r.status_code == 200 and r.json()["positive_ids"] == [stored]
            # A think-only reply is no plan and no decision: asked again, then 502 llm_empty.
            fake.mode = "think"
            past = [{"role": "user", "content": "plan"}, {"role": "assistant", "content": "1."}]
            for route, body in (
                ("/plan", {"question": "Where is the Louvre?"}),
                ("/judge_replan", {"workflow": "T", "past_messages": past}),
                ("/replan", {"question": "Where is the Louvre?", "past_messages": past}),
            ):
                fake.attempts = 0
                r = client.post(route, json=body)
                _assert_envelope(r, 502, "llm_empty", "the manager LLM gave no ")
                assert "in 3 attempt(s) (reply '<think>Let me think.</think>" in r.text
                assert fake.attempts == 3, route
            # The endpoint recovers: the same service plans and summarises again.
            fake.mode, fake.attempts = "ok", 0
            r = client.post("/plan", json={"question": "Where is the Louvre?"})
            assert r.status_code == 200 and r.json()["plan"] == "1. Search (q -> a)"
            assert r.json()["planner"] == "manager"  # cold start: one memory only
            r = client.post("/memories", json=trajectory)
            assert r.status_code == 200 and r.json()["results"][0]["action"] == "inserted"
            assert fake.attempts == 2
            assert fake.bodies[-1]["model"] == "qwen"
