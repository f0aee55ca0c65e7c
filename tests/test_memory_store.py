"""Memory store (SQLite + per-bucket numpy index), scoring, write policy, persistence, trace
formatting, TTRL selection and config: with the real all-MiniLM-L6-v2 embedder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memory_serve.config import MemoryServeConfig, StoreConfig, load_config
from memory_serve.records import NewMemory, Rollout
from memory_serve.refjson import (
    export_plan_pairs,
    export_workflows,
    is_plan_layout,
    parse_plan_pairs,
    parse_workflows,
)
from memory_serve.store import MemoryStore
from memory_serve.ttrl import consolidate_group, parse_choice, plan_length, select_index
from mia.embedding import question_template, shared_embedder
from mia.errors import MiaError
from mia.trace import format_trace


class CountingEmbedder:
    """The real embedder, counting calls (to prove a restart does not re-embed)."""

    def __init__(self, inner, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.dim = inner.dim
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return self.inner.encode(texts)


@pytest.fixture(scope="module")
def embedder():
    return shared_embedder()


def make_store(path: Path, embedder, **write) -> MemoryStore:
    cfg = StoreConfig()
    for k, v in write.items():
        setattr(cfg.write, k, v)
    return MemoryStore(path, embedder, cfg)


def test_embedder_contract(embedder) -> None:
    vecs = embedder.encode(["Where is the Eiffel Tower?", "", "   ", "Where is the Eiffel Tower?"])
    assert embedder.name == "all-MiniLM-L6-v2" and embedder.dim == 384
    assert vecs.shape == (4, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs[[0, 3]], axis=1), 1.0, atol=1e-5)
    assert not vecs[1].any() and not vecs[2].any()  # empty text -> zero vector
    assert np.allclose(vecs[0], vecs[3], atol=1e-6)
    assert embedder.encode([]).shape == (0, 384)


# Text-image memories: (question, caption, judgement, usage, success)
IMAGE_MEMORIES = [
    (
        "Which river flows through the city in the photo?",
        "a city skyline with a bridge over a wide river",
        "correct",
        1,
        1,
    ),
    (
        "What is the name of the bridge in this picture?",
        "a red suspension bridge in fog",
        "correct",
        2,
        1,
    ),
    (
        "In which year was this cathedral built?",
        "a gothic cathedral with two towers",
        "incorrect",
        4,
        1,
    ),
    ("Which river is shown in this image?", "a wide river at sunset", "incorrect", 1, 1),
    (
        "Who is the architect of the building in the photo?",
        "a modern glass museum",
        "correct",
        3,
        0,
    ),
    (
        "What city is this bridge located in?",
        "a stone bridge over a river in a city",
        "incorrect",
        5,
        3,
    ),
    ("How tall is the tower in the picture?", "a tall radio tower", "correct", 2, 2),
]
TEXT_MEMORIES = [
    ("Which river flows through Paris?", "correct"),
    ("Who wrote the novel Dracula?", "incorrect"),
    ("Which river flows through London?", "incorrect"),
]


def seed_store(store: MemoryStore) -> list[int]:
    mems = [
        NewMemory(
            q,
            f"1. summary of {q}",
            j,
            image_caption=c,
            usage_count=u,
            success_count=s,
            win_rate=s / u,
        )
        for q, c, j, u, s in IMAGE_MEMORIES
    ] + [NewMemory(q, f"1. summary of {q}", j) for q, j in TEXT_MEMORIES]
    return store.import_memories(mems)


def expected_ranking(embedder, query: str, caption: str, rows: list[tuple[str, str, str, float]]):
    """Hand computation of docs/reference.md §4.4 with numpy: ids in (correct, incorrect) order + scores."""
    qs = embedder.encode([r[0] for r in rows])
    cs = embedder.encode([r[1] for r in rows])
    q, c = embedder.encode([query, caption])
    sim = qs @ q if not caption else 0.8 * (qs @ q) + 0.2 * (cs @ c)
    norm = (sim - sim.min()) / (sim.max() - sim.min() + 1e-8)
    score = 0.7 * norm + 0.3 * np.array([r[3] for r in rows])
    order = sorted(range(len(rows)), key=lambda i: (-score[i], i))
    pos = [i for i in order if rows[i][2] == "correct"]
    neg = [i for i in order if rows[i][2] == "incorrect"]
    return pos, neg, sim, score


def test_retrieval_matches_hand_computed_scores(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    ids = seed_store(store)
    query, caption = "Which river runs through this city?", "a bridge over a river in a big city"
    rows = [(q, c, j, s / u) for q, c, j, u, s in IMAGE_MEMORIES]
    pos, neg, sim, score = expected_ranking(embedder, query, caption, rows)

    got = store.retrieve(query, caption, top_k=10)
    assert got.bucket_size == len(IMAGE_MEMORIES)  # text-only memories live in another bucket
    assert got.positive_ids == [ids[i] for i in pos]
    assert got.negative_ids == [ids[i] for i in neg]
    for m in got.positives + got.negatives:
        i = ids.index(m.record.id)
        assert m.similarity == pytest.approx(sim[i], abs=1e-5)
        assert m.score == pytest.approx(score[i], abs=1e-5)

    # top_k and the pass_num skip apply to each side separately.
    got = store.retrieve(query, caption, top_k=2, pass_num=1)
    assert got.positive_ids == [ids[i] for i in pos[1:3]]
    assert got.negative_ids == [ids[i] for i in neg[1:3]]

    # A floor on the raw similarity drops weak matches (min-max still over the whole bucket).
    ordered = np.sort(sim)
    floor = float(ordered[3] + ordered[4]) / 2  # between two entries: no float-rounding ties
    got = store.retrieve(query, caption, top_k=10, min_similarity=floor)
    assert got.positive_ids == [ids[i] for i in pos if sim[i] >= floor]
    assert got.negative_ids == [ids[i] for i in neg if sim[i] >= floor]


def test_text_query_uses_question_similarity_only(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    ids = seed_store(store)[len(IMAGE_MEMORIES) :]
    rows = [(q, "", j, 1.0) for q, j in TEXT_MEMORIES]
    pos, neg, sim, _ = expected_ranking(embedder, "Which river runs through Rome?", "", rows)
    got = store.retrieve("Which river runs through Rome?", top_k=2)
    assert got.positive_ids == [ids[i] for i in pos]
    assert got.negative_ids == [ids[i] for i in neg]
    assert [m.similarity for m in got.negatives] == pytest.approx([sim[i] for i in neg], abs=1e-5)
    # Unknown bucket -> nothing; the category is part of the bucket.
    assert store.retrieve("Which river runs through Rome?", category="location").bucket_size == 0
    with pytest.raises(MiaError, match="unknown category"):
        store.retrieve("q", category="nonsense")


def test_single_entry_bucket_and_context_text(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    store.add(
        NewMemory("Who built the Eiffel Tower?", "1. Search (query -> Gustave Eiffel)", "correct")
    )
    got = store.retrieve("Completely unrelated cooking question?")
    # No absolute threshold: a one-entry bucket always returns its entry (normalised sim 0).
    assert got.positive_ids == [1] and got.negative_ids == []
    assert got.positives[0].normalised == 0.0 and got.positives[0].score == pytest.approx(0.3)
    assert got.context() == (
        "# Retrieved Relevant Memories\n\n"
        "## Positive Examples (Successful Strategies - 1)\n"
        "[Example 1]\n"
        "- Modality: text-only\n"
        "- Judgement: correct\n"
        "- Question: Who built the Eiffel Tower?\n"
        "- Workflow Summary:\n"
        "1. Search (query -> Gustave Eiffel)\n\n"
        "## Negative Examples (Failure Lessons - 0)\n"
        "None found."
    )


def test_dedup_never_replaces_correct_with_incorrect(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    q = "What is the capital of Australia?"
    first = store.add(NewMemory(q, "1. a b c d e", "correct"))
    assert (first.action, first.id) == ("inserted", 1)
    # Shorter but incorrect: the reference replaced here (bug); we keep the correct memory.
    r = store.add(NewMemory(q, "1. a", "incorrect"))
    assert (r.action, r.id, r.replaced_id) == ("kept_existing", 1, None)
    # Correct but longer: kept.
    r = store.add(NewMemory(q, "1. a b c d e f g", "correct"))
    assert r.action == "kept_existing"
    # Correct and shorter: replaced by a new id; the old id is gone.
    r = store.add(NewMemory(q, "1. a b", "correct"))
    assert (r.action, r.id, r.replaced_id) == ("replaced", 2, 1)
    assert store.get(1) is None and store.get(2).workflow_summary == "1. a b"
    assert [m.id for m in store.records()] == [2]
    # An incorrect existing memory is replaced by anything (counters reset to 1/1/1.0).
    q2 = "How long is the Nile?"
    store.add(NewMemory(q2, "1. x", "incorrect"))
    store.credit([3], success=False)
    assert store.get(3).win_rate == 0.5
    r = store.add(NewMemory(q2, "1. much longer summary here", "incorrect"))
    assert (r.action, r.replaced_id) == ("replaced", 3)
    assert (store.get(r.id).usage_count, store.get(r.id).win_rate) == (1, 1.0)
    r = store.add(NewMemory(q2, "1. y", "correct"))
    assert r.action == "replaced" and store.get(r.id).judgement == "correct"
    # A different question is a new memory.
    assert store.add(NewMemory("How long is the Amazon?", "1. z", "correct")).action == "inserted"
    # The threshold is on the mixed similarity: a different caption is a different memory.
    store.add(NewMemory(q, "1. a b", "correct", image_caption="a map"))
    r = store.add(NewMemory(q, "1. a", "correct", image_caption="a kangaroo"))
    assert r.action == "inserted"


def test_dedup_scope_question_judgement(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder, dedup_scope="question_judgement")
    q = "What is the capital of Australia?"
    assert store.add(NewMemory(q, "1. a b", "correct")).action == "inserted"
    assert store.add(NewMemory(q, "1. a", "incorrect")).action == "inserted"
    assert store.add(NewMemory(q, "1. b", "incorrect")).action == "replaced"
    got = store.retrieve(q)
    assert (got.positive_ids, got.negative_ids) == ([1], [3])


def test_question_template_masks_named_entities() -> None:
    cases = {
        "Where does Thouzei Bozek come from?": "Where does X come from?",
        "Which came out first, Songs from Kelok or The Long Bells of Nacum?": (
            "Which came out first, X or X?"
        ),
        "Who is Ann Lee's father?": "Who is X's father?",
        'Is "Big Fish" by Tim Burton?': 'Is "X" by X?',
        "Where is Ann, Bo from?": "Where is X, X from?",  # a comma ends a name
        "Kondstad lies where?": "Kondstad lies where?",  # the first word is never masked
        "how old is the city?": "how old is the city?",
    }
    assert {q: question_template(q) for q in cases} == cases


def test_template_key_retrieves_the_same_kind_of_question(tmp_path: Path, embedder) -> None:
    """key=template: a memory of the same wording about another entity is near-identical
    (above a 0.85 floor), another wording about the same entity is not; duplicates are the same
    question text, not the same template."""
    cfg = StoreConfig()
    cfg.retrieval.key, cfg.retrieval.min_similarity = "template", 0.85
    store = MemoryStore(tmp_path / "m.sqlite", embedder, cfg)
    assert store.embedder.name == "all-MiniLM-L6-v2+template"
    ids = [
        store.add(NewMemory(q, f"1. {q}", j)).id
        for q, j in [
            ("Where does Thouzei Bozek come from?", "correct"),
            ("How old is Cy Dorn?", "correct"),
            ("Where does Bo Kim come from?", "incorrect"),
        ]
    ]
    assert ids == [1, 2, 3]  # three questions of two templates: nothing merged
    got = store.retrieve("Where does Cy Dorn come from?", top_k=2)
    assert (got.positive_ids, got.negative_ids) == ([1], [3])
    assert got.positives[0].similarity > 0.99
    again = store.add(NewMemory("Where does Bo Kim come from?", "1. x", "incorrect"))
    assert (again.action, again.replaced_id) == ("replaced", 3)
    store.close()
    # The plain key would read template embeddings as question embeddings: refused.
    with pytest.raises(MiaError, match=r"holds embeddings of 'all-MiniLM-L6-v2\+template'"):
        MemoryStore(tmp_path / "m.sqlite", embedder, StoreConfig())
    plain = MemoryStore(tmp_path / "q.sqlite", embedder, StoreConfig())
    plain.add(NewMemory("Where does Thouzei Bozek come from?", "1. s", "correct"))
    assert plain.retrieve("Where does Cy Dorn come from?", min_similarity=0.85).positive_ids == []


def test_win_rate_credit(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    store.add_many(
        [NewMemory(f"Question number {i} about rivers?", "1. s", "correct") for i in range(3)]
    )
    r = store.add(
        NewMemory("Where is Lake Baikal?", "1. s", "correct", used_memory_ids=[1, 2, 2, 99])
    )
    assert r.credited_ids == (1, 2)  # duplicates counted once, unknown ids ignored
    r = store.add(NewMemory("Where is Lake Titicaca?", "1. s", "incorrect", used_memory_ids=[1]))
    assert r.credited_ids == (1,)
    one = store.get(1)
    assert (one.usage_count, one.success_count, one.win_rate) == (3, 2, pytest.approx(2 / 3))
    assert (store.get(2).usage_count, store.get(2).win_rate) == (2, 1.0)
    assert store.get(3).usage_count == 1
    # A duplicate still carries evidence about the memories that produced it ...
    r = store.add(
        NewMemory("Where is Lake Titicaca?", "1. longer s", "incorrect", used_memory_ids=[2])
    )
    assert (r.action, r.credited_ids) == ("replaced", (2,))
    r = store.add(NewMemory("Where is Lake Baikal?", "1. longer s", "correct", used_memory_ids=[3]))
    assert (r.action, r.credited_ids) == ("kept_existing", (3,))
    # ... unless configured like the reference (credit only when stored).
    ref = make_store(tmp_path / "r.sqlite", embedder, credit_on_duplicate=False)
    ref.add_many([NewMemory("A?", "1. s", "correct"), NewMemory("B?", "1. s t", "correct")])
    assert ref.add(NewMemory("B?", "1. s t u", "correct", used_memory_ids=[1])).credited_ids == ()
    assert ref.get(1).usage_count == 1
    # The in-memory index follows the new win-rates.
    assert store.retrieve("Where is Lake Baikal?", top_k=5).positives[0].record.win_rate == 1.0


def test_eviction_lowest_win_rate_then_oldest(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder, max_memories=3)
    store.add_many([NewMemory(f"Distinct question {w}?", "1. s", "correct") for w in "abc"])
    store.credit([2], success=False)  # win 0.5: lowest
    r = store.add(NewMemory("Distinct question d?", "1. s", "correct"))
    assert r.evicted_ids == (2,)
    r = store.add(NewMemory("Distinct question e?", "1. s", "correct"))
    assert r.evicted_ids == (1,)  # all at 1.0: the oldest goes
    assert [m.id for m in store.records()] == [3, 4, 5]
    assert set(store.retrieve("Distinct question a?", top_k=5).positive_ids) == {3, 4, 5}


def test_restart_reads_embeddings_without_reembedding(tmp_path: Path, embedder) -> None:
    path = tmp_path / "m.sqlite"
    store = make_store(path, embedder)
    seed_store(store)
    store.add_plan_pair("Which river flows through Paris?", "1. search", "1. guess")
    query, caption = "Which river runs through this city?", "a bridge over a river"
    before = store.retrieve(query, caption, top_k=3)
    store.close()

    counting = CountingEmbedder(embedder)
    reopened = MemoryStore(path, counting, StoreConfig())
    assert counting.calls == 0  # the index came from the stored blobs
    assert len(reopened) == len(IMAGE_MEMORIES) + len(TEXT_MEMORIES)
    assert len(reopened.plan_pairs()) == 1
    after = reopened.retrieve(query, caption, top_k=3)
    assert after.positive_ids == before.positive_ids and after.negative_ids == before.negative_ids
    assert [m.score for m in after.positives] == [m.score for m in before.positives]
    assert reopened.get(2).win_rate == 0.5 and reopened.get(2).usage_count == 2
    reopened.close()

    # Another embedder refuses the store unless asked to re-embed it.
    with pytest.raises(MiaError, match="holds embeddings of 'all-MiniLM-L6-v2'"):
        MemoryStore(path, CountingEmbedder(embedder, name="other-model"), StoreConfig())
    other = CountingEmbedder(embedder, name="other-model")
    converted = MemoryStore(path, other, StoreConfig(), reembed_on_mismatch=True)
    assert other.calls == 2  # memories + plan pairs, once each
    assert converted.retrieve(query, caption, top_k=3).positive_ids == before.positive_ids
    converted.close()
    assert MemoryStore(path, CountingEmbedder(embedder, name="other-model")).stats()[
        "embedder"
    ] == ("other-model")


def test_backup_restore_and_clear(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    seed_store(store)
    store.buffer_rollouts([{"data_id": "d1", "question": "Q?", "judgement": "correct"}])
    copy = store.backup(tmp_path / "copy" / "backup.sqlite")
    store.clear()
    assert len(store) == 0 and store.rollouts() == []
    # Ids are never reused after a clear.
    assert (
        store.add(NewMemory("New question?", "1. s", "correct")).id
        == len(IMAGE_MEMORIES) + len(TEXT_MEMORIES) + 1
    )
    store.restore(copy)
    assert len(store) == len(IMAGE_MEMORIES) + len(TEXT_MEMORIES)
    assert [r.data_id for r in store.rollouts()] == ["d1"]
    assert store.retrieve("Which river is shown here?", "a river").bucket_size == len(
        IMAGE_MEMORIES
    )
    with pytest.raises(MiaError, match="not a MIA memory database"):
        other = tmp_path / "other.sqlite"
        import sqlite3

        sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
        store.restore(other)


def test_reference_json_round_trip(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    seed_store(store)
    store.add(
        NewMemory(
            "Is the claim supported?",
            "1. s",
            "correct",
            extra={"evaluator_1_feedback": "sound reasoning"},
        )
    )
    store.add_plan_pair(
        "Which river flows through Paris?", "1. search", "1. guess", image_caption=""
    )
    layout = json.loads(json.dumps(export_workflows(store.records())))
    assert set(layout) == {"text-only", "text-image"} and len(layout["text-only"]) == 10
    entry = layout["text-image"]["others"][1]
    assert {
        k: entry[k] for k in ("question", "judgement", "usage_count", "success_count", "win_rate")
    } == {
        "question": IMAGE_MEMORIES[1][0],
        "judgement": "correct",
        "usage_count": 2,
        "success_count": 1,
        "win_rate": 0.5,
    }
    assert layout["text-only"]["others"][-1]["evaluator_1_feedback"] == "sound reasoning"
    plans = export_plan_pairs(store.plan_pairs())
    assert is_plan_layout(plans) and not is_plan_layout(layout)

    counting = CountingEmbedder(embedder)
    fresh = MemoryStore(tmp_path / "fresh.sqlite", counting, StoreConfig())
    fresh.import_memories(parse_workflows(layout))
    fresh.import_plan_pairs(parse_plan_pairs(plans))
    assert counting.calls == 2  # the reference layout has no embeddings: import re-embeds

    def strip(r):
        return (
            r.question,
            r.image_caption,
            r.workflow_summary,
            r.judgement,
            r.usage_count,
            r.success_count,
            r.win_rate,
            r.modality,
            r.category,
            r.extra,
            r.created_at,
        )

    assert sorted(map(strip, fresh.records())) == sorted(map(strip, store.records()))
    assert [(p.question, p.correct_plan) for p in fresh.plan_pairs()] == [
        ("Which river flows through Paris?", "1. search")
    ]
    q, c = "Which river runs through this city?", "a bridge over a river"
    a, b = store.retrieve(q, c, top_k=3), fresh.retrieve(q, c, top_k=3)
    assert [m.record.question for m in a.positives] == [m.record.question for m in b.positives]


def test_plan_pairs_sorted_by_similarity(tmp_path: Path, embedder) -> None:
    store = make_store(tmp_path / "m.sqlite", embedder)
    for q in (
        "Who painted the Mona Lisa?",
        "Which river flows through Paris?",
        "Who wrote Hamlet?",
    ):
        store.add_plan_pair(q, f"good plan for {q}", f"bad plan for {q}")
    got = store.retrieve_plan_pairs("Which river flows through Vienna?", top_k=2)
    assert got[0][0].question == "Which river flows through Paris?"
    assert got[0][1] > got[1][1]


def test_trace_format_labels_revised_plan_and_truncates() -> None:
    messages = [
        {"role": "system", "content": "ignored"},
        {"role": "assistant", "content": "<think>look it up</think><tool_call>{...}</tool_call>"},
        {
            "role": "user",
            "content": "<tool_response>\none two three four five six\n</tool_response>",
        },
        {"role": "assistant", "content": [{"type": "text", "text": "<answer>Paris</answer>"}]},
        {
            "role": "user",
            "content": "\nI have a revised plan for you to follow:\n1. Verify\nPlease continue with this updated guidance:\n",
        },
        {
            "role": "tool",
            "content": [
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": " a b"},
            ],
        },
    ]
    assert format_trace("Where?", messages, max_tool_words=3) == (
        "### Question: Where?\n\n"
        "### Round 1:\n#### Agent Reasoning and Tool Call:\n"
        "<think>look it up</think><tool_call>{...}</tool_call>\n\n"
        "#### Tool Call Return Results:\n<tool_response> one two ... (5 more words omitted)\n\n"
        "### Round 2:\n#### Agent Reasoning and Tool Call:\n<answer>Paris</answer>\n\n"
        "#### Revised Plan:\nI have a revised plan for you to follow:\n1. Verify\n"
        "Please continue with this updated guidance:\n\n"
        "#### Tool Call Return Results:\n<image> a b"
    )
    assert format_trace("Where?", []) == "### Question: Where?"


def _rollout(
    i: int, judgement: str, n_messages: int = 2, plan: str = "", key: str = "d1"
) -> Rollout:
    return Rollout(
        id=i,
        data_id=key,
        question="Q?",
        image_caption="",
        plan=plan,
        judgement=judgement,
        messages=[{"role": "assistant", "content": str(k)} for k in range(n_messages)],
        used_memory_ids=[i],
        created_at=0.0,
    )


def test_ttrl_selection_rules() -> None:
    assert plan_length("1. search x\n2) verify y\nStep 3: answer") == (3, 9)
    group = [
        _rollout(1, "incorrect", plan="1. a b c\n2. d"),
        _rollout(2, "correct", plan="1. a\n2. b\n3. c"),
        _rollout(3, "correct", plan="1. a b"),
        _rollout(4, "incorrect", plan="1. a"),
    ]
    assert select_index("first", group, 0) == 0
    assert select_index("shortest", group, 0) == 3  # (1 step, 2 words)
    assert select_index("longest", group, 0) == 1  # 3 steps
    picks = {select_index("random", group, seed) for seed in range(20)}
    assert picks <= {0, 1, 2, 3} and len(picks) > 1
    assert select_index("random", group, 7) == select_index("random", group, 7)
    assert parse_choice("<think>plan 9 is bad</think> Plan 2", 3) == 1
    assert parse_choice("none of them", 3) is None and parse_choice("7", 3) is None


def test_consolidation_majority_credit() -> None:
    # 2 correct vs 2 incorrect: #correct <= #incorrect -> only the negative carries its ids.
    group = [
        _rollout(1, "correct", 5),
        _rollout(2, "incorrect"),
        _rollout(3, "correct", 3),
        _rollout(4, "incorrect"),
    ]
    c = consolidate_group(group, seed=0)
    assert c.positive.id == 3  # fewest messages
    assert c.negative.id in (2, 4) and consolidate_group(group, seed=0).negative.id == c.negative.id
    assert (c.credit_positive, c.credit_negative) == (False, True)
    c = consolidate_group(group[:3], seed=0)  # 2 correct vs 1 incorrect
    assert (c.positive.id, c.negative.id, c.credit_positive, c.credit_negative) == (
        3,
        2,
        True,
        False,
    )
    c = consolidate_group([_rollout(1, "incorrect")], seed=0)
    assert (c.positive, c.credit_negative) == (None, True)


def test_config_yaml_mirrors_dataclass_and_overrides() -> None:
    assert load_config("default") == MemoryServeConfig()
    cfg = load_config(
        "default", ["store.retrieval.top_k=4", "llm.overrides.manager.base_url=http://h:1/v1"]
    )
    assert cfg.store.retrieval.top_k == 4
    assert cfg.llm.overrides == {"manager": {"base_url": "http://h:1/v1"}}
    with pytest.raises(MiaError, match="compress.mode"):
        load_config(None, ["compress.mode=zip"])
    with pytest.raises(MiaError, match="memory config"):
        load_config(None, ["store.retrieval.nope=1"])
    with pytest.raises(MiaError, match="not found"):
        load_config("no-such-config")
    with pytest.raises(MiaError, match="llm.enabled=false"):
        load_config(None, ["llm.enabled=false"])


def test_empty_summary_fails_or_falls_back_to_the_trace() -> None:
    import asyncio

    from memory_serve.compress import Compressor
    from memory_serve.config import CompressConfig
    from mia.llm.base import LLMError
    from mia.llm.scripted import ScriptedChat

    trace = "Question: q\nStep 1: search(x) -> y"
    only_thinking = "<think>I could summarise this.</think>"
    strict = Compressor(CompressConfig(), ScriptedChat([only_thinking]))
    with pytest.raises(LLMError, match="empty workflow summary"):
        asyncio.run(strict.summarise(trace))
    lenient = Compressor(CompressConfig(on_empty="trace"), ScriptedChat([only_thinking]))
    assert asyncio.run(lenient.summarise(trace)) == trace
