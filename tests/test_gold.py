"""Gold trajectories: built on a small world with a real BM25 index, replayed through the real
Executor loop and tools (a real uvicorn local_search server), checked against the world's facts,
the format rules, the Planner prompts and for byte determinism."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from local_search import build_index, open_index
from local_search.server import create_search_app
from memory_serve.records import Retrieval
from mia.agent import AgentConfig, ChatPolicy, ExecutorLoop, build_tools, check_format
from mia.agent.tools import QUERY_SEPARATOR, format_passages
from mia.apps.gold import (
    REFLECTION_DECISION,
    GoldExample,
    GoldReport,
    GoldSkip,
    GoldWriter,
    dumps_gold,
    generate_gold,
    load_gold,
    passage_text,
    write_gold,
)
from mia.cli import main as mia_main
from mia.data.world import World
from mia.data.world_questions import contains
from mia.errors import MiaError
from mia.http import ServerThread
from mia.judge.rules import RuleJudge
from mia.llm.scripted import ScriptedChat
from mia.prompts import planner as planner_text
from mia.prompts.planner import plan_messages
from mia.trace import content_text, format_trace

TYPES = ("single_hop", "bridge", "comparison", "image")
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, Path, GoldReport]:
    world = World.generate(0, "small")
    root = tmp_path_factory.mktemp("gold")
    world.write(root / "w0")
    build_index(root / "w0" / "corpus.jsonl", root / "idx", method="bm25")
    report = generate_gold(
        world, root / "idx", split="all", image_cache_root=root / "w0" / "image_cache"
    )
    return world, root, report


def _by_type(report: GoldReport) -> dict[str, GoldExample]:
    out: dict[str, GoldExample] = {}
    for ex in report.examples:
        out.setdefault(ex.type, ex)
    return out


def _assistant(ex: GoldExample) -> list[str]:
    return [content_text(m["content"]) for m in ex.messages if m["role"] == "assistant"]


def _calls(ex: GoldExample) -> list[dict]:
    return [json.loads(TOOL_CALL.search(t).group(1)) for t in _assistant(ex) if "<tool_call>" in t]


def _observations(ex: GoldExample) -> list[str]:
    return [
        content_text(m["content"])
        for m in ex.messages[2:]
        if m["role"] == "user" and "<tool_response>" in content_text(m["content"])
    ]


# -- coverage and correctness -------------------------------------------------------------------


def test_coverage_and_every_type_is_covered(built) -> None:
    world, _, report = built
    assert report.total == len(world.questions) == 96
    assert report.coverage >= 0.9, report.skipped
    # Honest numbers on this world: every question gets a gold transcript.
    assert report.by_type() == {
        "single_hop": (24, 24),
        "bridge": (24, 24),
        "comparison": (12, 12),
        "image": (12, 12),
        "convention": (24, 24),
    }
    assert report.skipped == []
    assert report.summary().startswith("coverage 96/96 (100.0%)")
    assert sorted(e.id for e in report.examples) == sorted(q.id for q in world.questions)


def test_every_example_is_correct_well_formed_and_uses_valid_calls(built) -> None:
    world, _, report = built
    questions = {q.id: q for q in world.questions}
    judge_em, judge_contains = RuleJudge(mode="em"), RuleJudge(mode="contains")
    for ex in report.examples:
        q = questions[ex.id]
        turns = _assistant(ex)
        assert check_format(turns).ok, (ex.id, check_format(turns).issues)
        final = turns[-1]
        assert final.endswith(f"<answer>{q.answer}</answer>")
        answer = final.split("<answer>")[1].removesuffix("</answer>")
        assert judge_em.grade_sync(q.question, answer, q.answers).correct
        assert judge_contains.grade_sync(q.question, answer, q.answers).correct
        for text in turns[:-1]:
            body = TOOL_CALL.search(text).group(1)
            call = json.loads(body)  # strict JSON, as written
            assert set(call) == {"name", "arguments"}
            if call["name"] == "search":
                assert list(call["arguments"]) == ["query_list"]
                assert all(
                    isinstance(s, str) and s.strip() for s in call["arguments"]["query_list"]
                )
            else:
                assert call == {"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}
        # Each turn opens with its reasoning; one tool call per turn; one observation per call.
        assert all(t.startswith("<think>\n") and t.count("<tool_call>") <= 1 for t in turns)
        assert len(_observations(ex)) == len(turns) - 1
        n_calls = {"single_hop": 1, "convention": 1, "bridge": 2, "comparison": 1, "image": 2}[
            ex.type
        ]
        assert len(turns) == n_calls + 1


def _replay(root: Path, ex: GoldExample, world: World) -> tuple[object, list]:
    """Feed the stored assistant turns to a FRESH loop with real tools and a real server."""
    q = next(q for q in world.questions if q.id == ex.id)

    async def run(url: str) -> object:
        cfg = AgentConfig()
        cfg.tools["search"]["params"]["url"] = url
        cfg.tools["web_image_to_image_search"]["params"]["cache_roots"] = [
            str(root / "w0" / "image_cache")
        ]
        tools = build_tools(cfg.tools)
        chat = ScriptedChat(_assistant(ex))
        loop = ExecutorLoop(ChatPolicy(chat), tools, cfg)
        task = {
            "question": q.question,
            "images": [q.image_png] if q.image_png else [],
            "plan": ex.plan,
            "data_id": q.id,
        }
        try:
            return await loop.run(task)
        finally:
            await tools.aclose()

    with open_index(root / "idx") as retriever, ServerThread(create_search_app(retriever)) as url:
        return asyncio.run(run(url)), q.answers


def test_stored_transcripts_replay_identically_through_the_real_loop(built) -> None:
    world, root, report = built
    for qtype, ex in _by_type(report).items():
        traj, answers = _replay(root, ex, world)
        assert traj.messages == ex.messages, qtype
        assert traj.stop_reason == "answer" and traj.answer == ex.answer
        assert RuleJudge(mode="em").grade_sync(ex.question, traj.answer, answers).correct
        assert [r.ok and r.strict_json for r in traj.tool_calls] == [True] * len(traj.tool_calls)
        assert traj.tool_errors == []


def test_observations_are_the_real_retriever_results_verbatim(built) -> None:
    _, root, report = built
    with open_index(root / "idx") as retriever:
        for ex in report.examples:
            for call, obs in zip(_calls(ex), _observations(ex), strict=True):
                if call["name"] != "search":
                    continue
                queries = call["arguments"]["query_list"]
                hits = retriever.search(queries, 3)
                blocks = [format_passages([h.document() for h in row]) for row in hits]
                assert obs == f"<tool_response>\n{QUERY_SEPARATOR.join(blocks)}\n</tool_response>"


def _passage_sentence(world: World, entity_id: str, needle: str) -> str:
    p = next(p for p in world.passages if p.entity_id == entity_id)
    return next(s for s in re.split(r"(?<=[.!?])\s+", p.text) if contains(s, needle))


def test_single_hop_transcript_exact(built) -> None:
    world, _, report = built
    ex = _by_type(report)["single_hop"]
    q = next(q for q in world.questions if q.id == ex.id)
    ent = world.entities[q.entity_ids[0]]
    query = _calls(ex)[0]["arguments"]["query_list"]
    assert len(query) == 1 and query[0].startswith(ent.name)
    sentence = _passage_sentence(world, ent.id, q.answer)
    final = _assistant(ex)[-1]
    assert final.startswith(f'<think>\nThe passage on {ent.name} says: "{sentence}" So the ')
    assert final.endswith(f" is {q.answer}.\n</think>\n<answer>{q.answer}</answer>")
    assert ex.messages[0]["role"] == "system" and '"name": "search"' in ex.messages[0]["content"]
    # The Executor prompt carries the gold plan as its guide.
    assert ex.messages[1]["content"].endswith(
        f"\nHere is a guide for your reference:\n{ex.plan}\nBegin your answer:\n"
    )


def test_bridge_reads_the_bridge_entity_from_the_first_observation(built) -> None:
    world, _, report = built
    bridges = [e for e in report.examples if e.type == "bridge"]
    assert len(bridges) == 24
    for ex in bridges:
        q = next(q for q in world.questions if q.id == ex.id)
        subj, mid = (world.entities[i] for i in q.entity_ids)
        first, second = _observations(ex)
        assert not contains(q.question, mid.name)
        # The subject's own passage, as observed, names the bridge entity but not the answer
        # (other retrieved passages may hold it: the world only forbids it in that passage).
        subject_text = passage_text(first, subj.name)
        assert contains(subject_text, mid.name)
        assert not any(contains(subject_text, a) for a in q.answers)
        assert contains(second, q.answer)
        q1, q2 = (c["arguments"]["query_list"] for c in _calls(ex))
        assert q1[0].startswith(subj.name) and q2[0].startswith(mid.name)
        # The second turn quotes the sentence naming the bridge entity, from the observation.
        quote = re.search(r'says: "(.*?)" So ', _assistant(ex)[1]).group(1)
        assert contains(quote, mid.name) and quote in first
        assert mid.name not in ex.plan and q.answer not in ex.plan


def test_comparison_searches_both_entities_in_one_call(built) -> None:
    world, _, report = built
    for ex in (e for e in report.examples if e.type == "comparison"):
        q = next(q for q in world.questions if q.id == ex.id)
        a, b = (world.entities[i] for i in q.entity_ids)
        (call,) = _calls(ex)
        qa, qb = call["arguments"]["query_list"]
        assert qa.startswith(a.name) and qb.startswith(b.name)
        assert ex.answer == q.answer in (a.name, b.name)
        assert _assistant(ex)[-1].count("The passage on ") == 2


def test_image_identifies_the_picture_then_searches(built) -> None:
    world, _, report = built
    ex = _by_type(report)["image"]
    q = next(q for q in world.questions if q.id == ex.id)
    owner = world.entities[q.entity_ids[0]]
    user = ex.messages[1]["content"]
    assert isinstance(user, list)
    urls = [p["image_url"]["url"] for p in user if p.get("type") == "image_url"]
    assert len(urls) == 1 and urls[0].startswith("data:image/png;base64,")
    image_call, search_call = _calls(ex)
    assert image_call == {"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}
    obs = _observations(ex)[0]
    titles = [r.title for r in world.image_search[q.id]]
    assert (
        obs
        == "<tool_response>\n"
        + "\n".join(f"{k}. title: {t} <image>" for k, t in enumerate(titles, 1))
        + "\n</tool_response>"
    )
    assert titles[0] == owner.name
    assert search_call["arguments"]["query_list"][0].startswith(owner.name)
    assert f'The top result is titled "{owner.name}"' in _assistant(ex)[1]
    assert owner.name not in ex.plan


# -- the Planner side ---------------------------------------------------------------------------


def test_planner_chat_matches_memory_serve_and_plan_rules(built) -> None:
    world, _, report = built
    context = Retrieval(positives=(), negatives=()).context()
    for ex in report.examples:
        q = next(q for q in world.questions if q.id == ex.id)
        expected = plan_messages(context, q.question, image=q.type == "image")
        assert ex.planner_messages[:2] == expected
        reply = ex.planner_messages[2]
        assert (
            reply["role"] == "assistant"
            and planner_text.text_after_think(reply["content"]) == ex.plan
        )
        steps = ex.plan.split("\n")
        assert [s.split(".")[0] for s in steps] == [str(i) for i in range(1, len(steps) + 1)]
        if q.type != "comparison":  # a comparison's answer is one of the names it asks about
            assert not any(contains(ex.plan, a) for a in q.answers), ex.id
        assert ("web_image_to_image_search" in ex.plan) == (q.type == "image")
        if q.type in ("single_hop", "bridge"):  # the plan names the query the Executor runs
            (query,) = _calls(ex)[0]["arguments"]["query_list"]
            assert steps[0] == f'1. Search for "{query}" to find the passage about ' + (
                world.entities[q.entity_ids[0]].name + "."
            )


def test_reflection_continues_the_plan_chat_with_the_trace_and_says_no(built) -> None:
    _, _, report = built
    for ex in report.examples:
        refl = ex.reflection_messages
        assert refl[:3] == ex.planner_messages
        trace = format_trace(ex.question, ex.messages[2:])
        assert refl[3] == {"role": "user", "content": planner_text.judge_prompt(trace)}
        assert refl[4] == {"role": "assistant", "content": REFLECTION_DECISION}
        assert planner_text.parse_decision(refl[4]["content"]) is False


# -- determinism, files, CLI, errors ------------------------------------------------------------


def test_same_seed_gives_identical_bytes(built, tmp_path) -> None:
    _, _, report = built
    world = World.generate(0, "small")  # a fresh world object and a fresh index
    world.write(tmp_path / "w")
    build_index(tmp_path / "w" / "corpus.jsonl", tmp_path / "idx", method="bm25")
    again = generate_gold(world, tmp_path / "idx", split="test")  # cache written from the world
    first = [e for e in report.examples if e.split == "test"]
    assert len(first) == 28  # the small world's test split
    assert dumps_gold(again.examples).encode() == dumps_gold(first).encode()


def test_write_and_load_round_trip(built, tmp_path) -> None:
    _, _, report = built
    path = write_gold(tmp_path / "sub" / "gold.jsonl", report.examples[:5])
    assert path.read_text(encoding="utf-8") == dumps_gold(report.examples[:5])
    assert load_gold(path) == report.examples[:5]
    rows = path.read_text().splitlines()
    assert set(json.loads(rows[0])) == {
        "id", "type", "relation", "split", "question", "answer", "plan", "messages",
        "planner_messages", "reflection_messages",
    }  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_text(rows[0] + "\n{oops\n")
    with pytest.raises(MiaError, match=r"bad.jsonl line 2: invalid JSON"):
        load_gold(bad)
    bad.write_text(json.dumps({"id": "x"}) + "\n")
    with pytest.raises(MiaError, match=r"bad.jsonl line 1: missing field"):
        load_gold(bad)
    with pytest.raises(MiaError, match="not found"):
        load_gold(tmp_path / "nope.jsonl")


def test_cli_writes_the_same_bytes_as_the_api(built, tmp_path, capsys) -> None:
    _, root, report = built
    out = tmp_path / "gold.jsonl"
    argv = ["gold", "--world", str(root / "w0"), "--index", str(root / "idx"), "--out", str(out)]
    mia_main([*argv, "--split", "test", "--limit", "4", "--quiet"])
    first = [e for e in report.examples if e.split == "test"][:4]
    assert out.read_bytes() == dumps_gold(first).encode()
    assert "coverage 4/4 (100.0%)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as err:
        mia_main([*argv[:3], "--index", str(tmp_path), "--out", str(out)])
    assert err.value.code == 2
    msg = capsys.readouterr().err.strip()
    assert msg.startswith("mia gold: error:") and "not a local_search index" in msg
    assert len(msg.splitlines()) == 1


def test_wrong_index_and_bad_split_are_clear_errors(built, tmp_path) -> None:
    world, root, _ = built
    other = World.generate(1, "small")
    other.write(tmp_path / "w1")
    build_index(tmp_path / "w1" / "corpus.jsonl", tmp_path / "idx1", method="bm25")
    with pytest.raises(MiaError, match="built from another corpus"):
        generate_gold(world, tmp_path / "idx1")
    with pytest.raises(MiaError, match="split must be one of"):
        generate_gold(world, root / "idx", split="dev")


def test_without_plan_the_executor_sees_the_question_alone(built) -> None:
    world, root, report = built
    report2 = generate_gold(
        world, root / "idx", "test", root / "w0" / "image_cache", with_plan=False, limit=2
    )
    first = [e for e in report.examples if e.split == "test"][:2]
    for ex, plain in zip(first, report2.examples, strict=True):
        assert "guide for your reference" not in content_text(plain.messages[1]["content"])
        assert plain.messages[2:] == ex.messages[2:] and plain.plan == ex.plan


def test_unreachable_passages_are_skipped_with_a_reason(built) -> None:
    world, root, _ = built
    q = next(q for q in world.questions if q.type == "single_hop")
    with open_index(root / "idx") as retriever:
        writer = GoldWriter(world, retriever, topk=3)
        with pytest.raises(GoldSkip, match=r"not in the top 3 for any query variant \['zzqx'\]"):
            writer.choose_query(["zzqx"], q.supporting_ids[0], [q.answer])
        # Observations cut to 60 characters lose the evidence: those questions are skipped,
        # with the reason, and no half-valid transcript is kept.
        cfg = replace(AgentConfig(), tool_output_max_chars=60)
        report = generate_gold(
            world, retriever, "test", root / "w0" / "image_cache", agent_config=cfg, limit=5
        )
    assert report.examples == [] and len(report.skipped) == 5
    assert all("the observation has no passage on" in s.reason for s in report.skipped)


# -- styles and plan modes (the SFT recipe's data knobs) -----------------------------------------


@pytest.mark.parametrize("style", ["concise", "terse"])
def test_shorter_styles_keep_the_same_tool_calls_and_answers(built, style) -> None:
    world, root, report = built
    short = generate_gold(world, root / "idx", "test", root / "w0" / "image_cache", style=style)
    full = {e.id: e for e in report.examples if e.split == "test"}
    assert [e.id for e in short.examples] == list(full)  # the same coverage
    judge = RuleJudge(mode="em")
    questions = {q.id: q for q in world.questions}
    for ex in short.examples:
        turns, long_turns = _assistant(ex), _assistant(full[ex.id])
        assert check_format(turns).ok, (ex.id, check_format(turns).issues)
        # the same searches, observations and answer; only the reasoning is shorter
        assert _calls(ex) == _calls(full[ex.id])
        assert _observations(ex) == _observations(full[ex.id])
        assert turns[-1].endswith(long_turns[-1][long_turns[-1].index("<answer>") :])
        assert sum(map(len, turns)) < sum(map(len, long_turns))
        answer = turns[-1].split("<answer>")[1].split("</answer>")[0]
        assert judge.grade_sync(ex.question, answer, questions[ex.id].answers).correct
        if style == "terse":
            assert '"' not in "".join(t.split("<tool_call>")[0] for t in turns)
        elif ex.type in ("single_hop", "bridge"):
            assert turns[-1].startswith('<think>\n"')  # the answer-bearing sentence is quoted
        if ex.type == "single_hop":
            assert turns[0].startswith("<think>\nI need the ")


def test_alternate_plan_gives_about_half_the_questions_the_plan(built) -> None:
    from mia.apps.gold import gets_plan

    world, root, _ = built
    report = generate_gold(
        world, root / "idx", "all", root / "w0" / "image_cache", with_plan="alternate"
    )
    with_plan = [
        "guide for your reference" in content_text(e.messages[1]["content"])
        for e in report.examples
    ]
    assert with_plan == [gets_plan(e.id, "alternate") for e in report.examples]
    assert 0.35 < sum(with_plan) / len(with_plan) < 0.65
    assert gets_plan("x", True) and not gets_plan("x", False)
    with pytest.raises(MiaError, match="with_plan must be"):
        generate_gold(world, root / "idx", "test", with_plan="sometimes")
    with pytest.raises(MiaError, match="style must be one of"):
        generate_gold(world, root / "idx", "test", style="chatty")


def test_cli_style_and_alternate_plan(built, tmp_path, capsys) -> None:
    world, root, _ = built
    out = tmp_path / "gold.jsonl"
    argv = ["gold", "--world", str(root / "w0"), "--index", str(root / "idx"), "--out", str(out)]
    mia_main([*argv, "--split", "test", "--limit", "4", "--quiet", "--style", "terse",
              "--alternate-plan"])  # fmt: skip
    api = generate_gold(
        world, root / "idx", "test", root / "w0" / "image_cache", limit=4, style="terse",
        with_plan="alternate",
    )  # fmt: skip
    assert out.read_bytes() == dumps_gold(api.examples).encode()
    capsys.readouterr()


def test_legacy_worlds_keep_the_fixed_words(built) -> None:
    """A legacy world's queries and facts are the fixed tables' (its gold is what it always
    was); a drawn lexicon's nouns replace city and region, and nothing else."""
    from mia.apps.gold import FACT_PHRASES, QUERY_WORDS, fact_phrase, query_words, worded
    from mia.data.world_lexicon import lexicon_for

    world = built[0]
    assert world.lexicon.legacy
    city = next(e for e in world.entities.values() if e.kind == "city")
    for rel in ("region", "population", "river"):
        assert query_words(city, rel, world.lexicon) == QUERY_WORDS[f"city.{rel}"]
        assert query_words(city, rel) == QUERY_WORDS[f"city.{rel}"]
        want = FACT_PHRASES[f"city.{rel}"].format(x=city.name)
        assert fact_phrase(city, rel, lexicon=world.lexicon) == fact_phrase(city, rel) == want
    drawn = lexicon_for(100)
    assert (drawn.nouns["city"], drawn.nouns["region"]) == ("town", "county")
    assert (
        worded("the city's name, the region's name", drawn) == "the town's name, the county's name"
    )
    assert worded("the capital city of the regions", drawn) == "the capital town of the regions"
    assert worded("the city's name", world.lexicon) == "the city's name"
