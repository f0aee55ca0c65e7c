"""Memory baselines (mia.baselines) on a scripted LLM, a real embedder and real SQLite: each
baseline's write and retrieve semantics, exactly. One test drives a baseline through the
OpenAI-compatible client against a local HTTP fake (any endpoint works)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from mia.baselines import BaselinesConfig, Finished, build_memory, parse_json
from mia.embedding import shared_embedder
from mia.llm.base import LLMError
from mia.llm.scripted import ScriptedChat


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def item(data_id: str, question: str, correct: bool, **kw: Any) -> Finished:
    base = {
        "plan": f"plan for {data_id}",
        "trace": f"### Question: {question}\n### Round 1:\nsearch({question!r})",
        "answer": f"answer {data_id}",
        "source": "test",
    }
    base.update(kw)
    return Finished(data_id=data_id, question=question, correct=correct, **base)


def memory(name: str, tmp: Path, replies: Callable[[str], str], **over: Any) -> Any:
    cfg = BaselinesConfig()
    for key, value in over.items():
        section, field = key.split("__")
        setattr(getattr(cfg, section), field, value)
    llm = ScriptedChat(lambda msgs: replies(msgs[-1]["content"]))
    mem = build_memory(name, cfg.validate(), tmp / f"{name}.sqlite", llm, shared_embedder())
    mem.chat = llm  # type: ignore[attr-defined]
    return mem


def texts(mem: Any, kind: str) -> list[str]:
    return [it.text for it in mem.store.items(kind)]


# ----------------------------------------------------------------------------- parsing


def test_parse_json_finds_json_in_junk() -> None:
    assert parse_json('{"a": 1}') == {"a": 1}
    assert parse_json('Sure! ```json\n{"facts": ["x"]}\n``` done') == {"facts": ["x"]}
    assert parse_json('<think>hmm {"no": </think>Here: {"b": "}"} and more') == {"b": "}"}
    assert parse_json("prefix [1, 2] suffix") == [1, 2]
    assert parse_json("no json here {oops") is None
    assert parse_json("") is None


# ----------------------------------------------------------------------------- mem0


def test_mem0_add_update_delete_noop(tmp_path: Path) -> None:
    script: dict[str, Any] = {}

    def reply(prompt: str) -> str:
        if prompt.startswith("You keep a memory of facts"):
            return script["extract"]
        existing = json.loads(re.search(r"Existing facts:\n(.*?)\n\nNew facts:", prompt, re.S)[1])
        by_text = {e["text"]: e["id"] for e in existing}
        script["shown"] = by_text
        return json.dumps(
            {
                "memory": [
                    {"event": "UPDATE", "id": by_text["Tower 7 is in Lisbon"],
                     "text": "Tower 7 is in Porto"},
                    {"event": "DELETE", "id": by_text["The architect of Tower 7 is Ana Silva"]},
                    {"event": "ADD", "text": "Tower 7 opened in 1990"},
                    {"event": "NONE", "id": by_text["Tower 7 is in Lisbon"]},
                    {"event": "UPDATE", "id": "99", "text": "made-up id"},
                ]
            }
        )  # fmt: skip

    mem = memory("mem0", tmp_path, reply)
    script["extract"] = json.dumps(
        {"facts": ["Tower 7 is in Lisbon", "The architect of Tower 7 is Ana Silva"]}
    )
    first = run(mem.write(item("q1", "Where is Tower 7?", True)))
    # Empty memory: every candidate is added, without an update call.
    assert first.ops == {"ADD": 2} and len(mem.chat.calls) == 1
    ids = {it.text: it.id for it in mem.store.items("fact")}

    script["extract"] = json.dumps({"facts": ["Tower 7 is in Porto", "Tower 7 opened in 1990"]})
    second = run(mem.write(item("q2", "When did Tower 7 open?", False)))
    assert second.ops == {"ADD": 1, "DELETE": 1, "NOOP": 1, "UPDATE": 1, "invalid": 1}
    assert set(script["shown"]) == {"Tower 7 is in Lisbon", "The architect of Tower 7 is Ana Silva"}
    facts = {it.text: it for it in mem.store.items("fact")}
    assert sorted(facts) == ["Tower 7 is in Porto", "Tower 7 opened in 1990"]
    # UPDATE replaced the text of the same record (and it now comes from the second write).
    assert facts["Tower 7 is in Porto"].id == ids["Tower 7 is in Lisbon"]
    assert facts["Tower 7 is in Porto"].origin == second.write_id != first.write_id

    got = run(mem.retrieve("Where is Tower 7 located?"))
    assert got.context.startswith("# Facts remembered from earlier questions\n- ")
    assert "- Tower 7 is in Porto" in got.context and "Lisbon" not in got.context
    assert sorted(got.item_ids) == sorted(it.id for it in facts.values())
    assert got.origins == [second.write_id]
    assert mem.find(["q1", "q2", "q3"], "test") == {"q1": first.write_id, "q2": second.write_id}
    assert mem.find(["q1"], "other run") == {}


def test_mem0_junk_replies_are_counted_noops(tmp_path: Path) -> None:
    replies = iter(["I cannot do that.", '{"facts": ["Tower 7 is tall"]}'])
    mem = memory("mem0", tmp_path, lambda _p: next(replies))
    res = run(mem.write(item("q1", "How tall is Tower 7?", True)))
    assert res.ops == {"NOOP": 1, "junk": 1} and res.junk == 1
    assert texts(mem, "fact") == []
    assert run(mem.retrieve("How tall is Tower 7?")).context == ""  # nothing found: no guide
    run(mem.write(item("q2", "How tall is Tower 7?", True)))
    assert texts(mem, "fact") == ["Tower 7 is tall"]
    assert mem.stats()["llm_junk"] == 1 and mem.stats()["ops"] == {"ADD": 1, "NOOP": 1, "junk": 1}


def test_a_failed_llm_call_stores_nothing(tmp_path: Path) -> None:
    mem = memory("mem0", tmp_path, lambda _p: '{"facts": ["a fact"]}')
    run(mem.write(item("q1", "Q one?", True)))
    mem.chat._replies = []  # the script is exhausted: the next call raises LLMError
    with pytest.raises(LLMError):
        run(mem.write(item("q2", "Q two?", True)))
    assert mem.find(["q1", "q2"], "test").keys() == {"q1"}
    assert texts(mem, "fact") == ["a fact"]


# ----------------------------------------------------------------------------- amem


def test_amem_notes_links_and_neighbour_evolution(tmp_path: Path) -> None:
    def reply(prompt: str) -> str:
        if prompt.startswith("Analyse the note"):
            if "Who designed Tower 7" in prompt:
                return json.dumps({"keywords": ["Tower 7", "architect"], "context": "Tower 7's "
                                   "architect", "tags": ["people"]})  # fmt: skip
            return json.dumps(
                {"keywords": ["Tower 7", "Lisbon"], "context": "Where Tower 7 is",
                 "tags": ["geography"]}
            )  # fmt: skip
        assert prompt.startswith("You are an agentic memory manager")
        assert "0: Question: Where is Tower 7?" in prompt
        return json.dumps(
            {
                "should_evolve": True,
                "actions": ["strengthen", "update_neighbor"],
                "suggested_connections": [0, 7],
                "tags_to_update": ["architecture", "people"],
                "new_context_neighborhood": ["Where Tower 7 is; its architect is in note 2"],
                "new_tags_neighborhood": [["geography", "landmark"]],
            }
        )

    mem = memory("amem", tmp_path, reply)
    first = run(mem.write(item("q1", "Where is Tower 7?", True)))
    assert first.ops == {"ADD": 1} and len(mem.chat.calls) == 1  # no neighbours: no evolution
    [a] = mem.store.items("note")
    assert a.data["keywords"] == ["Tower 7", "Lisbon"] and a.data["tags"] == ["geography"]
    assert a.text.startswith("Question: Where is Tower 7?\nOutcome: correct")
    vec_before = mem.store.con.execute("SELECT vec FROM items WHERE id=?", (a.id,)).fetchone()[0]

    second = run(mem.write(item("q2", "Who designed Tower 7?", False)))
    assert second.ops == {"ADD": 1, "EVOLVE": 1, "LINK": 1}
    a2, b = mem.store.items("note")
    assert b.data["links"] == [a.id]  # strengthen: linked to neighbour 0 (index 7 ignored)
    assert b.data["tags"] == ["architecture", "people"]  # tags_to_update
    # update_neighbor rewrote the neighbour's context and tags (and re-embedded it).
    assert a2.data["context"] == "Where Tower 7 is; its architect is in note 2"
    assert a2.data["tags"] == ["geography", "landmark"]
    assert a2.text == a.text and a2.origin == first.write_id
    vec_after = mem.store.con.execute("SELECT vec FROM items WHERE id=?", (a.id,)).fetchone()[0]
    assert vec_after != vec_before

    # Retrieval: the top note plus its linked notes.
    mem.cfg.top_k = 1
    got = run(mem.retrieve("Who designed Tower 7?"))
    assert got.item_ids == [b.id, a.id] and got.origins == [second.write_id, first.write_id]
    assert got.context.startswith("# Notes from earlier questions\n\n## Note")
    assert "tags: geography, landmark" in got.context
    assert [it.data["retrieval_count"] for it in mem.store.items("note")] == [1, 1]


def test_amem_junk_analysis_gets_defaults(tmp_path: Path) -> None:
    mem = memory("amem", tmp_path, lambda _p: "keywords: none")
    res = run(mem.write(item("q1", "Where is Tower 7?", True)))
    [note] = mem.store.items("note")
    assert note.data["context"] == "General" and note.data["keywords"] == note.data["tags"] == []
    assert res.junk == 1
    res = run(mem.write(item("q2", "Where is Tower 8?", True)))  # evolution reply is junk too
    assert res.ops == {"ADD": 1, "junk": 2} and mem.stats()["llm_junk"] == 3


# ----------------------------------------------------------------------------- expel


def test_expel_insight_operations(tmp_path: Path) -> None:
    script: list[str] = []

    def reply(prompt: str) -> str:
        script.append(prompt)
        return replies.pop(0)

    replies: list[str] = []
    mem = memory("expel", tmp_path, reply, expel__max_insights=3)
    # A failure with nothing to contrast it with: stored, no LLM call.
    f1 = run(mem.write(item("f1", "Where is Tower 7?", False)))
    assert f1.ops == {"NOOP": 1} and script == []
    # A success against the similar failure: two rules added with importance 2.
    replies.append(json.dumps({"operations": [
        {"op": "ADD", "text": "Search the exact name first."},
        {"op": "ADD", "text": "Verify the city with a second source."},
    ]}))  # fmt: skip
    s1 = run(mem.write(item("s1", "Where is Tower 8?", True)))
    assert "a success against similar failures" in script[-1] and "plan for f1" in script[-1]
    assert s1.ops == {"ADD": 2}
    rules = {it.text: it.data["importance"] for it in mem.store.items("insight")}
    assert rules == {"Search the exact name first.": 2, "Verify the city with a second source.": 2}
    # A failure against the success: UPVOTE raises importance, EDIT replaces text (+1).
    replies.append(json.dumps({"operations": [
        {"op": "UPVOTE", "id": 1},
        {"op": "EDIT", "id": 2, "text": "Verify the city with two sources."},
        {"op": "DOWNVOTE", "id": 9},
    ]}))  # fmt: skip
    f2 = run(mem.write(item("f2", "Where is Tower 9?", False)))
    assert "a failure against similar successes" in script[-1] and "plan for s1" in script[-1]
    assert "1: Search the exact name first." in script[-1]
    assert f2.ops == {"EDIT": 1, "UPVOTE": 1, "invalid": 1}
    ins = mem.insights()
    assert [(r.text, r.data["importance"]) for r in ins] == [
        ("Search the exact name first.", 3),
        ("Verify the city with two sources.", 3),
    ]
    assert ins[1].origin == f2.write_id and ins[0].origin == s1.write_id
    # ExpeL's text lines: three DOWNVOTEs (REMOVE) take rule 2 to 0, which removes it; AGREE
    # is an UPVOTE.
    replies.append(
        "REMOVE 2: wrong\nREMOVE 2\nREMOVE 2\nAGREE 1: yes\nADD: Read the image caption."
    )
    run(mem.write(item("s2", "Where is Tower 10?", True)))
    assert [(r.text, r.data["importance"]) for r in mem.insights()] == [
        ("Search the exact name first.", 4),
        ("Read the image caption.", 2),
    ]
    # A full list refuses ADD.
    replies.append(json.dumps({"operations": [
        {"op": "ADD", "text": "Rule three."}, {"op": "ADD", "text": "Rule four."}]}))  # fmt: skip
    res = run(mem.write(item("s3", "Where is Tower 11?", True)))
    assert res.ops == {"ADD": 1, "refused": 1} and len(mem.insights()) == 3
    assert "NOT allowed now" not in script[-1]
    # Junk: nothing changes.
    replies.append("I think the agent did fine.")
    res = run(mem.write(item("s4", "Where is Tower 12?", True)))
    assert res.ops == {"NOOP": 1, "junk": 1} and "NOT allowed now: the list is full" in script[-1]

    mem.cfg.examples_k = 1
    got = run(mem.retrieve("Where is Tower 8?"))
    head, examples = got.context.split("\n\n# Successful attempts at similar questions\n\n")
    assert head == (
        "# Insights from earlier questions\n1. Search the exact name first.\n"
        "2. Read the image caption.\n3. Rule three."
    )
    assert examples.startswith("## Example 1 (success)\nQuestion: Where is Tower 8?")
    assert len(got.item_ids) == 4  # 3 insights + 1 example (failures are never examples)


# ----------------------------------------------------------------------------- memento


def test_memento_cases_with_labels(tmp_path: Path) -> None:
    mem = memory("memento", tmp_path, lambda _p: pytest.fail("memento calls no LLM"))
    good = run(mem.write(item("g", "Where is Tower 7?", True, plan="1. search Tower 7")))
    bad = run(mem.write(item("b", "Where is Tower 8?", False, plan="1. guess")))
    run(mem.write(item("x", "What is the boiling point of water?", True)))
    assert good.ops == bad.ops == {"ADD": 1}
    mem.cfg.top_k = 2
    got = run(mem.retrieve("Where is Tower 9?"))
    ctx = got.context
    assert ctx.startswith("# Retrieved Relevant Memories\n\n## Correct plans from similar past "
                          "questions (1)\n### Case 1 (reward 1)\nQuestion: Where is Tower 7?\n"
                          "Plan:\n1. search Tower 7")  # fmt: skip
    assert "## Incorrect plans from similar past questions (1)\n### Case 1 (reward 0)\n" in ctx
    assert "Plan:\n1. guess" in ctx and "boiling" not in ctx
    assert got.origins == [good.write_id, bad.write_id]


# ----------------------------------------------------------------------------- reasoningbank


def test_reasoningbank_distils_successes_and_failures(tmp_path: Path) -> None:
    prompts: list[str] = []
    replies = [
        json.dumps({"items": [
            {"title": "Exact-name search", "description": "Search names verbatim.",
             "content": "Quote the landmark's full name in the first query."},
            {"title": "Two sources", "description": "Cross-check.", "content": "Confirm twice."},
            {"title": "Third", "description": "d", "content": "c"},
            {"title": "Fourth (over the limit)", "description": "d", "content": "c"},
        ]}),
        "# Memory Item 1\n## Title Do not guess\n## Description Guessing failed.\n"
        "## Content When the search finds nothing, search again with other words\ninstead of "
        "guessing.",
        "no items, sorry",
    ]  # fmt: skip

    def reply(prompt: str) -> str:
        prompts.append(prompt)
        return replies.pop(0)

    mem = memory("reasoningbank", tmp_path, reply)
    ok = run(mem.write(item("s", "Where is Tower 7?", True)))
    assert "judged CORRECT" in prompts[0] and ok.ops == {"ADD": 3}
    bad = run(mem.write(item("f", "What is the boiling point of water?", False)))
    assert "judged INCORRECT" in prompts[1] and "Reflect on why it failed" in prompts[1]
    assert bad.ops == {"ADD": 1}
    items = mem.store.items("strategy")
    assert [it.text for it in items] == [
        "Exact-name search",
        "Two sources",
        "Third",
        "Do not guess",
    ]
    lesson = items[-1].data
    assert lesson["from"] == "incorrect" and lesson["content"] == (
        "When the search finds nothing, search again with other words instead of guessing."
    )
    junk = run(mem.write(item("j", "Q?", True)))
    assert junk.ops == {"NOOP": 1, "junk": 1} and len(mem.store.items("strategy")) == 4

    got = run(mem.retrieve("What temperature does water boil at?"))  # top-1
    assert got.context == (
        "# Strategies learned from earlier questions\n\n## Do not guess\nGuessing failed.\n"
        "When the search finds nothing, search again with other words instead of guessing."
    )
    assert got.origins == [bad.write_id]


# ----------------------------------------------------------------------------- any endpoint


def test_baseline_over_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    from mia.http import ServerThread
    from mia.llm.config import build_backend

    bodies: list[dict[str, Any]] = []
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        bodies.append(await request.json())
        text = '{"facts": ["The river is the Tagus"]}'
        return {
            "id": "x", "object": "chat.completion", "created": 0, "model": "qwen",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        }  # fmt: skip

    with ServerThread(app) as url:
        backend = build_backend(
            {"backend": "openai", "base_url": f"{url}/v1", "model": "qwen", "max_retries": 0},
            name="manager",
        )
        cfg = BaselinesConfig()
        mem = build_memory("mem0", cfg, tmp_path / "m.sqlite", backend, shared_embedder())
        res = run(mem.write(item("q", "Which river runs through Lisbon?", True)))
        run(backend.aclose())
    assert res.ops == {"ADD": 1}
    assert bodies[0]["model"] == "qwen" and bodies[0]["max_tokens"] == cfg.llm.max_tokens
    assert "Which river runs through Lisbon?" in bodies[0]["messages"][-1]["content"]
    assert run(mem.retrieve("Lisbon river?")).context.endswith("- The river is the Tagus")
