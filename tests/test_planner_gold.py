"""Plan chats with retrieved memories (mia.apps.planner_gold): the memories decide the target."""

from __future__ import annotations

import contextlib

import pytest

from mia.apps.planner_gold import planner_memory_examples
from mia.data.world import World
from mia.data.world_questions import HELD_OUT_TEMPLATES
from mia.prompts import manager as manager_text
from mia.prompts.planner import EMPTY_MEMORY


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    from local_search import build_index, open_index

    root = tmp_path_factory.mktemp("pg")
    world = World.generate(0, "small")
    world.write(root / "w")
    build_index(root / "w" / "corpus.jsonl", root / "idx", "bm25")
    with contextlib.closing(open_index(root / "idx")) as retriever:
        return planner_memory_examples(world, retriever, style="concise", seed=1)


def _blocks(prompt: str) -> tuple[str, str]:
    pos_head = prompt.index(manager_text.POSITIVE_HEADER.split("{")[0])
    neg_head = prompt.index(manager_text.NEGATIVE_HEADER.split("{")[0])
    end = prompt.index("## Question")
    return prompt[pos_head:neg_head], prompt[neg_head:end]


def test_convention_targets_follow_the_memories(rows: list[dict]) -> None:
    conventions = [r for r in rows if r["type"] == "convention"]
    assert conventions and len({r["relation"] for r in conventions}) >= 3
    for r in rows:
        prompt = r["planner_messages"][1]["content"]
        assert EMPTY_MEMORY not in prompt and "- Judgement: " in prompt
        assert not any(t in r["id"] for t in HELD_OUT_TEMPLATES)
    readings_seen: dict[str, set[str]] = {}
    for r in conventions:
        prompt, reply = r["planner_messages"][1]["content"], r["planner_messages"][2]["content"]
        pos, neg = _blocks(prompt)
        think, plan = reply.split("</think>")
        # The reason names the positive's fact (or that none succeeded) and the one to look
        # for; the plan reads it.
        wanted = think.split("so I will look for ")[1].removesuffix(".\n").removesuffix(" instead")
        fact = wanted.split(" of ")[0].split(" where ")[0].split(" in which ")[0]
        assert fact in plan
        if "Judgement: correct" in pos:
            assert "So " + fact in pos or fact.replace("the ", "So the ", 1) in pos
        else:  # negatives only: the target is a fact the failure did not read
            assert think.startswith("<think>\nNo similar question was answered correctly; ")
            assert "None found." in pos and "Judgement: incorrect" in neg
        if "Judgement: incorrect" in neg:
            assert ("So " + fact) not in neg.split("Workflow Summary:")[1].split('-> "')[0]
        readings_seen.setdefault(r["question"].split(" ")[0:3][0], set()).add(fact)
    # the same wording is trained toward more than one reading: only the memories tell which
    assert any(len(v) > 1 for v in readings_seen.values())


def test_about_half_of_the_chats_with_both_show_the_negatives_only(rows: list[dict]) -> None:
    """What a Planner meets first for a new kind of question: failures only. Half of the chats
    that had both kinds of memory (single hop, conventions) keep only the negatives, and their
    reason says no similar question succeeded."""
    from mia.apps.planner_gold import NEGATIVES_ONLY_RATE

    both = neg_only = 0
    for r in rows:
        if r["type"] not in ("single_hop", "convention"):
            continue
        pos, neg = _blocks(r["planner_messages"][1]["content"])
        reply = r["planner_messages"][2]["content"]
        if "Judgement: correct" in pos and "Judgement: incorrect" in neg:
            both += 1
            assert reply.startswith("<think>\nA similar question was answered correctly")
        elif "Judgement: incorrect" in neg:
            neg_only += 1
            assert "None found." in pos
            assert reply.startswith("<think>\nNo similar question was answered correctly; ")
            assert " instead.\n</think>" in reply
    assert NEGATIVES_ONLY_RATE == 0.5 and both + neg_only >= 15  # 18 on this world
    assert 0.25 < neg_only / (both + neg_only) < 0.75  # 10 of 18, a seeded draw


def test_a_target_without_a_gold_plan_is_skipped(rows: list[dict], tmp_path, monkeypatch) -> None:
    """A question whose supporting passage no query finds (world 7 of the Planner recipe has one)
    has no gold plan: its memory chat is left out, the others are still written."""
    from local_search import build_index, open_index
    from mia.apps import gold

    world = World.generate(0, "small")
    world.write(tmp_path / "w")
    build_index(tmp_path / "w" / "corpus.jsonl", tmp_path / "idx", "bm25")
    real = gold.GoldWriter.plan
    skipped: list[str] = []

    def plan(self, q):  # every bridge question is "uncoverable"
        if q.type == "bridge":
            skipped.append(q.id)
            raise gold.GoldSkip("passage 1 is not in the top 3 for any query variant")
        return real(self, q)

    monkeypatch.setattr(gold.GoldWriter, "plan", plan)
    with contextlib.closing(open_index(tmp_path / "idx")) as retriever:
        kept = planner_memory_examples(world, retriever, style="concise", seed=1)
    assert skipped and kept
    assert not {r["id"].split("#", 1)[0] for r in kept} & set(skipped)
    assert {r["type"] for r in kept} == {r["type"] for r in rows} - {"bridge"}


def test_failures_show_what_was_expected(rows: list[dict]) -> None:
    """Most failed memories carry the answer the question wanted and the sentence of the
    failed transcript's search results that held it (as memory_serve shows failures written
    with ``memory.remember_expected``); the target's reason names that fact, then plans it."""
    from mia.apps.planner_gold import EXPECTED_RATE

    with_neg = shown = 0
    for r in rows:
        _, neg = _blocks(r["planner_messages"][1]["content"])
        if "Judgement: incorrect" not in neg:
            continue
        with_neg += 1
        reply = r["planner_messages"][2]["content"]
        if "- Expected Answer: " not in neg:
            assert " was expected, " not in reply
            continue
        shown += 1
        answer = neg.split("- Expected Answer: ")[1].split("\n")[0]
        evidence = neg.split('- Where It Was: "')[1].split('"\n')[0]
        assert answer.lower() in evidence.lower()
        think, plan = reply.split("</think>")
        assert f", but {answer} was expected, the " in think
        wanted = think.split("so I will look for ")[1].removesuffix(".\n").removesuffix(" instead")
        assert wanted.split(" of ")[0].split(" where ")[0].split(" in which ")[0] in plan
    assert with_neg >= 10 and 0.5 * EXPECTED_RATE <= shown / with_neg <= 1.0


def test_legacy_readings_are_the_world_s_conventions(rows: list[dict]) -> None:
    """The readings come from the world's lexicon; on a legacy world they are the fixed table."""
    from mia.apps.planner_gold import READINGS, readings

    assert readings(World.generate(0, "small")) == READINGS


def test_planner_plans_never_copy_what_memory_remembers(rows: list[dict]) -> None:
    from mia.planner.planners import leaked_entities

    for r in rows:
        prompt, reply = (m["content"] for m in r["planner_messages"][1:])
        plan = reply.split("</think>", 1)[1]
        assert leaked_entities(plan, r["question"], prompt) == [], r["id"]


# ----------------------------------------------------------------------------- the leak filter

LEAK_CONTEXT = (
    "# Retrieved Relevant Memories\n\n"
    "## Positive Examples (Successful Strategies - 1)\n[Example 1]\n- Modality: text-only\n"
    "- Judgement: correct\n- Question: Where is Vorlanic Institute based?\n- Workflow Summary:\n"
    '1. search (query "Vorlanic Institute based" -> passages: Vorlanic Institute)\n'
    '2. answer (So Vorlanic Institute is based in Kramwick. -> "Kramwick")\n\n'
    "## Negative Examples (Failure Lessons - 1)\n[Example 1]\n- Modality: text-only\n"
    "- Judgement: incorrect\n- Question: Where does Pstad lie?\n- Workflow Summary:\n"
    '1. search (query "Pstad" -> passages: Pstad)\n2. answer (-> "Tovar River")\n'
    "- Expected Answer: Basesh\n"
    '- Where It Was: "Pstad is a town in the Oder county of Basesh."'
)


def test_leaked_entities_names_remembered_entities_and_expected_answers() -> None:
    from mia.planner.planners import leaked_entities, remembered

    question = "Where does Lirford lie?"
    assert remembered(question, LEAK_CONTEXT) == (["Pstad", "Vorlanic Institute"], ["Basesh"])
    assert leaked_entities('1. Search for "Lirford town".', question, LEAK_CONTEXT) == []
    plan = '1. Search for "Pstad town".\n2. Check that the country is basesh.'
    assert leaked_entities(plan, question, LEAK_CONTEXT) == ["Basesh", "Pstad"]
    # an answer counts as a whole phrase only, and not when the question holds it
    assert leaked_entities("1. Search for Basesha.", question, LEAK_CONTEXT) == []
    assert leaked_entities("1. Search Basesh.", "Is Lirford in Basesh?", LEAK_CONTEXT) == []
    # the answers of successes are not expected answers; short answers are not checked
    assert leaked_entities("1. Compare with Kramwick.", question, LEAK_CONTEXT) == []
    short = LEAK_CONTEXT.replace("- Expected Answer: Basesh", "- Expected Answer: 12")
    assert leaked_entities("1. Search for 12 towns.", question, short) == []


def test_redact_remembered_exact() -> None:
    from mia.planner.planners import redact_remembered

    out = redact_remembered(LEAK_CONTEXT, "Where does Lirford lie?")
    assert out == (
        LEAK_CONTEXT.replace("Vorlanic Institute", "[entity]")
        .replace("Pstad", "[entity]")
        .replace("Basesh", "[answer]")
    )
    assert "Kramwick" in out and "Tovar River" in out  # not expected answers: kept
    # a name the question holds is the question's own: kept
    own = redact_remembered(LEAK_CONTEXT, "Where is Pstad?")
    assert "Where does Pstad lie?" in own and "[answer]" in own
    assert redact_remembered("no memories", "Where is Pstad?") == "no memories"


def test_the_rag_guide_hands_on_no_remembered_entity_or_answer() -> None:
    """Under ``rag`` the retrieved context is the guide: with ``redact_leaked`` (the eval's
    ``memory.drop_leaked_plans``) its remembered entities and expected answers are redacted;
    the run keeps the context as retrieved. Without it the guide is the context."""
    import asyncio

    from mia.planner.flow import PlannerRun, Task
    from mia.planner.planners import GuidePlanner

    def guide(redact: bool) -> PlannerRun:
        task = Task("Where does Lirford lie?", memory_context=LEAK_CONTEXT, memory_ids=[3, 7])
        run = PlannerRun(task=task)
        asyncio.run(GuidePlanner(None, redact_leaked=redact).plan(run))  # type: ignore[arg-type]
        return run

    run = guide(True)
    assert run.memory_context == LEAK_CONTEXT and run.memory_ids == [3, 7]
    assert run.plan.splitlines()[6:9] == [
        "- Question: Where is [entity] based?",
        "- Workflow Summary:",
        '1. search (query "[entity] based" -> passages: [entity])',
    ]
    assert run.plan.endswith(
        '- Expected Answer: [answer]\n- Where It Was: "[entity] is a town in the Oder county '
        'of [answer]."'
    )
    assert guide(False).plan == LEAK_CONTEXT
