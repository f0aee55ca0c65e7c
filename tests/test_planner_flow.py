"""One Planner flow: the same scripted question through evaluation (memory_serve's Planner,
chat) and through a Planner GRPO episode (the trainable policy, token-exact) gives identical
prompts, replies and state transitions -- evaluation cannot drift from training."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from role_fixtures import ScriptedGenerator, executor_service, memory_service, replan_of

from memory_serve.records import NewMemory
from mia.data.formats import QAItem
from mia.eval.policies import FlowContext, run_question, spec
from mia.judge import RuleJudge
from mia.llm.base import SamplingParams
from mia.llm.scripted import ScriptedChat
from mia.models.tiny import build_tokenizer
from mia.planner.episode import PlannerEpisode
from mia.planner.flow import FlowConfig, PlannerFlow, State, Task
from mia.planner.planners import NoPlanner
from mia.rl.episode import Rollout
from mia.services import ExecutorClient, MemoryClient

QUESTION = "Who founded Vorlanic Institute?"
ANSWER = "Kaleth Morvaine"
PLAN = "<think>memories: none</think>\n1. Guess the founder."
DECISION = "<think>the answer is a guess</think>\nyes"
REPLAN = "<think>search instead</think>\n1. Search 'Vorlanic Institute founded by'."


def planner_reply(assistant_turns: int) -> str:
    """Plan, then replan? yes, then the supplementary plan (by turns already taken)."""
    return (PLAN, DECISION, REPLAN)[assistant_turns]


def chat_planner(messages: list[dict]) -> str:
    return planner_reply(sum(m["role"] == "assistant" for m in messages))


def token_planner(prompt: str) -> str:
    return planner_reply(prompt.count("<|im_start|>assistant\n") - 1)


def executor_reply(messages: list[dict]) -> str:
    """Right only when told to search (the supplementary plan does)."""
    return f"<answer>{ANSWER if replan_of(messages) else 'Nobody'}</answer>"


def _chat_view(messages: list[dict]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in messages]


def test_eval_and_training_run_the_same_flow(tmp_path: Path) -> None:
    tok = build_tokenizer()
    planner_llm = ScriptedChat(chat_planner, name="planner")
    with (
        memory_service(tmp_path / "mem.sqlite", manager=planner_llm, planner=planner_llm) as (
            memory_url,
            _,
        ),
        executor_service(executor_reply) as (serve_url, _),
    ):

        async def both() -> tuple[dict, object]:
            serve, memory = ExecutorClient(serve_url), MemoryClient(memory_url)
            ctx = FlowContext(spec("plan_only"), serve, memory, RuleJudge())
            item = QAItem(id="q1", question=QUESTION, answers=[ANSWER])
            row = await run_question(item, 0, ctx)
            rollout = Rollout(
                generator=ScriptedGenerator(tok, token_planner),
                sampling=SamplingParams(temperature=1.0, max_tokens=64),
            )
            episode = PlannerEpisode(ExecutorClient(serve_url), MemoryClient(memory_url))
            run = await episode.run({"question": QUESTION, "data_id": "q1"}, rollout)
            await serve.aclose()
            await memory.aclose()
            return row, run

        row, run = asyncio.run(both())

    want_states = ["plan", "execute", "reflect", "replan", "continue"]
    assert row["states"] == run.states == want_states
    assert row["error"] is None and row["correct"] and row["prediction"] == ANSWER
    assert run.final_answer == ANSWER and run.answer_first == "Nobody"
    # The same Planner conversation, turn for turn: system, plan prompt, plan, reflection
    # prompt (the same trace), decision, replan prompt, supplementary plan.
    assert _chat_view(row["planner_messages"]) == _chat_view(run.messages)
    assert [m["role"] for m in run.messages] == [
        "system", "user", "assistant", "user", "assistant", "user", "assistant",
    ]  # fmt: skip
    assert row["plan"] == run.plan == "1. Guess the founder."
    assert row["need_replan"] is run.need_replan is True
    assert row["replan"] == run.replan == "1. Search 'Vorlanic Institute founded by'."


def test_flow_states_without_a_planner_and_without_a_replan() -> None:
    class Executor:
        def __init__(self) -> None:
            self.calls: list[str] = []

        async def execute(self, question, plan, *, data_id=None, images=()):
            self.calls.append("execute")
            return {"answer": "x", "trace": "t", "messages": [], "stop_reason": "answer"}

        async def continue_(self, question, messages, replan, *, data_id=None, images=()):
            self.calls.append("continue")
            return {"answer": "y"}

    ex = Executor()
    run = asyncio.run(PlannerFlow(NoPlanner(), ex).run(Task(question="q")))
    assert run.states == ["plan", "execute"] and ex.calls == ["execute"]
    assert run.final_answer == "x" and run.stop_reason == "done"

    class SaysNo(NoPlanner):
        reflects = True

        async def reflect(self, run, trace):
            run.need_replan = False
            return True

    run = asyncio.run(PlannerFlow(SaysNo(), Executor(), FlowConfig()).run(Task(question="q")))
    assert run.states == [s.value for s in (State.PLAN, State.EXECUTE, State.REFLECT)]
    assert run.record.reflected
    run = asyncio.run(
        PlannerFlow(SaysNo(), Executor(), FlowConfig(reflect=False)).run(Task(question="q"))
    )
    assert run.states == ["plan", "execute"] and not run.record.reflected


@contextlib.contextmanager
def template_memory_stack(
    tmp_path: Path, plan: str = PLAN, **flow: bool
) -> Iterator[tuple[Any, Callable[[], dict], list[str], list[str]]]:
    """memory_serve with template retrieval above a 0.9 floor (the demo's) and a scripted
    Planner writing ``plan``, a scripted Executor; yields (service, ask one question with the
    ``mia`` policy and ``flow`` options, the Planner's prompts, the Executor's last user
    messages)."""
    plans: list[str] = []
    prompts: list[str] = []

    def planner(messages: list[dict]) -> str:
        plans.append(messages[-1]["content"])
        return plan if len(messages) <= 2 else chat_planner(messages)

    def executor_prompt(messages: list[dict]) -> str:
        prompts.append(messages[-1]["content"])
        return executor_reply(messages)

    planner_llm = ScriptedChat(planner, name="planner")
    overrides = ("store.retrieval.key=template", "store.retrieval.min_similarity=0.9")
    with (
        memory_service(tmp_path / "m.sqlite", planner_llm, planner_llm, overrides) as (url, svc),
        executor_service(executor_prompt) as (serve_url, _),
    ):

        async def one() -> dict:
            serve, memory = ExecutorClient(serve_url), MemoryClient(url)
            ctx = FlowContext(spec("mia"), serve, memory, RuleJudge(), reflect=False, **flow)
            row = await run_question(QAItem(id="q", question=QUESTION, answers=[ANSWER]), 0, ctx)
            await serve.aclose()
            await memory.aclose()
            return row

        yield svc, lambda: asyncio.run(one()), plans, prompts


def test_mia_without_a_similar_memory_writes_no_plan(tmp_path: Path) -> None:
    """``plan_without_memory=False`` with template retrieval above a floor: a question whose
    memory holds only other kinds of question runs as ``none`` (no Planner call, no plan, no
    reflection); once a question of its template is remembered, the Planner plans from it."""
    with template_memory_stack(tmp_path, plan_without_memory=False) as (svc, ask, plans, prompts):
        svc.store.add(NewMemory("How old is Vorlanic Institute?", "1. Search its age", "correct"))
        row = ask()
        assert plans == [] and row["plan"] == "" and row["used_memory_ids"] == []
        assert row["states"] == ["plan", "execute"] and row["planner_messages"] == []
        assert "Here is a guide" not in prompts[-1]

        svc.store.add(
            NewMemory("Who founded Drelmar Academy?", "1. Search 'founded by'", "correct")
        )
        row = ask()
        assert len(plans) == 1 and "Who founded Drelmar Academy?" in plans[0]
        assert "How old is" not in plans[0]  # below the floor: not shown
        assert row["plan"] == "1. Guess the founder." and row["used_memory_ids"] == [2]
        assert "Here is a guide for your reference:\n1. Guess the founder." in prompts[-1]


def test_mia_plans_only_where_memory_shows_a_failure(tmp_path: Path) -> None:
    """``plan_without_failure=False``: a question whose similar memories are all successes runs
    as ``none`` (no Planner call, no plan); once a similar question failed, the Planner plans
    and sees both the success and the failure."""
    with template_memory_stack(tmp_path, plan_without_failure=False) as (svc, ask, plans, _):
        row = ask()  # an empty memory: no failure either
        assert plans == [] and row["plan"] == "" and row["states"] == ["plan", "execute"]
        svc.store.add(
            NewMemory("Who founded Drelmar Academy?", "1. Search 'founded by'", "correct")
        )
        row = ask()
        assert plans == [] and row["plan"] == "" and row["planner_messages"] == []
        svc.store.add(NewMemory("Who founded Kestrel Works?", "1. Search its age", "incorrect"))
        row = ask()
        assert len(plans) == 1 and row["plan"] == "1. Guess the founder."
        assert (
            "Who founded Drelmar Academy?" in plans[0] and "Who founded Kestrel Works?" in plans[0]
        )
        assert sorted(row["used_memory_ids"]) == [1, 2]


def test_mia_drops_a_plan_that_names_a_memory_entity(tmp_path: Path) -> None:
    """``drop_leaked_plans=True``: a plan about a remembered question's entity (not the one
    asked) is not used -- the Executor answers alone, the plan is noted in planner_errors; a plan
    about the question's own entity is kept, and so is every plan by default."""
    leaky = "1. Search 'Kestrel Works founded by'.\n2. Answer with the founder."
    failure = NewMemory("Who founded Kestrel Works?", "1. Search its age", "incorrect")
    with template_memory_stack(tmp_path, leaky, drop_leaked_plans=True) as (svc, ask, _, prompts):
        svc.store.add(failure)
        row = ask()
        assert row["plan"] == "" and row["used_memory_ids"] == []
        assert row["planner_messages"] == [] and row["states"] == ["plan", "execute"]
        (note,) = row["planner_errors"]
        assert (
            note.startswith("plan dropped: it names Kestrel Works of a memory")
            and leaky[:9] in note
        )
        assert "Here is a guide" not in prompts[-1]
    own = "1. Search 'Vorlanic Institute founded by'."
    with template_memory_stack(tmp_path / "own", own, drop_leaked_plans=True) as (svc, ask, _, __):
        svc.store.add(failure)
        assert ask()["plan"] == own
    with template_memory_stack(tmp_path / "default", leaky) as (svc, ask, _, prompts):
        svc.store.add(failure)
        row = ask()
        assert row["plan"] == leaky and row["planner_errors"] == []
        assert "Here is a guide for your reference:\n" + leaky in prompts[-1]


def test_a_failure_remembered_with_its_expected_answer(tmp_path: Path) -> None:
    """``memory.remember_expected``: a failed row's ``/memories`` item keeps the first gold and
    the search-result sentence that held it; memory_serve stores both and shows them under the
    failure in the Planner's memory block. A correct row, or the option off, adds nothing."""
    from mia.eval.policies import memory_item

    passage = (
        "<tool_response>\nDoc 1(Title: Pstad) Pstad is a city in Pobland. It was founded in "
        "1603 and has a population of 9.\n</tool_response>"
    )
    row = {
        "id": "q0",
        "policy": "mia",
        "question": "How old is Pstad?",
        "golds": ["1603"],
        "correct": False,
        "plan": "",
        "used_memory_ids": [],
        "messages": [
            {"role": "user", "content": "Question: How old is Pstad?"},
            {"role": "assistant", "content": '<tool_call>{"name": "search"}</tool_call>'},
            {"role": "user", "content": passage},
            {"role": "assistant", "content": "<answer>Pstad</answer>"},
        ],
    }
    item = memory_item(row, "run", expected=True)
    assert item["extra"] == {
        "policy": "mia",
        "eval_source": "run",
        "expected": "1603",
        "evidence": "It was founded in 1603 and has a population of 9.",
    }
    assert memory_item(row, "run")["extra"] == {"policy": "mia", "eval_source": "run"}
    assert "expected" not in memory_item({**row, "correct": True}, "run", expected=True)["extra"]
    with memory_service(tmp_path / "m.sqlite") as (url, _):
        client = MemoryClient(url)
        client.sync.save_memories([item])
        context = client.sync.memory("How old is Lirford?").context
        client.close()
    failure = context.split("## Negative Examples (Failure Lessons - 1)\n")[1]
    assert "- Judgement: incorrect\n- Question: How old is Pstad?\n" in failure
    assert failure.endswith(
        '\n- Expected Answer: 1603\n- Where It Was: "It was founded in 1603 and has a '
        'population of 9."'
    )
