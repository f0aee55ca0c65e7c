"""memory_serve over HTTP: a real uvicorn server on an ephemeral port, real SQLite, the real
MiniLM embedder, and ScriptedChat standing in for the manager/planner LLMs (exact prompts)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from role_fixtures import memory_client

from memory_serve.config import load_config
from memory_serve.records import NewMemory
from memory_serve.service import MemoryService
from memory_serve.store import MemoryStore
from memory_serve.ttrl import seeded_rng
from mia.embedding import shared_embedder
from mia.llm.scripted import ScriptedChat
from mia.prompts import planner as planner_text
from mia.prompts.manager import choose_plan_prompt, compress_prompt
from mia.prompts.planner import plan_messages
from mia.trace import format_trace

EXEC_MESSAGES = [
    {"role": "assistant", "content": "<think>search</think><tool_call>{...}</tool_call>"},
    {"role": "user", "content": "<tool_response>\nThe tower is in Paris.\n</tool_response>"},
    {"role": "assistant", "content": "<answer>Paris</answer>"},
]


class CountingEmbedder:
    def __init__(self, inner) -> None:
        self.inner, self.name, self.dim, self.calls = inner, inner.name, inner.dim, 0

    def encode(self, texts):
        self.calls += 1
        return self.inner.encode(texts)


@contextlib.contextmanager
def running(
    tmp_path: Path,
    manager: ScriptedChat | None = None,
    planner: ScriptedChat | None = None,
    overrides: tuple[str, ...] = (),
    token: str | None = None,
    embedder=None,
    db: str = "memory.sqlite",
) -> Iterator[tuple[httpx.Client, MemoryService]]:
    cfg = load_config(None, list(overrides))
    store = MemoryStore(tmp_path / db, embedder or shared_embedder(), cfg.store)
    with memory_client(cfg, store, manager, planner, token=token) as served:
        yield served


def summariser(messages) -> str:
    return "<think>short</think>1. Search the landmark (question -> city)"


def item(question: str, judgement: str = "correct", **extra) -> dict:
    return {"question": question, "judgement": judgement, "workflow_summary": "1. s", **extra}


def test_save_then_retrieve_exact_payloads(tmp_path: Path) -> None:
    manager = ScriptedChat(summariser)
    with running(tmp_path, manager) as (client, _):
        # Reference field names: a JSON list, list caption, used_memory_indices.
        body = [
            {
                "data_id": 7,
                "question": "Where is the Eiffel Tower?",
                "image_caption": [],
                "messages": EXEC_MESSAGES,
                "plan": "1. search",
                "judgement": "correct",
                "used_memory_indices": [],
            }
        ]
        r = client.post("/batch_memory_save", json=body)
        assert r.status_code == 200, r.text
        assert r.json() == {
            "status": "success",
            "results": [
                {
                    "action": "inserted",
                    "id": 1,
                    "replaced_id": None,
                    "credited_ids": [],
                    "evicted_ids": [],
                    "category": "others",
                    "modality": "text-only",
                }
            ],
        }
        trace = format_trace("Where is the Eiffel Tower?", EXEC_MESSAGES, max_tool_words=1024)
        assert manager.calls[0]["messages"] == [
            {"role": "user", "content": compress_prompt(trace, 300)}
        ]
        assert trace.startswith("### Question: Where is the Eiffel Tower?\n\n### Round 1:")

        r = client.post("/memory", json={"question": "Where is the Eiffel Tower located?"})
        context = (
            "# Retrieved Relevant Memories\n\n"
            "## Positive Examples (Successful Strategies - 1)\n[Example 1]\n"
            "- Modality: text-only\n- Judgement: correct\n"
            "- Question: Where is the Eiffel Tower?\n"
            "- Workflow Summary:\n1. Search the landmark (question -> city)\n\n"
            "## Negative Examples (Failure Lessons - 0)\nNone found."
        )
        assert r.json() == {
            "context": context,
            "positive_ids": [1],
            "negative_ids": [],
            "pos_indices": [1],
            "neg_indices": [],
            "prompt": context,
            "indices": [1],
        }
        # A list in -> a list out; an empty bucket -> "None found." twice.
        r = client.post(
            "/memory", json=[{"question": "Who?", "image_caption": "a face", "top_k": 1}]
        )
        assert (
            r.json()[0]["positive_ids"] == [] and r.json()[0]["context"].count("None found.") == 2
        )
        record = client.get("/stats").json()
        assert record["memories"] == 1 and record["buckets"] == {
            "text-only/others": {"correct": 1, "incorrect": 0}
        }


def test_plan_cold_start_then_planner(tmp_path: Path) -> None:
    manager = ScriptedChat(lambda m: "<think>cold</think>\n1. Search (q -> a)")
    planner = ScriptedChat(lambda m: "<think>a</think>x</think>\n1. Search the river (q -> name)")
    with running(tmp_path, manager, planner) as (client, _):
        client.post("/memories", json=item("Which river flows through Paris?"))
        r = client.post("/plan", json={"question": "Which river flows through Rome?"})
        body = r.json()
        # Fewer than top_k (2) positives or negatives: the manager plans.
        assert body["planner"] == "manager" and body["plan"] == "1. Search (q -> a)"
        assert body["memory_ids"] == [1] and body["positive_ids"] == [1]
        expected = plan_messages(body["context"], "Which river flows through Rome?", image=False)
        assert manager.calls[-1]["messages"] == expected
        assert body["messages"] == [
            *expected,
            {"role": "assistant", "content": "<think>cold</think>\n1. Search (q -> a)"},
        ]
        assert expected[0] == {"role": "system", "content": planner_text.PLANNER_SYSTEM_PROMPT}
        assert "web_image_to_image_search" not in expected[1]["content"]

        client.post(
            "/memories",
            json=[
                item("Which river flows through Vienna?"),
                item("Which river flows through Cairo?", "incorrect"),
                item("Which river flows through London?", "incorrect"),
            ],
        )
        body = client.post("/plan", json={"question": "Which river flows through Rome?"}).json()
        assert body["planner"] == "planner" and len(planner.calls) == 1
        assert body["plan"] == "1. Search the river (q -> name)"  # after the LAST </think>
        assert len(body["positive_ids"]) == 2 and len(body["negative_ids"]) == 2
        # An image question (caption) gets the image variant of the prompt.
        body = client.post(
            "/plan", json={"question": "Which river is this?", "image_caption": ["a river"]}
        ).json()
        assert body["messages"][1]["content"] == planner_text.plan_prompt(
            body["context"], "Which river is this?", image=True
        )
        assert "ONLY ONCE" in body["messages"][1]["content"]


def test_judge_replan_and_replan(tmp_path: Path) -> None:
    def manager_reply(m) -> str:
        return (
            "no"
            if m[-1]["content"] == planner_text.judge_prompt("T")
            else "1. Cold replan (q -> c)"
        )

    manager = ScriptedChat(manager_reply)
    planner = ScriptedChat(
        ["<think>doubt</think>\nYes.", "<think>why</think>\n1. Search again (q -> b)"]
    )
    past = [
        {"role": "system", "content": planner_text.PLANNER_SYSTEM_PROMPT},
        {"role": "user", "content": "plan please"},
        {"role": "assistant", "content": "1. Search"},
    ]
    with running(tmp_path, manager, planner) as (client, _):
        # Reference names: trace/memory_indices; 4 memories -> the planner judges.
        r = client.post(
            "/judge_replan",
            json={
                "trace": "### Question: Q?",
                "past_messages": past,
                "memory_indices": [1, 2, 3, 4],
            },
        )
        judge_turn = {"role": "user", "content": planner_text.judge_prompt("### Question: Q?")}
        assert r.json() == {
            "need_replan": "yes",  # the reference's text; the boolean is replan_needed
            "replan_needed": True,
            "decision": "yes",
            "messages": [
                *past,
                judge_turn,
                {"role": "assistant", "content": "<think>doubt</think>\nYes."},
            ],
            "planner": "planner",
        }
        # Fewer memories (cold start) -> the manager judges; "no" -> no replan.
        r = client.post("/judge_replan", json={"workflow": "T", "past_messages": past})
        got = r.json()
        assert (got["need_replan"], got["replan_needed"], got["decision"], got["planner"]) == (
            "no",
            False,
            "no",
            "manager",
        )
        # /replan as the inference driver calls it (mem_top_k=0, pass_num=2): the reference
        # retrieves top_k + pass_num = 2 of each side; an empty store is a cold start (manager).
        history = [*past, judge_turn, {"role": "assistant", "content": "yes"}]
        driver = {"question": "Q?", "past_messages": history, "mem_top_k": 0, "pass_num": 2}
        replan_turn = {"role": "user", "content": planner_text.replan_prompt("Q?")}
        r = client.post("/replan", json=driver)
        assert r.json() == {
            "replan": "1. Cold replan (q -> c)",
            "messages": [
                *history,
                replan_turn,
                {"role": "assistant", "content": "1. Cold replan (q -> c)"},
            ],
            "planner": "manager",
            "pos_indices": [],
            "neg_indices": [],
            "memory_ids": [],
        }
        # Two of each side stored: the Planner replans; the memories stay out of the prompt.
        client.post(
            "/memories",
            json=[item("Q one?"), item("Q two?"), item("Q three?", "incorrect"), item("Q4?", "no")],
        )
        r = client.post("/replan", json=driver)
        assert r.json() == {
            "replan": "1. Search again (q -> b)",
            "messages": [
                *history,
                replan_turn,
                {"role": "assistant", "content": "<think>why</think>\n1. Search again (q -> b)"},
            ],
            "planner": "planner",
            "pos_indices": [],
            "neg_indices": [],
            "memory_ids": sorted(r.json()["memory_ids"]),
        }
        assert sorted(r.json()["memory_ids"]) == [1, 2, 3, 4]
        assert planner.calls[-1]["messages"] == [*history, replan_turn]
        assert "Only the search tool" in replan_turn["content"]


def test_replan_train_conversation(tmp_path: Path) -> None:
    planner = ScriptedChat(["<think>r</think>\n1. Verify the date (q -> year)"])
    with running(tmp_path, ScriptedChat([]), planner) as (client, _):
        r = client.post(
            "/replan_train",
            json={
                "data_id": "x1",
                "question": "When was it built?",
                "plan": "1. Search",
                "trace": "TRACE",
                "mem_context1": "MEMORY",
                "mem_context2": "unused",
            },
        )
        assert r.json() == {"replan": True, "content": "1. Verify the date (q -> year)"}
        assert planner.calls[0]["messages"] == [
            {"role": "system", "content": planner_text.PLANNER_SYSTEM_PROMPT},
            {
                "role": "user",
                "content": planner_text.plan_prompt("MEMORY", "When was it built?", image=True),
            },
            {"role": "assistant", "content": "1. Search"},
            {"role": "user", "content": planner_text.judge_prompt("TRACE")},
            {"role": "assistant", "content": planner_text.REPLAN_TRAIN_DECISION},
            {"role": "user", "content": planner_text.replan_prompt("When was it built?")},
        ]


def test_errors_auth_and_llm_failure(tmp_path: Path) -> None:
    with running(tmp_path, ScriptedChat([]), token="s3cret") as (client, service):
        assert httpx.get(f"{client.base_url}/memory").status_code == 401
        r = httpx.post(f"{client.base_url}/memory", json={"question": "q"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert httpx.get(f"{client.base_url}/health").json()["memories"] == 0
        r = client.post("/memory", json={"mem_top_k": 2})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
        assert "question" in r.json()["error"]["message"]
        r = client.post("/memories", json={"question": "q", "workflow_summary": "s"})
        assert r.status_code == 422
        assert r.json()["error"]["message"] == "judgement is required ('correct' or 'incorrect')"
        # The scripted LLM has no reply left: 502, and nothing half-stored.
        r = client.post("/memories", json=[item("A?"), {"question": "B?", "judgement": "correct"}])
        assert r.status_code == 502 and r.json()["error"]["code"] == "llm_error"
        assert len(service.store) == 0
        r = client.post("/plan", json={"question": "q"})
        assert r.status_code == 502
        r = client.post(
            "/memory", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
        r = client.post("/load_memory", json={"path": "missing.sqlite"})
        assert r.status_code == 404 and r.json()["error"]["message"] == (
            "nothing to load at missing.sqlite"
        )


def test_restart_keeps_memories_without_reembedding(tmp_path: Path) -> None:
    with running(tmp_path, ScriptedChat(summariser)) as (client, _):
        client.post(
            "/memories",
            json=[
                item("Who painted the Mona Lisa?"),
                item("Who painted the Last Supper?", "incorrect"),
            ],
        )
        before = client.post("/memory", json={"question": "Who painted Guernica?"}).json()
    counting = CountingEmbedder(shared_embedder())
    with running(tmp_path, ScriptedChat([]), embedder=counting) as (client, _):
        assert counting.calls == 0
        after = client.post("/memory", json={"question": "Who painted Guernica?"}).json()
        assert after == before and after["negative_ids"] == [2]
        assert counting.calls == 1  # the query only


def rollout(data_id, question, judgement, plan, n_messages, used) -> dict:
    return {
        "data_id": data_id,
        "question": question,
        "plan": plan,
        "judgement": judgement,
        "temp_messages": [{"role": "assistant", "content": f"m{i}"} for i in range(n_messages)],
        "used_memory_indices": used,
    }


def test_ttrl_buffer_evaluate_consolidate_save_load(tmp_path: Path) -> None:
    def manager_reply(messages) -> str:
        text = messages[-1]["content"]
        return "<think>2 looks best</think>2" if "Candidate plans" in text else "1. s (a -> b)"

    manager = ScriptedChat(manager_reply)
    out = tmp_path / "ttrl"
    overrides = (f"ttrl.output_dir={out}", f"persist.allowed_root={tmp_path}")
    with running(tmp_path, manager, overrides=overrides) as (client, svc):
        client.post("/memories", json=[item("Seed one?"), item("Seed two?")])
        qa, qb = "Which river flows through Rome?", "Who wrote Faust?"
        plans = ["1. x\n2. y", "1. x", "1. x\n2. y\n3. z"]
        rolls = [
            rollout("a", qa, "incorrect", plans[0], 3, [1]),
            rollout("a", qa, "correct", plans[1], 4, [1]),
            rollout("a", qa, "correct", plans[2], 2, [1]),
            rollout("b", qb, False, "1. q", 1, [2]),
        ]
        r = client.post("/memory_bank_save", json=rolls)
        assert r.json() == {"status": "success", "buffered": 4, "ids": [1, 2, 3, 4]}
        assert client.post("/memory_bank_save", json={"question": "q"}).status_code == 422
        stats = client.get("/stats").json()
        assert (stats["buffered_rollouts"], stats["buffered_questions"]) == (4, 2)

        r = client.post("/batch_evaluate", json={"step": 3})
        body = r.json()
        rand = seeded_rng(0, "evaluate", "a").randrange(3)
        expected_random = ([False, True, True][rand] + 0) / 2
        assert body["processed_count"] == 2 and body["choice_fallbacks"] == 0
        assert body["accuracy"] == {
            "random": expected_random,
            "first": 0.0,
            "shortest": 0.5,  # "1. x" (correct) for a
            "longest": 0.5,  # the 3-step plan (correct) for a
            "choice": 0.5,  # the LLM said 2 -> "1. x"
        }
        assert manager.calls[-1]["messages"][0]["content"] == choose_plan_prompt(qa, "", plans)
        rows = [json.loads(x) for x in (out / "evaluated-choice.jsonl").read_text().splitlines()]
        assert [
            (x["data_id"], x["selected_index"], x["step"], x["num_rollouts"]) for x in rows
        ] == [
            ("a", 1, 3, 3),
            ("b", 0, 3, 1),
        ]
        assert set(body["files"]) == {"random", "first", "shortest", "longest", "choice"}

        r = client.post("/consolidate_memories")
        body = r.json()
        # a: the correct rollout with the fewest messages is stored; its incorrect sibling is a
        # duplicate question and never replaces it. b: its lone incorrect rollout is stored.
        assert (body["questions"], body["saved_positives"], body["saved_negatives"]) == (2, 1, 1)
        assert body["saved_plan_pairs"] == 1
        assert [(x["action"], x["credited_ids"]) for x in body["results"]] == [
            ("inserted", [1]),  # majority correct (2 > 1): the positive credits memory 1
            ("kept_existing", []),
            ("inserted", [2]),  # lone negative: memory 2 records a failure
        ]
        store = svc.store
        assert store.get(3).plan == plans[2] and store.get(3).source == "ttrl"
        assert (store.get(1).usage_count, store.get(1).win_rate) == (2, 1.0)
        assert (store.get(2).usage_count, store.get(2).win_rate) == (2, 0.5)
        assert [(p.correct_plan, p.incorrect_plan) for p in store.plan_pairs()] == [
            (plans[2], plans[0])
        ]
        assert client.get("/stats").json()["buffered_rollouts"] == 0

        # Persistence: the default target is ttrl.output_dir (SQLite copy + reference JSON).
        r = client.post("/save_memory")
        assert r.json()["format"] == "dir" and r.json()["memories"] == 4
        layout = json.loads((out / "workflow_memory.jsonl").read_text())
        assert [e["question"] for e in layout["text-only"]["others"]] == [
            "Seed one?",
            "Seed two?",
            qa,
            qb,
        ]
        assert (
            json.loads((out / "plan_memory.jsonl").read_text())["text-only"]["others"][0][
                "correct_plan"
            ]
            == plans[2]
        )
        before = client.post("/memory", json={"question": qa}).json()
        assert client.post("/clear_memory").json()["status"] == "success"
        assert client.get("/stats").json()["memories"] == 0
        r = client.post("/load_memory", json={"load_path": str(out)})
        assert r.json() == {
            "status": "success",
            "format": "dir",
            "memories": 4,
            "plan_pairs": 1,
            "imported": 5,
        }
        assert client.post("/memory", json={"question": qa}).json() == before

        # Reference JSON only: import re-embeds; replace mode drops the workflow memories that
        # were there (plan pairs stay: they are another file).
        r = client.post("/save_memory", json={"save_path": str(tmp_path / "ref.json")})
        assert r.json()["files"] == [str(tmp_path / "ref.json")]
        client.post("/memories", json=item("Extra question?"))
        r = client.post("/load_memory", json={"path": str(tmp_path / "ref.json")})
        assert (r.json()["format"], r.json()["memories"], r.json()["imported"]) == ("json", 4, 4)
        after = client.post("/memory", json={"question": qa}).json()
        assert after["context"] == before["context"]
        r = client.post(
            "/load_memory",
            json={"path": str(out / "plan_memory.jsonl"), "mode": "merge"},
        )
        assert (r.json()["memories"], r.json()["plan_pairs"]) == (4, 2)
        r = client.post("/load_memory", json={"path": str(out / "plan_memory.jsonl")})
        assert (r.json()["memories"], r.json()["plan_pairs"]) == (4, 1)
        r = client.post(
            "/load_memory", json={"path": str(tmp_path / "ref.json"), "format": "sqlite"}
        )
        assert r.status_code == 400


def test_persist_allowed_root(tmp_path: Path) -> None:
    root = tmp_path / "allowed"
    with running(tmp_path, ScriptedChat([]), overrides=(f"persist.allowed_root={root}",)) as (
        client,
        _,
    ):
        r = client.post("/save_memory", json={"path": str(tmp_path / "elsewhere.sqlite")})
        assert r.status_code == 403 and r.json()["error"] == {
            "code": "path_not_allowed",
            "message": f"path {str(tmp_path / 'elsewhere.sqlite')!r} is outside the "
            "persistence folder (persist.allowed_root)",
        }
        r = client.post("/save_memory", json={"path": str(root / "m.sqlite")})
        assert r.status_code == 200 and (root / "m.sqlite").is_file()
        assert client.post("/save_memory").status_code == 400  # no path, no ttrl.output_dir


def _error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and r.json()["error"]["code"] == code, r.json()
    return r.json()["error"]["message"]


def test_persistence_is_confined_to_mia_home_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("MIA_HOME", str(home))
    backups, runs = home / "memory" / "backups", home / "runs"
    outside = tmp_path / "victim.txt"
    outside.write_text("precious")
    (backups).mkdir(parents=True)
    (backups / "escape").symlink_to(tmp_path)  # a symlink inside the root pointing out of it
    with running(tmp_path, ScriptedChat([]), overrides=("llm.enabled=false", "compress.mode=identity")) as (client, svc):  # fmt: skip
        client.post("/memories", json=item("Where is the Eiffel Tower?")).raise_for_status()
        # Relative paths land under $MIA_HOME/memory/backups, never the server's cwd.
        r = client.post("/save_memory", json={"path": "m.sqlite"})
        assert r.status_code == 200 and r.json()["files"] == [str(backups / "m.sqlite")]
        r = client.post("/batch_evaluate", json={"output_dir": 7, "rules": ["first"]})
        assert r.status_code == 200 and (backups / "7" / "evaluated-first.jsonl").is_file()
        assert not (Path.cwd() / "7").exists()
        # TTRL's default run folders are allowed too.
        r = client.post("/save_memory", json={"path": str(runs / "ttrl-1" / "memory")})
        assert r.status_code == 200 and (runs / "ttrl-1" / "memory" / "memory.sqlite").is_file()
        # Outside: absolute, .., ~, a symlink out: 403, naming only what the client sent.
        for raw in (str(outside), "../../../victim.txt", "~/x.json", "escape/victim.txt"):
            for route, body in (
                ("/save_memory", {"path": raw, "format": "json"}),
                ("/load_memory", {"path": raw}),
                ("/batch_evaluate", {"output_dir": raw}),
            ):
                message = _error(client.post(route, json=body), 403, "path_not_allowed")
                assert message == (
                    f"path {raw!r} is outside the persistence folder (persist.allowed_root)"
                )
        assert outside.read_text() == "precious"
        # OS errors name the path as given, not the server's folders.
        (backups / "afile").write_text("x")
        message = _error(
            client.post("/save_memory", json={"path": "afile/m.sqlite"}), 400, "bad_request"
        )
        assert (
            message == "cannot save to afile/m.sqlite: File exists"
        )  # not "[Errno 17] ... /abs/path"
        message = _error(client.post("/load_memory", json={"path": "afile"}), 400, "bad_request")
        assert str(tmp_path) not in message and message.startswith("afile is not a folder")
        assert svc.persist.base == backups.resolve()


def test_only_memory_backups_are_overwritten(tmp_path: Path) -> None:
    """With the opt-out (allowed_root: any) a path may be anywhere, yet an existing file is
    replaced only by a backup of its own kind, and never the live database."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    notes = tmp_path / "notes.json"
    notes.write_text('{"todo": [1, 2]}')
    (tmp_path / "out").mkdir()
    foreign = tmp_path / "out" / "evaluated-first.jsonl"
    foreign.write_text("my own log line\n")
    overrides = ("llm.enabled=false", "compress.mode=identity", "persist.allowed_root=any")
    with running(tmp_path, None, overrides=overrides) as (client, svc):
        client.post("/memories", json=item("Where is the Eiffel Tower?")).raise_for_status()
        cases = [
            (
                {"path": str(victim), "format": "json"},
                str(victim),
                "a reference-layout memory file",
            ),
            ({"path": str(victim), "format": "sqlite"}, str(victim), "a MIA memory database"),
            ({"path": str(notes)}, str(notes), "a reference-layout memory file"),
            ({"path": str(tmp_path / "memory.sqlite")}, str(tmp_path / "memory.sqlite"), None),
            ({"path": str(victim), "format": "dir"}, str(victim), None),
        ]
        for body, shown, kind in cases:
            message = _error(client.post("/save_memory", json=body), 409, "not_a_backup")
            why = f"it exists and is not {kind}" if kind else None
            if body["path"].endswith("memory.sqlite"):
                why = "it is the live memory database"
            elif body.get("format") == "dir":
                why = "it exists and is not a folder"
            assert message == f"refusing to overwrite {shown}: {why}"
        assert victim.read_text() == "precious" and notes.read_text() == '{"todo": [1, 2]}'
        message = _error(
            client.post(
                "/batch_evaluate", json={"output_dir": str(tmp_path / "out"), "rules": ["first"]}
            ),
            409,
            "not_a_backup",
        )
        assert "evaluated-first.jsonl: it exists and is not an evaluated-first file" in message
        assert foreign.read_text() == "my own log line\n"
        # Backups of the right kind are replaced; so are /batch_evaluate's own files (appended).
        for fmt in ("json", "sqlite", "dir"):
            target = str(tmp_path / f"copy-{fmt}")
            assert (
                client.post("/save_memory", json={"path": target, "format": fmt}).status_code == 200
            )
            assert (
                client.post("/save_memory", json={"path": target, "format": fmt}).status_code == 200
            )
        out2 = str(tmp_path / "out2")
        for _ in range(2):
            r = client.post("/batch_evaluate", json={"output_dir": out2, "rules": ["first"]})
            assert r.status_code == 200
        assert len(svc.store) == 1


def test_empty_or_undecided_planner_replies_are_502(tmp_path: Path) -> None:
    think = "<think>I should think about this for a while</think>"
    planner = ScriptedChat(
        [think, "", f"{think}\n1. Search the tower (q -> city)"]  # third attempt: a plan
        + ["", "<think>never closed", "  "]  # /plan: three empty replies
        + [f"{think} maybe", "", "hmm"]  # /judge_replan: no yes or no
        + [think, think, think]  # /replan: think only
    )
    past = [{"role": "user", "content": "plan"}, {"role": "assistant", "content": "1. s"}]
    overrides = ("planner.cold_start=false",)
    with running(tmp_path, ScriptedChat([]), planner, overrides=overrides) as (client, svc):
        r = client.post("/plan", json={"question": "Where is the tower?"})
        assert r.status_code == 200 and r.json()["plan"] == "1. Search the tower (q -> city)"
        assert len(planner.calls) == 3
        for route, body, what, reply in (
            ("/plan", {"question": "Where is the tower?"}, "plan", "  "),
            ("/judge_replan", {"workflow": "T", "past_messages": past}, "yes/no decision", "hmm"),
            ("/replan", {"question": "Q?", "past_messages": past}, "revised plan", think),
        ):
            before = len(planner.calls)
            message = _error(client.post(route, json=body), 502, "llm_empty")
            assert message == (f"the planner LLM gave no {what} in 3 attempt(s) (reply {reply!r})")
            assert len(planner.calls) - before == 3
        assert len(svc.store) == 0 and client.get("/health").json()["status"] == "ok"
    # planner.empty_retries=0: one attempt.
    planner = ScriptedChat([""])
    with running(tmp_path, ScriptedChat([]), planner, overrides=(*overrides, "planner.empty_retries=0"), db="m2.sqlite") as (client, _):  # fmt: skip
        assert "in 1 attempt(s)" in _error(
            client.post("/plan", json={"question": "Q?"}), 502, "llm_empty"
        )


def test_lone_surrogates_are_422_and_store_nothing(tmp_path: Path) -> None:
    overrides = ("llm.enabled=false", "compress.mode=identity")
    with running(tmp_path, None, overrides=overrides) as (client, svc):
        json_hdr = {"content-type": "application/json"}
        bodies = [
            ("/memories", b'{"question": "Where\\ud800?", "judgement": "correct"}', "question"),
            ("/memories", b'[{"question": "q", "judgement": "correct", "extra": {"k\\udfff": 1}}]', "0.extra.k\\udfff"),
            ("/memory", b'{"question": "q", "image_caption": ["a", "\xed\xa0\x80"]}', "image_caption.1"),
            ("/memory_bank_save", b'{"question": "q", "judgement": 1, "messages": [{"role": "user", "content": "\\udc00"}]}', "messages.0.content"),
            ("/save_memory", b'{"path": "x\\ud800.json"}', "path"),
        ]  # fmt: skip
        for route, body, where in bodies:
            r = client.post(route, content=body, headers=json_hdr)
            message = _error(r, 422, "invalid_request")
            assert message == f"{where}: text holds a lone UTF-16 surrogate (not valid Unicode)"
        assert len(svc.store) == 0 and client.get("/stats").json()["buffered_rollouts"] == 0
        # A surrogate pair (an escaped emoji) is ordinary text.
        r = client.post("/memories", content=b'{"question": "\\ud83d\\ude00?", "judgement": "correct"}', headers=json_hdr)  # fmt: skip
        assert r.status_code == 200 and svc.store.get(1).question == "\U0001f600?"


@pytest.mark.parametrize("mode", ["identity"])
def test_identity_compression_without_llm(tmp_path: Path, mode: str) -> None:
    with running(tmp_path, None, overrides=(f"compress.mode={mode}", "llm.enabled=false")) as (
        client,
        svc,
    ):
        r = client.post(
            "/memories",
            json={"question": "Where?", "messages": EXEC_MESSAGES, "judgement": True},
        )
        assert r.status_code == 200
        assert svc.store.get(1).workflow_summary == format_trace("Where?", EXEC_MESSAGES)
        r = client.post("/plan", json={"question": "Where?"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        ctx = client.post("/memory", json={"question": "Where?"}).json()["context"]
        assert ctx == svc.store.retrieve("Where?").context()


def test_concurrent_writers_and_readers(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with running(tmp_path, ScriptedChat(summariser)) as (client, svc):

        def write(i: int) -> list[int]:
            body = [item(f"Concurrent question number {i}-{j}?") for j in range(2)]
            body[1]["used_memory_ids"] = [1]
            r = client.post("/memories", json=body)
            assert r.status_code == 200, r.text
            client.post("/memory", json={"question": f"Concurrent question number {i}-0?"})
            return [x["id"] for x in r.json()["results"]]

        client.post("/memories", json=item("Concurrent question seed?"))
        with ThreadPoolExecutor(8) as pool:
            ids = [i for chunk in pool.map(write, range(8)) for i in chunk]
        assert sorted(ids) == list(range(2, 18))
        seed = svc.store.get(1)
        assert (seed.usage_count, seed.success_count) == (9, 9)  # 8 credits, none lost
    # What the threads wrote is on disk.
    with running(tmp_path, ScriptedChat([])) as (client, _):
        assert client.get("/stats").json()["memories"] == 17


def test_cli_bad_config_exits_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "memory_serve",
            "--db",
            str(tmp_path / "m.sqlite"),
            "compress.mode=zip",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip()
        == "memory_serve: error: memory config: compress.mode must be llm|rules|identity"
    )


@pytest.mark.slow
def test_cli_serves_on_port_file(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    from mia.http import wait_for_port_file

    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "memory_serve",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--db",
            str(tmp_path / "memory.sqlite"),
            "--token",
            "tok",
            "compress.mode=identity",
            "llm.enabled=false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        port = wait_for_port_file(port_file, timeout=120, proc=proc)
        headers = {"Authorization": "Bearer tok"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            r = client.post("/memories", json={"question": "Q?", "judgement": "correct"})
            assert r.json()["results"][0]["id"] == 1
            assert client.get("/health").json()["memories"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
    # Every acknowledged write is on disk.
    with running(tmp_path, None, overrides=("compress.mode=identity", "llm.enabled=false")) as (
        client,
        _,
    ):
        assert client.get("/stats").json()["memories"] == 1


def test_classifier_buckets_and_nogt_feedback(tmp_path: Path) -> None:
    from mia.prompts.manager import classify_prompt

    def reply(messages) -> str:
        text = messages[-1]["content"]
        if "Reply with exactly one type name" in text:
            text = text.rsplit("Question: ", 1)[1]  # after the few-shot examples
            if "Who" in text:
                return "<think>a person</think> Human."
            return "location" if "Where" in text else "no idea"
        return "1. s"

    manager = ScriptedChat(reply)
    with running(tmp_path, manager, overrides=("classifier.enabled=true",)) as (client, _):
        body = [
            item("Where is the Louvre?", evaluator_1_feedback="well sourced"),
            {
                "question": "Who founded Rome?",
                "judgement_nogt": "incorrect",
                "judgement_data": {"is_correct": False, "evaluator_2_feedback": "guessing"},
                "workflow_summary": "1. t",
            },
            item("How tall is it?"),
        ]
        results = client.post("/memories", json=body).json()["results"]
        assert [r["category"] for r in results] == ["location", "human", "others"]
        calls = len(manager.calls)
        r = client.post("/memory", json={"question": "Where is the Louvre?"}).json()
        assert len(manager.calls) == calls  # classification is cached per question
        assert r["positive_ids"] == [1] and "- Evaluator 1 Feedback: well sourced" in r["context"]
        r = client.post("/memory", json={"question": "Who founded Carthage?"}).json()
        assert (r["positive_ids"], r["negative_ids"]) == ([], [2])
        assert "- Evaluator 2 Feedback: guessing" in r["context"]
        # An explicit category skips the classifier.
        r = client.post("/memory", json={"question": "Where?", "category": "human"}).json()
        assert r["negative_ids"] == [2]
        assert manager.calls[-1]["messages"] == [
            {"role": "user", "content": classify_prompt("Who founded Carthage?")}
        ]


def test_damaged_database_is_one_clear_error_at_start(tmp_path: Path) -> None:
    import sqlite3

    from mia.errors import MiaError

    db = tmp_path / "memory.sqlite"
    with MemoryStore(db, shared_embedder()) as store:
        store.add(NewMemory("Where is the Louvre?", "1. s", "correct"))
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE memories SET extra = '[1'")
    with pytest.raises(MiaError, match=f"cannot open the memory store {db}: "):
        MemoryStore(db, shared_embedder())


def test_rules_compression_needs_no_llm(tmp_path: Path) -> None:
    """compress.mode=rules stores mia.trace.rule_summary of the messages, without any LLM."""
    from mia.trace import rule_summary

    overrides = ("compress.mode=rules", "llm.enabled=false", "classifier.enabled=false")
    with running(tmp_path, None, overrides=overrides) as (client, _):
        r = client.post(
            "/memories",
            json={
                "question": "Where is the Eiffel Tower?",
                "messages": EXEC_MESSAGES,
                "judgement": "correct",
            },  # fmt: skip
        )
        assert r.status_code == 200, r.text
        found = client.post("/memory", json={"question": "Where is the Eiffel Tower?"}).json()
        want = rule_summary("Where is the Eiffel Tower?", EXEC_MESSAGES)
        assert want.startswith("1. ") and want in found["context"]
        assert client.get("/stats").json()["compress_mode"] == "rules"


def test_plan_if_gates_the_plan_on_one_retrieval(tmp_path: Path, monkeypatch) -> None:
    """``plan_if``: no plan (and no LLM call) unless memory holds a failure / anything; the
    evaluation gate (RemotePlanner's require_failure) is one request and one retrieval."""
    import asyncio

    from mia.planner.flow import PlannerRun, Task
    from mia.planner.planners import RemotePlanner
    from mia.services import MemoryClient

    planner = ScriptedChat(lambda _m: "1. Search the city (question -> city)")
    overrides = ("compress.mode=identity", "planner.cold_start=false")
    with running(tmp_path, planner, planner, overrides=overrides) as (client, svc):
        retrievals = []
        real = svc.store.retrieve
        monkeypatch.setattr(
            svc.store, "retrieve", lambda *a, **k: retrievals.append(1) or real(*a, **k)
        )
        for plan_if in ("failure", "memory"):
            r = client.post("/plan", json={"question": "Where is the tower?", "plan_if": plan_if})
            assert r.status_code == 200, r.text
            got = r.json()
            assert (got["plan"], got["planner"], got["messages"]) == ("", "none", [])
        assert planner.calls == [] and len(retrievals) == 2
        client.post("/memories", json=item("Where is the old tower?", "correct"))
        assert (
            client.post(
                "/plan", json={"question": "Where is the tower?", "plan_if": "failure"}
            ).json()["planner"]
            == "none"
        )
        assert (
            client.post(
                "/plan", json={"question": "Where is the tower?", "plan_if": "memory"}
            ).json()["planner"]
            == "planner"
        )
        client.post("/memories", json=item("Where is the new tower?", "incorrect"))
        retrievals.clear()

        async def gated() -> PlannerRun:
            memory = MemoryClient(str(client.base_url))
            try:
                run = PlannerRun(task=Task(question="Where is the tower?"))
                await RemotePlanner(memory, require_failure=True).plan(run)
                return run
            finally:
                await memory.aclose()

        run = asyncio.run(gated())
        assert run.plan == "1. Search the city (question -> city)" and len(retrievals) == 1
