"""Backups checked to the last field: crafted SQLite and JSON backups, crafted live databases,
a full disk and hostile persistence paths against memory_serve on a real uvicorn server
(``mia.http.ServerThread``) with real SQLite and the real MiniLM embedder.

Every refused load must leave the store exactly as it was and writable; every crafted live
state must leave the service answering (4xx/507 with the error envelope, never a 500) and
writable again.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import run_sql
from role_fixtures import memory_client

from memory_serve.config import load_config
from memory_serve.records import MAX_COUNT, MAX_ID, NewMemory
from memory_serve.service import MemoryService
from memory_serve.store import InvalidRecord, MemoryStore, OutOfRange
from mia.embedding import shared_embedder

ROOT = Path(__file__).resolve().parents[1]
BIG = 2**63 - 1  # SQLite's largest integer: AUTOINCREMENT has nothing left after it
LIVE = "live/memory.sqlite"
FULL = "the memory database is full (disk space or ids); nothing was written"


@contextlib.contextmanager
def running(tmp_path: Path) -> Iterator[tuple[httpx.Client, MemoryService]]:
    """memory_serve without an LLM over ``tmp_path/live``; backups under ``tmp_path/backups``."""
    overrides = ["llm.enabled=false", "compress.mode=identity"]
    cfg = load_config(None, [*overrides, f"persist.allowed_root={tmp_path / 'backups'}"])
    (tmp_path / "backups").mkdir(exist_ok=True)
    store = MemoryStore(tmp_path / LIVE, shared_embedder(), cfg.store)
    with memory_client(cfg, store) as served:
        yield served


def item(question: str, judgement: str = "correct", **fields: Any) -> dict[str, Any]:
    return {"question": question, "judgement": judgement, "workflow_summary": "1. s", **fields}


def stored(
    client: httpx.Client, question: str, judgement: str = "correct", **fields: Any
) -> dict[str, Any]:
    """The result of storing one memory (:func:`item`); the call must succeed."""
    r = client.post("/memories", json=item(question, judgement, **fields))
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


def seed(client: httpx.Client) -> None:
    """Memories 1-3 (3 credited 1: a history row) and a buffered rollout."""
    r = client.post("/memories", json=[item("Who wrote Hamlet?"), item("Where is the Louvre?")])
    r.raise_for_status()
    client.post(
        "/memories", json=item("Who wrote Macbeth?", used_memory_ids=[1])
    ).raise_for_status()
    client.post("/memory_bank_save", json=item("Is it raining?")).raise_for_status()


def snapshot(client: httpx.Client) -> dict[str, Any]:
    """What a client sees of the whole store."""
    return {
        "stats": client.get("/stats").json(),
        "memories": client.get("/memories", params={"limit": 500, "sort": "oldest"}).json(),
        "first": client.get("/memories/1").json(),
        "probe": client.post("/memory", json={"question": "Who wrote Hamlet?"}).json(),
    }


def rows(db: Path, query: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(str(db))
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def good_backup(client: httpx.Client, tmp_path: Path) -> Path:
    """The service's own backup of the seeded store, plus a plan pair (copied from memory 1)."""
    client.post("/save_memory", json={"path": "good.sqlite"}).raise_for_status()
    good = tmp_path / "backups" / "good.sqlite"
    run_sql(
        good,
        "INSERT INTO plan_pairs (question, correct_plan, incorrect_plan, modality, category, "
        "created_at, q_emb, c_emb) SELECT question, 'a', 'b', modality, category, created_at, "
        "q_emb, c_emb FROM memories WHERE id = 1",
    )
    return good


def craft(good: Path, name: str, *statements: str) -> None:
    shutil.copyfile(good, good.with_name(name))
    run_sql(good.with_name(name), *statements)


def deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def assert_error(r: httpx.Response, status: int, code: str, message: str) -> None:
    assert (r.status_code, r.json()) == (status, {"error": {"code": code, "message": message}})


# ----------------------------------------------------------------------------- SQLite backups

_RECREATE = (  # the memories table without its constraints, as a crafted file could hold it
    "CREATE TABLE m2 AS SELECT * FROM memories; DROP TABLE memories; "
    "ALTER TABLE m2 RENAME TO memories"
)
_DEEP = json.dumps(deep(500))
_ID_RANGE = f"[1, {MAX_ID}]"
_COUNT_RANGE = f"[0, {MAX_COUNT}]"
_TIME_RANGE = "[0, 253402300799]"

BAD_SQLITE: dict[str, tuple[list[str], str]] = {
    # name -> (SQL applied to the good backup, the message after "<name>.sqlite: ")
    "id_max": (
        [f"UPDATE memories SET id = {BIG} WHERE id = 2"],
        # Rows are read in rowid order: the id is the rowid, so the row is now the last.
        f"memories row 3 (id {BIG}): id must be a whole number in {_ID_RANGE}, got {BIG}",
    ),
    "id_past_js": (
        [f"UPDATE memories SET id = {MAX_ID + 1} WHERE id = 3"],
        f"memories row 3 (id {MAX_ID + 1}): id must be a whole number in {_ID_RANGE}, "
        f"got {MAX_ID + 1}",
    ),
    "id_zero": (
        ["UPDATE memories SET id = 0 WHERE id = 1"],
        f"memories row 1 (id 0): id must be a whole number in {_ID_RANGE}, got 0",
    ),
    "sequence": (
        [f"UPDATE sqlite_sequence SET seq = {BIG} WHERE name = 'memories'"],
        f"sqlite_sequence row 1 (memories): seq must be a whole number in [0, {MAX_ID}], got {BIG}",
    ),
    "usage": (
        [f"UPDATE memories SET usage_count = {BIG} WHERE id = 1"],
        f"memories row 1 (id 1): usage_count must be a whole number in {_COUNT_RANGE}, got {BIG}",
    ),
    "usage_negative": (
        [_RECREATE, "UPDATE memories SET usage_count = -1 WHERE id = 2"],
        f"memories row 2 (id 2): usage_count must be a whole number in {_COUNT_RANGE}, got -1",
    ),
    "success_over_usage": (
        ["UPDATE memories SET success_count = 5 WHERE id = 2"],
        "memories row 2 (id 2): success_count (5) must not exceed usage_count (1)",
    ),
    "win_rate_inf": (
        ["UPDATE memories SET win_rate = 9e999 WHERE id = 3"],
        "memories row 3 (id 3): win_rate must be a finite number in [0, 1], got inf",
    ),
    "created_far": (
        ["UPDATE memories SET created_at = 1e308 WHERE id = 1"],
        f"memories row 1 (id 1): created_at must be a finite number in {_TIME_RANGE}, got 1e+308",
    ),
    "created_negative": (
        ["UPDATE plan_pairs SET created_at = -1"],
        f"plan_pairs row 1 (id 1): created_at must be a finite number in {_TIME_RANGE}, got -1.0",
    ),
    "extra_deep": (
        [f"UPDATE memories SET extra = '{_DEEP}' WHERE id = 2"],
        "memories row 2 (id 2): extra is nested deeper than 32 levels",
    ),
    "extra_huge": (
        ["""UPDATE memories SET extra = '{"a": "' || hex(zeroblob(600000)) || '"}' WHERE id = 1"""],
        "memories row 1 (id 1): extra is 1200009 characters of JSON, at most 1000000",
    ),
    "text_not_utf8": (
        ["UPDATE memories SET question = CAST(x'57686fff' AS TEXT) WHERE id = 3"],
        "memories row 3 (id 3): question is not valid UTF-8 text",
    ),
    "text_blob": (
        [_RECREATE, "UPDATE memories SET source = x'00' WHERE id = 1"],
        "memories row 1 (id 1): source must be text, got bytes",
    ),
    "messages_deep": (
        [f"""UPDATE rollouts SET messages = '[{_DEEP}]'"""],
        "rollouts row 1 (id 1): messages is nested deeper than 32 levels",
    ),
    "use_memory_id": (
        [f"UPDATE memory_uses SET memory_id = {BIG}"],
        f"memory_uses row 1 (id 1): memory_id must be a whole number in {_ID_RANGE}, got {BIG}",
    ),
    "use_result_id": (
        ["UPDATE memory_uses SET result_id = -3"],
        f"memory_uses row 1 (id 1): result_id must be a whole number in {_ID_RANGE}, got -3",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_SQLITE))
def test_a_crafted_sqlite_backup_is_refused_whole(tmp_path: Path, name: str) -> None:
    statements, message = BAD_SQLITE[name]
    with running(tmp_path) as (client, _):
        seed(client)
        craft(good_backup(client, tmp_path), f"{name}.sqlite", *statements)
        before = snapshot(client)
        r = client.post("/load_memory", json={"path": f"{name}.sqlite"})
        assert_error(r, 422, "invalid_backup", f"{name}.sqlite: {message}")
        assert snapshot(client) == before
        # Writable, with the next id of the live store (the refused file changed no counter).
        assert stored(client, "After the refused load?")["id"] == 4
        after = snapshot(client)
    with running(tmp_path) as (client, _):  # a restart keeps exactly that
        assert snapshot(client) == after
        assert stored(client, "After the restart?")["id"] == 5


def test_a_good_load_sets_each_sequence_to_the_highest_id(tmp_path: Path) -> None:
    with running(tmp_path) as (client, _):
        seed(client)
        good = good_backup(client, tmp_path)
        # Ids at the top of the range load, and nothing past the highest one is needed.
        craft(good, "top.sqlite", f"UPDATE memories SET id = {MAX_ID - 1} WHERE id = 2")
        client.post("/memories", json=item("Only live?")).raise_for_status()  # live id 4
        r = client.post("/load_memory", json={"path": "top.sqlite"})
        assert r.status_code == 200 and r.json()["memories"] == 3
        db = tmp_path / LIVE
        assert rows(db, "SELECT name, seq FROM sqlite_sequence ORDER BY name") == [
            ("memories", MAX_ID - 1),
            ("memory_uses", 1),
            ("plan_pairs", 1),
            ("rollouts", 1),
        ]
        assert stored(client, "After the load?")["id"] == MAX_ID
        # A clear keeps the counters (ids are never reused).
        client.post("/clear_memory").raise_for_status()
        assert rows(db, "SELECT seq FROM sqlite_sequence WHERE name = 'memories'") == [(MAX_ID,)]


# ----------------------------------------------------------------------------- JSON backups


def _reference(entry: dict[str, Any]) -> dict[str, Any]:
    good = {"question": "Who wrote Hamlet?", "workflow_summary": "1. s", "judgement": "correct"}
    return {"text-only": {"others": [good, {**good, "question": "Who?", **entry}]}}


BAD_JSON: dict[str, tuple[dict[str, Any], str]] = {
    "usage": (
        {"usage_count": 2**63},
        f"usage_count must be a whole number in {_COUNT_RANGE}, got {2**63}",
    ),
    "success": (
        {"usage_count": 2, "success_count": 3},
        "success_count (3) must not exceed usage_count (2)",
    ),
    "win_rate": ({"win_rate": "high"}, "win_rate must be a number, got 'high'"),
    "created": (
        {"created_at": 1e308},
        f"created_at must be a finite number in {_TIME_RANGE}, got 1e+308",
    ),
    "extra": ({"evaluator_notes": deep(40)}, "extra is nested deeper than 32 levels"),
}


@pytest.mark.parametrize("name", sorted(BAD_JSON))
def test_a_crafted_json_backup_is_refused_whole(tmp_path: Path, name: str) -> None:
    entry, message = BAD_JSON[name]
    with running(tmp_path) as (client, _):
        seed(client)
        (tmp_path / "backups" / f"{name}.json").write_text(json.dumps(_reference(entry)))
        before = snapshot(client)
        for mode in ("replace", "merge"):
            r = client.post("/load_memory", json={"path": f"{name}.json", "mode": mode})
            assert_error(r, 422, "invalid_backup", f"{name}.json: text-only/others[1]: {message}")
            assert snapshot(client) == before
        assert stored(client, "After the refused load?")["id"] == 4


def test_a_json_plan_file_is_checked_entry_by_entry(tmp_path: Path) -> None:
    plans = {"text-only": {"others": [{"question": "Q?", "correct_plan": "a", "created_at": -5}]}}
    with running(tmp_path) as (client, _):
        seed(client)
        (tmp_path / "backups" / "plans.json").write_text(json.dumps(plans))
        r = client.post("/load_memory", json={"path": "plans.json"})
        message = f"created_at must be a finite number in {_TIME_RANGE}, got -5.0"
        assert_error(r, 422, "invalid_backup", f"plans.json: text-only/others[0]: {message}")
        (tmp_path / "backups" / "nested.json").write_text("[" * 100_000 + "]" * 100_000)
        r = client.post("/load_memory", json={"path": "nested.json"})
        assert_error(r, 400, "bad_request", "nested.json is not valid JSON: nested too deeply")
        assert client.post("/memories", json=item("Still writable?")).status_code == 200


# ----------------------------------------------------------------------------- crafted live state


def test_ids_past_the_range_are_renumbered_when_the_store_opens(tmp_path: Path) -> None:
    with running(tmp_path) as (client, _):
        seed(client)
    # A live database as a load before these checks left it: memory 1 at SQLite's last id.
    run_sql(
        tmp_path / LIVE,
        f"UPDATE memories SET id = {BIG} WHERE id = 1",
        f"UPDATE memory_uses SET memory_id = {BIG} WHERE memory_id = 1",
        f"UPDATE sqlite_sequence SET seq = {BIG}",
    )
    with running(tmp_path) as (client, _):
        listed = client.get("/memories", params={"sort": "oldest"}).json()["memories"]
        assert [(m["id"], m["question"]) for m in listed] == [
            (2, "Where is the Louvre?"),
            (3, "Who wrote Macbeth?"),
            (4, "Who wrote Hamlet?"),
        ]
        detail = client.get("/memories/4").json()  # its history followed it
        assert detail["uses"] == 1 and detail["history"][0]["result_id"] == 3
        saved = stored(client, "Writable again?", used_memory_ids=[4])
        assert (saved["id"], saved["credited_ids"]) == (5, [4])
    with running(tmp_path) as (client, _):  # stable across restarts
        assert stored(client, "And after a restart?")["id"] == 6


def test_an_exhausted_sequence_answers_507_until_a_clear(tmp_path: Path) -> None:
    with running(tmp_path) as (client, service):
        seed(client)
        before = snapshot(client)
        # Poisoned while the service runs (another process writing the file); a restart would
        # repair it as well (test_ids_past_the_range_are_renumbered_when_the_store_opens).
        run_sql(tmp_path / LIVE, f"UPDATE sqlite_sequence SET seq = {BIG} WHERE name = 'memories'")
        r = client.post("/memories", json=item("No id left?", used_memory_ids=[1]))
        assert_error(r, 507, "storage_full", FULL)
        assert snapshot(client) == before  # not even the credit to memory 1 was kept
        r = client.post("/clear_memory")
        assert r.status_code == 200
        # The counter is back in range; the ids the cleared memories had are not reused.
        assert stored(client, "Writable again?")["id"] == 4
        assert len(service.store) == 1
    with running(tmp_path) as (client, _):
        assert stored(client, "After a restart?")["id"] == 5


def test_a_full_disk_answers_507_and_the_store_stays_writable(tmp_path: Path) -> None:
    with running(tmp_path) as (client, service):
        seed(client)
        before = snapshot(client)
        conn = service.store._conn
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")  # the file cannot grow: a full disk
        big = item("How long is this question? " + "x" * 100_000, used_memory_ids=[1])
        r = client.post("/memories", json=big)
        assert_error(r, 507, "storage_full", FULL)
        r = client.post("/memory_bank_save", json=[big] * 3)
        assert_error(r, 507, "storage_full", FULL)
        assert snapshot(client) == before
        conn.execute("PRAGMA max_page_count = 1073741823")  # space again
        r = client.post("/memories", json=big)
        assert r.status_code == 200
        assert (r.json()["results"][0]["id"], r.json()["results"][0]["credited_ids"]) == (4, [1])


def test_counters_saturate_at_their_bound(tmp_path: Path) -> None:
    with running(tmp_path) as (client, _):
        seed(client)
    run_sql(
        tmp_path / LIVE,
        f"UPDATE memories SET usage_count = {BIG}, success_count = {BIG} WHERE id = 2",
    )
    with running(tmp_path) as (client, _):
        for judgement in ("correct", "incorrect"):
            r = client.post(
                "/memories", json=item(f"Used, {judgement}?", judgement, used_memory_ids=[2])
            )
            assert r.status_code == 200 and r.json()["results"][0]["credited_ids"] == [2]
            row = client.get("/memories/2").json()["memory"]
            assert (row["usage_count"], row["success_count"]) == (MAX_COUNT, MAX_COUNT)
        # What the store now holds loads again from its own backup.
        assert client.post("/save_memory", json={"path": "saturated.sqlite"}).status_code == 200
        r = client.post("/load_memory", json={"path": "saturated.sqlite"})
        assert r.status_code == 200 and r.json()["memories"] == 5


def test_an_integer_sqlite_cannot_hold_is_refused_without_harm(tmp_path: Path) -> None:
    with running(tmp_path) as (client, service):
        seed(client)
        with pytest.raises(OutOfRange) as refused, service.store._txn() as cur:
            cur.execute("UPDATE memories SET usage_count = 7 WHERE id = 1")
            cur.execute("UPDATE memories SET usage_count = ? WHERE id = 2", (2**64,))
        assert (refused.value.status, refused.value.code) == (422, "out_of_range")
        assert rows(tmp_path / LIVE, "SELECT usage_count FROM memories WHERE id = 1") == [(2,)]
        with pytest.raises(InvalidRecord, match="usage_count must be a whole number"):
            service.store.add(NewMemory("Q?", "1. s", "correct", usage_count=2**64))
        assert client.post("/memories", json=item("Still writable?")).status_code == 200


# ----------------------------------------------------------------------------- extra


ONE_OR_LIST = "list[TrajectoryItem]: Input should be a valid list; "
DEEP_32 = "Value error, extra is nested deeper than 32 levels"


def test_extra_is_bounded_on_every_write(tmp_path: Path) -> None:
    with running(tmp_path) as (client, _):
        r = client.post("/memories", json=item("Too deep?", extra={"notes": deep(32)}))
        # (The body is one item or a list: the envelope names both readings.)
        assert_error(r, 422, "invalid_request", f"{ONE_OR_LIST}TrajectoryItem.extra: {DEEP_32}")
        r = client.post("/memories", json=item("Deep judge?", judgement_data=deep(32)))
        message = "Value error, judgement_data is nested deeper than 31 levels"
        assert_error(
            r, 422, "invalid_request", f"{ONE_OR_LIST}TrajectoryItem.judgement_data: {message}"
        )
        r = client.post("/memories", json=item("Too big?", extra={"notes": "x" * 1_000_000}))
        message = "Value error, extra is 1000013 characters of JSON, at most 1000000"
        assert_error(r, 422, "invalid_request", f"{ONE_OR_LIST}TrajectoryItem.extra: {message}")
        messages = [{"role": "assistant", "content": [deep(40)]}]
        r = client.post("/memory_bank_save", json=item("Deep rollout?", messages=messages))
        message = "Value error, messages is nested deeper than 32 levels"
        assert_error(
            r,
            422,
            "invalid_request",
            "list[RolloutItem]: Input should be a valid list; RolloutItem.messages: " + message,
        )
        assert client.get("/stats").json()["memories"] == 0
        # At the bound: stored and shown as sent.
        r = client.post("/memories", json=item("Deep enough?", extra={"notes": deep(31)}))
        assert r.status_code == 200
        assert client.get("/memories/1").json()["extra"] == {"notes": deep(31)}


def test_reading_a_memory_with_a_crafted_extra_never_fails(tmp_path: Path) -> None:
    with running(tmp_path) as (client, _):
        seed(client)
    run_sql(
        tmp_path / LIVE,
        f"UPDATE memories SET extra = '{_DEEP}' WHERE id = 1",
        "UPDATE memories SET created_at = 1e308 WHERE id = 2",
    )
    with running(tmp_path) as (client, _):
        r = client.get("/memories/1")
        assert r.status_code == 200
        assert r.json()["extra"] == {"error": "extra is nested deeper than 32 levels; not shown"}
        r = client.get("/memories", params={"sort": "oldest"})
        assert r.status_code == 200 and r.json()["memories"][1]["created_at"] == 1e308
        assert client.get("/memories/2").status_code == 200


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node")
def test_the_inspector_shows_any_created_at() -> None:
    """The Store tab's date cell: a time no Date can hold shows as a dash, never throws."""
    script = (ROOT / "memory_serve" / "ui" / "app.js").read_text()
    when = re.search(r"function when\(epoch\) \{.*?\n\}", script, re.S)
    assert when is not None
    values = [1.7e9, 0, 253402300799, 1e308, -1e12, None, "x"]
    code = f"const when = ({when.group(0)});\nconsole.log(JSON.stringify({values!r}.map(when)));"
    code = code.replace("None", "null")
    out = subprocess.run(["node", "-e", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [
        "2023-11-14 22:13:20",
        "1970-01-01 00:00:00",
        "9999-12-31 23:59:59",
        "–",
        "–",
        "–",
        "–",
    ]


# ----------------------------------------------------------------------------- paths

BAD_PATHS = [
    ("a" * 5000, "invalid path: 5000 characters, at most 1024"),
    ("x/" + "a" * 300, "invalid path: a file or folder name of 300 bytes, at most 255"),
    ("é" * 200, "invalid path: a file or folder name of 400 bytes, at most 255"),
    ("a\nb.sqlite", "invalid path: it holds the control character U+000A"),
    ("a\x00b", "invalid path: it holds the control character U+0000"),
    (
        "~no-such-user-here/x",
        "invalid path '~no-such-user-here/x': an unknown ~user or a symlink loop",
    ),
    ("loop/m.sqlite", "invalid path 'loop/m.sqlite': an unknown ~user or a symlink loop"),
]


@pytest.mark.parametrize(("raw", "message"), BAD_PATHS, ids=range(len(BAD_PATHS)))
def test_persistence_paths_are_checked_before_the_file_system(
    tmp_path: Path, raw: str, message: str
) -> None:
    (tmp_path / "backups").mkdir()  # with a symlink loop in it
    (tmp_path / "backups" / "loop").symlink_to("loop")
    with running(tmp_path) as (client, _):
        seed(client)
        before = snapshot(client)
        for route, body in (
            ("/save_memory", {"path": raw}),
            ("/load_memory", {"path": raw}),
            ("/batch_evaluate", {"output_dir": raw, "rules": ["first"]}),
        ):
            r = client.post(route, json=body)
            assert_error(r, 422, "invalid_request", message)
            assert str(tmp_path) not in r.text
        assert snapshot(client) == before
        assert client.post("/memories", json=item("Still writable?")).status_code == 200
