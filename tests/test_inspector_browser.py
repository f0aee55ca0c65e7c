"""The memory inspector in a real headless Chromium (tests/browser.py) against memory_serve on a
real uvicorn server with a store seeded through the API: sign in, page, search, filter, a
memory's history, the retrieval preview's numbers against ``/memory``'s, the runs charts. The
screenshots land in ``$MIA_SCREENSHOTS`` (docs/img for the docs) or the test's folder."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from memory_serve.app import build_app
from memory_serve.config import load_config
from memory_serve.service import MemoryService
from memory_serve.store import MemoryStore
from mia.embedding import shared_embedder
from mia.eval.report import summarize, write_report
from mia.http import ServerThread
from tests.browser import chromium, screenshot_dir, severe_logs, wait
from ttrl import curve

pytestmark = pytest.mark.slow
TOKEN = "inspector-test-token"
XSS = '<img src=x onerror="window.__pwned=1">Who wrote this?'

TOPICS = [
    ("Where is the Eiffel Tower?", '1. search (query "Eiffel Tower location" -> Paris)'),
    ("Who designed the Eiffel Tower?", '1. search (query "Eiffel Tower architect" -> Sauvestre)'),
    ("When was the Eiffel Tower built?", '1. search (query "Eiffel Tower built" -> 1889)'),
    ("How tall is the Eiffel Tower?", '1. search (query "Eiffel Tower height" -> 330 m)'),
    ("Which river flows through Paris?", '1. search (query "river Paris" -> Seine)'),
    ("Which river flows through Rome?", '1. search (query "river Rome" -> Tiber)'),
    ("What is the capital of Australia?", '1. search (query "capital Australia" -> Canberra)'),
    ("What is the capital of Canada?", '1. search (query "capital Canada" -> Ottawa)'),
    ("Who painted the Mona Lisa?", '1. search (query "Mona Lisa painter" -> Leonardo)'),
    ("Where is the Mona Lisa kept?", '1. search (query "Mona Lisa museum" -> the Louvre)'),
    ("How long is the Nile?", '1. search (query "Nile length" -> 6650 km)'),
    ("How deep is Lake Baikal?", '1. search (query "Lake Baikal depth" -> 1642 m)'),
]


@contextlib.contextmanager
def inspector(tmp_path: Path) -> Iterator[tuple[str, httpx.Client]]:
    runs = tmp_path / "runs"
    cfg = load_config(None, ["llm.enabled=false", "compress.mode=rules", f"ui.runs_dir={runs}"])
    store = MemoryStore(tmp_path / "memory.sqlite", shared_embedder(), cfg.store)
    service = MemoryService(cfg, store, None)
    try:
        with (
            ServerThread(build_app(service, token=TOKEN)) as url,
            httpx.Client(
                base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as client,
        ):
            yield url, client
    finally:
        store.close()


def seed(client: httpx.Client, runs: Path) -> None:
    """36 memories through the API; later trajectories use earlier memories (history)."""
    items = []
    for n in range(3):
        for i, (q, summary) in enumerate(TOPICS):
            question = q if n == 0 else f"{q} (variant {n})"
            items.append(
                {
                    "question": question,
                    "judgement": "correct" if (i + n) % 3 else "incorrect",
                    "workflow_summary": summary,
                    "data_id": f"q{n}-{i}",
                    "source": "seed" if n < 2 else "proxy",
                }
            )
    r = client.post("/memories", json=items[:24])
    assert r.status_code == 200, r.text
    # The third round used memories 1 and 2 (or 5): their history and win-rates move.
    for it in items[24:]:
        it["used_memory_ids"] = [1, 2] if "Eiffel" in it["question"] else [5]
        assert client.post("/memories", json=it).status_code == 200
    r = client.post(
        "/memories", json={"question": XSS, "judgement": "incorrect", "workflow_summary": "1. x"}
    )
    assert r.status_code == 200
    # A TTRL run and an evaluation, written by the code that writes them for real.
    ttrl_run = runs / "ttrl-demo" / "ttrl"
    for b, (acc, reward) in enumerate([(0.25, 0.3), (0.5, 0.45), (0.625, 0.5), (0.75, 0.7)]):
        curve.write_row(
            ttrl_run / "accuracy.jsonl",
            {"batch": b, "questions": 8, "accuracy": acc, "reward_mean": reward, "memories": b},
        )
    rows = {
        "none": [{"correct": i < 2} for i in range(8)],
        "plan_only": [{"correct": i < 4} for i in range(8)],
        "mia": [{"correct": i < 6} for i in range(8)],
    }
    summaries = [summarize(r, policy) for policy, r in rows.items()]
    write_report(runs / "eval-demo", summaries, list(rows.values()), plot=False)


def ids_in(driver: Any, table_id: str) -> list[int]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, f"#{table_id} tbody tr[data-id]")
    return [int(r.get_attribute("data-id")) for r in rows]


def wait_store(driver: Any, contains: str = "") -> None:
    def ready(d: Any) -> bool:
        t = d.find_element("id", "memories")
        return t.get_attribute("data-state") == "ready" and contains in (
            t.get_attribute("data-query") or ""
        )

    wait(driver, ready)


def api_ids(client: httpx.Client, **params: Any) -> tuple[int, list[int]]:
    r = client.get("/memories", params=params)
    assert r.status_code == 200, r.text
    return r.json()["total"], [m["id"] for m in r.json()["memories"]]


def test_inspector_in_a_real_browser(tmp_path: Path) -> None:
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    shots = screenshot_dir(tmp_path)
    with inspector(tmp_path) as (url, client), chromium() as driver:
        seed(client, tmp_path / "runs")

        # Without a session the page is a sign-in form (no data); the token is typed into it.
        driver.get(f"{url}/ui")
        box = wait(driver, lambda d: d.find_element(By.ID, "login-token"))
        box.send_keys("wrong")
        driver.find_element(By.ID, "login-submit").click()
        # The form's answer replaces the page: wait for the new page's message, not the old one.
        wait(driver, lambda d: d.find_element(By.ID, "login-error").text == "wrong token")
        driver.find_element(By.ID, "login-token").send_keys(TOKEN)
        driver.find_element(By.ID, "login-submit").click()
        wait_store(driver)
        assert driver.current_url == f"{url}/ui"
        severe_logs(driver)  # drop the sign-in page's expected 401s
        # The cookie is HttpOnly: page scripts cannot read it.
        assert driver.execute_script("return document.cookie") == ""

        # The store: first page as GET /memories gives it, the total, the header's counts.
        total, first = api_ids(client, limit=50)
        assert total == 37
        assert ids_in(driver, "memories") == first
        info = driver.find_element(By.ID, "page-info")
        assert (info.get_attribute("data-total"), info.text) == ("37", "1–37 of 37")
        wait(driver, lambda d: "37 memories" in d.find_element(By.ID, "store-info").text)

        # Stored text is shown as text, never run as markup.
        xss_row = driver.find_element(By.CSS_SELECTOR, "#memories tbody tr[data-id='37']")
        assert xss_row.find_element(By.CSS_SELECTOR, "td.question").text == XSS
        assert driver.execute_script("return window.__pwned === undefined")
        with pytest.raises(NoAlertPresentException):
            driver.switch_to.alert.text  # noqa: B018

        # Search (typed; the page asks the server), then a filter on top of it.
        driver.find_element(By.ID, "search").send_keys("eiffel")
        wait_store(driver, "q=eiffel")
        n, want = api_ids(client, q="eiffel", limit=50)
        assert n == 12 and ids_in(driver, "memories") == want
        Select(driver.find_element(By.ID, "filter-judgement")).select_by_value("incorrect")
        wait_store(driver, "judgement=incorrect")
        n, want = api_ids(client, q="eiffel", judgement="incorrect", limit=50)
        assert 0 < n < 12 and ids_in(driver, "memories") == want
        classes = [
            r.get_attribute("class")
            for r in driver.find_elements(By.CSS_SELECTOR, "#memories tbody tr")
        ]
        assert all("incorrect" in c for c in classes)

        # Bucket filter + sort by win-rate, then paging over the whole store.
        driver.find_element(By.ID, "search").clear()
        Select(driver.find_element(By.ID, "filter-judgement")).select_by_value("")
        Select(driver.find_element(By.ID, "filter-bucket")).select_by_value("text-only/others")
        Select(driver.find_element(By.ID, "sort")).select_by_value("win_rate_asc")
        wait_store(driver, "bucket=text-only%2Fothers&sort=win_rate_asc")
        Select(driver.find_element(By.ID, "page-size")).select_by_value("25")
        wait_store(driver, "limit=25&bucket")
        _, want = api_ids(client, limit=25, bucket="text-only/others", sort="win_rate_asc")
        assert ids_in(driver, "memories") == want
        driver.find_element(By.ID, "next").click()
        wait_store(driver, "offset=25&limit=25")
        _, want = api_ids(
            client, offset=25, limit=25, bucket="text-only/others", sort="win_rate_asc"
        )
        assert len(want) == 12 and ids_in(driver, "memories") == want
        assert driver.find_element(By.ID, "page-info").text == "26–37 of 37"
        assert not driver.find_element(By.ID, "next").is_enabled()

        # One memory's history: the questions that used it and whether they succeeded.
        driver.find_element(By.ID, "prev").click()
        wait_store(driver, "offset=0&limit=25")
        Select(driver.find_element(By.ID, "sort")).select_by_value("oldest")
        wait_store(driver, "sort=oldest")
        driver.find_element(By.CSS_SELECTOR, "#memories tbody tr[data-id='1']").click()
        wait(driver, lambda d: d.find_element(By.ID, "detail").get_attribute("data-id") == "1")
        detail = client.get("/memories/1").json()
        assert detail["uses"] == 4
        shown = [
            (
                r.find_elements(By.TAG_NAME, "td")[1].text,
                r.find_element(By.CSS_SELECTOR, "td.outcome").text,
            )
            for r in driver.find_elements(By.CSS_SELECTOR, "#detail-history tbody tr")
        ]
        assert shown == [
            (u["question"], "succeeded" if u["success"] else "failed") for u in detail["history"]
        ]
        assert {s for _, s in shown} == {"succeeded", "failed"}
        assert driver.find_element(By.ID, "detail-history-title").text == "History (4 uses)"
        driver.save_screenshot(str(shots / "inspector-store.png"))

        # The retrieval preview, from the memory's own question, then a typed one.
        driver.find_element(By.ID, "detail-preview").click()
        panel = driver.find_element(By.ID, "tab-preview")
        wait(driver, lambda d: panel.get_attribute("data-state") == "ready")
        question = "Where can I find the Eiffel Tower?"
        box = driver.find_element(By.ID, "preview-question")
        box.clear()
        box.send_keys(question)
        driver.find_element(By.ID, "preview-topk").send_keys("3")
        driver.find_element(By.ID, "preview-run").click()
        wait(
            driver,
            lambda d: (
                panel.get_attribute("data-question") == question
                and panel.get_attribute("data-state") == "ready"
            ),
        )
        body = {"question": question, "category": "others", "mem_top_k": 3}
        plain = client.post("/memory", json=body).json()
        explained = client.post("/memory", json={**body, "explain": True}).json()
        assert "explain" not in plain
        x = explained["explain"]
        for side, table, ids in (
            ("positives", "preview-positives", "positive_ids"),
            ("negatives", "preview-negatives", "negative_ids"),
        ):
            assert ids_in(driver, table) == plain[ids]
            want_rows = x[side]
            assert len(want_rows) == 3
            for row, want_row in zip(
                driver.find_elements(By.CSS_SELECTOR, f"#{table} tbody tr[data-id]"),
                want_rows,
                strict=True,
            ):
                cells = row.find_elements(By.CSS_SELECTOR, "td.num[data-value]")
                got = [float(c.get_attribute("data-value")) for c in cells]
                numbers = [want_row[k] for k in ("similarity", "normalised", "win_rate", "score")]
                assert got == numbers  # exactly the numbers /memory ranked by
                assert [c.text for c in cells] == [f"{v:.4f}" for v in numbers]
        assert (
            driver.find_element(By.ID, "preview-context").get_attribute("textContent")
            == plain["context"]
        )
        summary = driver.find_element(By.ID, "preview-summary").text
        assert f"bucket text-only/others: {x['bucket_size']} memories" in summary
        driver.save_screenshot(str(shots / "inspector-preview.png"))

        # Runs: the TTRL curve (one point per batch) and the evaluation's bars per policy.
        driver.find_element(By.ID, "tab-button-runs").click()
        wait(
            driver,
            lambda d: d.find_element(By.ID, "runs-list").get_attribute("data-state") == "ready",
        )
        runs = {
            b.get_attribute("data-id"): b
            for b in driver.find_elements(By.CSS_SELECTOR, "#runs-list .run-link")
        }
        assert set(runs) == {"ttrl-demo/ttrl/accuracy.jsonl", "eval-demo/summary.json"}
        view = driver.find_element(By.ID, "run-view")
        runs["ttrl-demo/ttrl/accuracy.jsonl"].click()
        wait(driver, lambda d: view.get_attribute("data-id") == "ttrl-demo/ttrl/accuracy.jsonl")
        points = view.find_elements(By.CSS_SELECTOR, "circle.pt[data-series='accuracy']")
        assert [
            (p.get_attribute("data-x"), float(p.get_attribute("data-value"))) for p in points
        ] == [
            ("1", 0.25),
            ("2", 0.5),
            ("3", 0.625),
            ("4", 0.75),
        ]
        assert len(view.find_elements(By.CSS_SELECTOR, "circle.pt[data-series='reward_mean']")) == 4
        driver.save_screenshot(str(shots / "inspector-runs.png"))
        runs["eval-demo/summary.json"].click()
        wait(driver, lambda d: view.get_attribute("data-id") == "eval-demo/summary.json")
        bars = view.find_elements(By.CSS_SELECTOR, "rect.bar")
        assert [
            (b.get_attribute("data-label"), float(b.get_attribute("data-value"))) for b in bars
        ] == [
            ("none", 0.25),
            ("plan_only", 0.5),
            ("mia", 0.75),
        ]
        driver.save_screenshot(str(shots / "inspector-eval.png"))
        assert severe_logs(driver) == []
