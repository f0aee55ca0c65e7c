"""Gold on a world drawn per seed (docs/world.md, "Worlds drawn per seed"): the transcripts and
plans speak the world's lexicon (its bridge descriptions, the words its passages use, its nouns)
and the Planner chats with memories follow its own conventions."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import pytest

from local_search import build_index, open_index
from mia.apps.gold import GoldReport, GoldWriter, drawn_query_words, generate_gold
from mia.apps.planner_gold import READINGS, planner_memory_examples, readings
from mia.data.world import World
from mia.planner.planners import leaked_entities
from mia.trace import content_text


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("drawn")
    world = World.generate(100, "small")
    world.write(root / "w")
    build_index(root / "w" / "corpus.jsonl", root / "idx", method="bm25")
    with contextlib.closing(open_index(root / "idx")) as retriever:
        report = generate_gold(
            world, retriever, split="all", image_cache_root=root / "w" / "image_cache"
        )
        rows = planner_memory_examples(world, retriever, style="concise", seed=1)
        yield {"world": world, "report": report, "rows": rows, "retriever": retriever}


def _questions(world: World) -> dict[str, Any]:
    return {q.id: q for q in world.questions}


def test_a_drawn_world_gets_gold_for_every_type(drawn) -> None:
    world, report = drawn["world"], drawn["report"]
    assert world.lexicon.name == "drawn"  # seed 100: a train world
    assert (world.lexicon.style, world.lexicon.nouns["city"]) == ("encyclopedia", "town")
    assert isinstance(report, GoldReport) and report.examples
    assert report.coverage >= 0.95  # 96/96 when written
    assert {ex.type for ex in report.examples} == {
        "single_hop",
        "bridge",
        "comparison",
        "image",
        "convention",
    }
    # the queries are aimed at the drawn sentences: nearly every one is the first variant
    assert report.variant_use.get(0, 0) >= 0.9 * sum(report.variant_use.values())


def test_every_bridge_transcript_names_the_question_s_own_mention(drawn) -> None:
    world, report = drawn["world"], drawn["report"]
    writer = GoldWriter(world, drawn["retriever"])
    questions = _questions(world)
    bridges = [ex for ex in report.examples if ex.type == "bridge"]
    assert len(bridges) >= 20
    for ex in bridges:
        _, _, _, _, mention = writer.bridge_parts(questions[ex.id])
        assert mention in ex.question
        first = content_text(next(m for m in ex.messages if m["role"] == "assistant")["content"])
        assert f"First I need the name of {mention}" in first
        assert f"take the name of {mention}." in ex.plan


def test_a_drawn_bridge_plan_exact(drawn) -> None:
    ex = next(e for e in drawn["report"].examples if e.id == "w100_train_00005")
    assert ex.question == "What money does the country of Chycho Driko's birth use?"
    assert ex.plan == (
        '1. Search for "Chycho Driko born" to find the passage about Chycho Driko.\n'
        "2. Read that passage and take the name of the country of Chycho Driko's birth.\n"
        '3. Search for that name together with words such as "pay".\n'
        "4. Read the passage about that country and find the currency of that country.\n"
        "5. Answer with the currency only."
    )


def test_queries_and_facts_speak_the_world_s_words(drawn) -> None:
    """Single-hop queries add the words of the drawn sentence (mia.data.world_styles) to the
    name; plans and reasoning call a town a town and a county a county."""
    world, report = drawn["world"], drawn["report"]
    assert (world.lexicon.nouns["city"], world.lexicon.nouns["region"]) == ("town", "county")
    questions = _questions(world)
    legacy_words = re.compile(r"\b(?:city|region)\b")
    first_variant = 0
    singles = [ex for ex in report.examples if ex.type == "single_hop"]
    for ex in singles:
        q = questions[ex.id]
        ent = world.entities[q.entity_ids[0]]
        words = drawn_query_words(world.lexicon, ent, q.relation.split(".", 1)[1])
        first_variant += f'Search for "{ent.name} {words}"' in ex.plan
    assert first_variant >= 0.9 * len(singles)
    for ex in report.examples:
        thinks = [
            content_text(m["content"]).split("</think>")[0]
            for m in ex.messages
            if m["role"] == "assistant"
        ]
        # quotes are the passages' own words; the rest is the gold's
        said = [re.sub(r'"[^"]*"', "", t) for t in [ex.plan, *thinks]]
        assert not any(legacy_words.search(t) for t in said), ex.id
    region = next(ex for ex in singles if ex.relation == "city.region")
    assert "the county in which" in region.plan and "the county's name" in region.plan


def test_convention_rows_target_one_of_the_world_s_readings(drawn) -> None:
    world, rows = drawn["world"], drawn["rows"]
    meanings = readings(world)
    assert meanings == {c.id: c.readings for c in world.lexicon.conventions}
    assert not set(meanings) & set(READINGS)  # the legacy table knows none of these wordings
    questions = _questions(world)
    conventions = [r for r in rows if r["type"] == "convention"]
    assert len(conventions) >= 30
    targets: dict[str, set[str]] = {}
    for r in conventions:
        q = questions[r["id"].split("#", 1)[0]]
        kind, rel = r["relation"].split(".", 1)
        assert kind == q.relation.split(".", 1)[0]
        assert rel in meanings[q.template], (r["id"], rel, meanings[q.template])
        targets.setdefault(q.template, set()).add(rel)
    # the same wording is trained toward more than one reading: only the memories tell which
    assert any(len(rels) > 1 for rels in targets.values())


def test_planner_plans_never_copy_a_remembered_entity_or_expected_answer(drawn) -> None:
    """The reason may name a failure's expected answer; the plan after ``</think>`` names no
    remembered entity and no expected answer the question lacks."""
    rows = drawn["rows"]
    with_expected = 0
    for r in rows:
        prompt, reply = (m["content"] for m in r["planner_messages"][1:])
        think, plan = reply.split("</think>", 1)
        assert leaked_entities(plan, r["question"], prompt) == [], r["id"]
        if "- Expected Answer: " in prompt:
            with_expected += 1
            answer = prompt.split("- Expected Answer: ")[1].split("\n")[0]
            assert answer in think and answer not in plan
    assert with_expected >= 10
