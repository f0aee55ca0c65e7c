"""The protocol's controls as ``mia eval`` options, each against real services (serve and
memory_serve on uvicorn, loopback) with scripted LLMs: the ``feedback`` policy's guides,
``memory.expected_answers=wrong``'s remembered answers, ``memory.ground_truth=false``'s labels,
and what each writes into memory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from role_fixtures import executor_service, memory_service, plan_of, question_of

from mia.data.formats import QAItem
from mia.eval import Endpoints, load_eval_config, run_eval
from mia.eval.journal import read_jsonl
from mia.eval.policies import FEEDBACK_GUIDE
from mia.eval.templates import answer_kind, question_kind, question_template, wrong_answers
from mia.llm.scripted import ScriptedChat


def _row(qid: str, question: str, answer: str, qtype: str, relation: str, template: str = ""):
    info = {"question_type": qtype, "relation": relation, "template": template}
    return {"id": qid, "question": question, "answer": answer, "extra_info": info}


CONV = "org.where_is_based"
ROWS = [  # (row, does the Executor answer it right?)
    (_row("q0", "Where is Alpha Books based?", "Pstad", "convention", "org.hq", CONV), False),
    (_row("q1", "In which city was Bel Kor born?", "Lirford", "single_hop", "person.birth_city"), True),
    (_row("q2", "Where is Beta Press based?", "Qarn", "convention", "org.hq", CONV), True),
    (_row("q3", "Where is Gamma Films based?", "Vost", "convention", "org.hq", CONV), False),
    (_row("q4", "In which city was Dak Mel born?", "Ossa", "single_hop", "person.birth_city"), False),
    (_row("q5", "Where is Delta Labs based?", "Wend", "convention", "org.hq", CONV), False),
]  # fmt: skip
GOLD = {r["question"]: r["answer"] for r, _ in ROWS}
RIGHT = {r["question"] for r, ok in ROWS if ok}


def _data(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r, _ in ROWS))
    return path


def _executor(guides: list[tuple[str, str]] | None = None):
    """Right on the questions of RIGHT, else "Nowhere"; records (question, guide)."""

    def reply(messages: list[dict]) -> str:
        q = question_of(messages)
        if guides is not None:
            guides.append((q, plan_of(messages)))
        return f"<answer>{GOLD[q] if q in RIGHT else 'Nowhere'}</answer>"

    return reply


def _cfg(data: Path, policy: str, *over: str) -> Any:
    return load_eval_config(
        None, [f"dataset={data}", f"policies=[{policy}]", "plot=false", "workers=1", *over]
    )


def _guide(question: str) -> str:
    return FEEDBACK_GUIDE.format(question=question, answer=GOLD[question])


def test_templates_and_kinds_of_world_rows() -> None:
    items = [QAItem(id=r["id"], question=r["question"], answers=[r["answer"]],
                    extra_info=r["extra_info"]) for r, _ in ROWS]  # fmt: skip
    assert [question_template(it) for it in items] == [
        CONV, "person.birth_city", CONV, CONV, "person.birth_city", CONV,
    ]  # fmt: skip
    assert [question_kind(it) for it in items] == ["convention", "standard"] * 1 + [
        "convention", "convention", "standard", "convention",
    ]  # fmt: skip
    bridge = {
        "extra_info": {"question_type": "bridge", "relation": "org.founder>person.birth_city"}
    }
    compare = {"extra_info": {"question_type": "comparison", "relation": "org.founded"}}
    assert answer_kind(bridge) == "person.birth_city" == answer_kind(items[1])
    assert answer_kind(compare) == "comparison:org.founded"


def test_wrong_answers_are_another_entitys_value_of_the_same_kind() -> None:
    def item(qid: str, answer: str, relation: str, qtype: str = "single_hop") -> QAItem:
        info = {"question_type": qtype, "relation": relation}
        return QAItem(id=qid, question=qid, answers=[answer], extra_info=info)

    pool = [
        item("a", "Pstad", "org.hq"),
        item("b", "Qarn", "org.hq"),
        item("c", "Vost", "org.hq"),
        item("d", "pstad", "org.hq"),  # the same answer as a's, normalised
        item("e", "1901", "org.founded"),
        item("f", "Kestrel Works", "org.founded", "comparison"),
        item("g", "Lirford", "org.founder>person.birth_city", "bridge"),
        item("h", "Ossa", "person.birth_city"),
    ]
    wrong = wrong_answers(pool, pool)
    # a: Qarn or Vost (never its own answer in any case); e and f have no other of their kind
    assert wrong == {
        "a": "Vost",
        "b": "Pstad",
        "c": "Qarn",
        "d": "Vost",
        "g": "Ossa",
        "h": "Lirford",
    }
    assert wrong_answers(pool, pool) == wrong  # the same draw every time


def test_feedback_guides_with_the_last_failure_of_the_template(tmp_path: Path) -> None:
    """online: each question sees the failures judged before it; the first question of a
    template gets no guide, a success changes nothing, a newer failure replaces the older."""
    data = _data(tmp_path / "d.jsonl")
    guides: list[tuple[str, str]] = []
    with executor_service(_executor(guides)) as (serve_url, _):
        result = run_eval(_cfg(data, "feedback"), Endpoints(serve=serve_url), tmp_path / "run")
    q = [r["question"] for r, _ in ROWS]
    want = ["", "", _guide(q[0]), _guide(q[0]), "", _guide(q[3])]
    assert guides == list(zip(q, want, strict=True))
    (policy,) = result.policies
    assert [r["guide"] for r in policy.rows] == want
    assert [r["context"] for r in policy.rows] == [w or "" for w in want]
    assert [r["used_memory_ids"] for r in policy.rows] == [[], [], [1], [1], [], [4]]
    assert [r["template"] for r in policy.rows] == [question_template(r) for r, _ in ROWS]
    assert policy.summary["accuracy"] == 2 / 6 and policy.summary["memories_written"] == 6
    assert _guide(q[0]) == (
        'A similar earlier question, "Where is Alpha Books based?", was answered wrongly; the '
        "expected answer was Pstad."
    )

    # Interrupted after three questions: the resumed run rebuilds the memory from the
    # journal's receipts and gives the later questions the same guides.
    run = tmp_path / "run" / "feedback"
    for name in ("results.jsonl", "memory_writes.jsonl"):
        lines = (run / name).read_text().splitlines(keepends=True)
        (run / name).write_text("".join(lines[:3]))
    guides.clear()
    with executor_service(_executor(guides)) as (serve_url, _):
        result = run_eval(_cfg(data, "feedback"), Endpoints(serve=serve_url), tmp_path / "run")
    assert guides == list(zip(q, want, strict=True))[3:]
    assert [r["guide"] for r in result.policies[0].rows] == want


def test_feedback_in_batched_order_sees_the_failures_of_earlier_batches(tmp_path: Path) -> None:
    data = _data(tmp_path / "d.jsonl")
    guides: list[tuple[str, str]] = []
    with executor_service(_executor(guides)) as (serve_url, _):
        cfg = _cfg(data, "feedback", "order=batched", "batch_size=3")
        run_eval(cfg, Endpoints(serve=serve_url), tmp_path / "run")
    q = [r["question"] for r, _ in ROWS]
    # batch 2 sees q0's failure; q3's (same batch) comes too late for q5
    assert [g for _, g in guides] == ["", "", "", _guide(q[0]), "", _guide(q[0])]


def _mia_stack(tmp_path: Path, executor: Any, planner_prompts: list[str]) -> Any:
    def planner(messages: list[dict]) -> str:
        planner_prompts.append(messages[-1]["content"])
        return "1. Search the question's entity and read its passage."

    # No cold start: the Planner writes every plan (the Manager would, below top_k memories).
    planner_llm = ScriptedChat(planner, name="planner")
    return (
        memory_service(tmp_path / "m.sqlite", None, planner_llm, ("planner.cold_start=false",)),
        executor_service(executor),
    )


def test_wrong_expected_answers_are_what_memory_keeps(tmp_path: Path) -> None:
    """expected_answers=wrong: a failed question's memory keeps another question's answer of
    the same relation (drawn once per question), and the Planner reads that one; the gold
    answer is nowhere in memory."""
    data = _data(tmp_path / "d.jsonl")
    prompts: list[str] = []
    memory, serve = _mia_stack(tmp_path, _executor(), prompts)
    with memory as (memory_url, svc), serve as (serve_url, _):
        cfg = _cfg(
            data,
            "mia",
            "reflect=false",
            "memory.remember_expected=true",
            "memory.expected_answers=wrong",
        )
        run_eval(cfg, Endpoints(serve=serve_url, memory=memory_url), tmp_path / "run")
        records = {r.data_id: r for r in svc.store.records()}
    expected = {k: r.extra.get("expected") for k, r in records.items()}
    # the failures keep a wrong answer of their relation; the successes none
    assert expected == {
        "q0": "Wend", "q1": None, "q2": None, "q3": "Pstad", "q4": "Lirford", "q5": "Pstad",
    }  # fmt: skip
    assert {records[k].judgement for k in ("q0", "q3", "q4", "q5")} == {"incorrect"}
    for k in ("q0", "q3", "q4", "q5"):  # never the question's own answer
        assert records[k].extra["expected"] != GOLD[records[k].question]
    # The Planner's memory block for q3 shows q0's failure with the wrong answer, not Pstad.
    shown = next(p for p in prompts if "## Question\nWhere is Gamma Films based?" in p)
    assert "- Question: Where is Alpha Books based?" in shown
    assert "- Expected Answer: Wend" in shown and "Pstad" not in shown
    # right: the gold itself
    memory, serve = _mia_stack(tmp_path / "right", _executor(), [])
    (tmp_path / "right").mkdir()
    with memory as (memory_url, svc), serve as (serve_url, _):
        cfg = _cfg(data, "mia", "reflect=false", "memory.remember_expected=true")
        run_eval(cfg, Endpoints(serve=serve_url, memory=memory_url), tmp_path / "right" / "run")
        right = {r.data_id: r.extra.get("expected") for r in svc.store.records()}
    assert right == {
        "q0": "Pstad",
        "q1": None,
        "q2": None,
        "q3": "Vost",
        "q4": "Ossa",
        "q5": "Wend",
    }


def test_memory_labelled_without_ground_truth(tmp_path: Path) -> None:
    """ground_truth=false: each question's memory label is the vote's: its answer and two
    more sampled Executor runs with the same guide (seeds 1, 2), correct only when all agree;
    no expected answer is kept (remember_expected is on). The accuracy stays the judge's."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r, _ in ROWS[:2]))
    calls: list[tuple[str, float | None, int | None, str]] = []
    backend: dict[str, Any] = {}

    def reply(messages: list[dict]) -> str:
        q = question_of(messages)
        params = backend["chat"].calls[-1]["params"]
        calls.append((q, params.temperature, params.seed, plan_of(messages)))
        if params.seed is not None and q.startswith("Where"):
            return f"<answer>Guess {params.seed}</answer>"  # q0's samples disagree
        return f"<answer>{GOLD[q] if q.startswith('Where') else 'Nowhere'}</answer>"

    memory, serve = _mia_stack(tmp_path, reply, [])
    with memory as (memory_url, svc), serve as (serve_url, chat):
        backend["chat"] = chat
        cfg = _cfg(
            data,
            "mia",
            "reflect=false",
            "memory.remember_expected=true",
            "memory.ground_truth=false",
            "memory.nogt_samples=3",
            "memory.nogt_temperature=0.8",
        )
        result = run_eval(cfg, Endpoints(serve=serve_url, memory=memory_url), tmp_path / "run")
        records = {r.data_id: r for r in svc.store.records()}
    rows = {r["id"]: r for r in result.policies[0].rows}
    plan = "1. Search the question's entity and read its passage."
    q0, q1 = ROWS[0][0]["question"], ROWS[1][0]["question"]
    assert calls == [  # the greedy answer (serve's temperature 0), then two samples
        (q0, 0.0, None, plan), (q0, 0.8, 1, plan), (q0, 0.8, 2, plan),
        (q1, 0.0, None, plan), (q1, 0.8, 1, plan), (q1, 0.8, 2, plan),
    ]  # fmt: skip
    assert rows["q0"]["guide"] == rows["q1"]["guide"] == plan
    assert rows["q0"]["correct"] and rows["q0"]["nogt_answers"] == ["Pstad", "Guess 1", "Guess 2"]
    assert not rows["q1"]["correct"] and rows["q1"]["nogt_answers"] == ["Nowhere"] * 3
    assert (rows["q0"]["memory_judgement"], rows["q1"]["memory_judgement"]) == (
        "incorrect",
        "correct",
    )
    assert (records["q0"].judgement, records["q1"].judgement) == ("incorrect", "correct")
    assert "expected" not in records["q0"].extra and "expected" not in records["q1"].extra
    assert result.policies[0].summary["accuracy"] == 0.5
    written = read_jsonl(tmp_path / "run" / "mia" / "results.jsonl")
    assert [r["memory_judgement"] for r in written] == ["incorrect", "correct"]
