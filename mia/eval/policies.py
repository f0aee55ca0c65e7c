"""Memory policies of ``mia eval``: which Planner the one flow (:mod:`mia.planner.flow`) runs.

| policy      | plan                               | reflection + replan | memory written        |
|-------------|------------------------------------|---------------------|-----------------------|
| `none`      | none: the Executor alone           | no                  | no                    |
| `plan_only` | Planner with no memories (top_k 0) | yes                 | no                    |
| `mia`       | Planner with retrieved workflows   | yes                 | LLM-compressed trace  |
| `rag`       | none: the retrieved context itself | no                  | raw trace (identity)  |
| `feedback`  | none: the last failed question of the same template with its expected answer | no | that question, in the harness |

| `mem0`      | none: retrieved facts as the guide | no                  | facts: ADD/UPDATE/DELETE/NOOP |
| `amem`      | none: retrieved notes (+ links)    | no                  | notes, linked and evolved |
| `reasoningbank` | none: retrieved strategy items | no                  | items from successes and failures |
| `expel`     | Planner reading insights + examples | yes                | insight list edits, experience pool |
| `memento`   | meta-Planner reading correct/incorrect plans | yes       | case (question, plan, reward) |

With ``memory.plan_without_memory=false`` a ``mia`` question for which ``/memory`` finds nothing
gets no plan and runs as ``none`` (with template retrieval above a floor); with
``memory.plan_without_failure=false`` (the demo's choice) so does one whose similar memories
are all successes: the Planner writes plans where memory shows the Executor failing. With
``memory.drop_leaked_plans=true`` (the demo's) a plan that names a retrieved memory's entity
the question lacks is not used: the Executor answers alone (noted in ``planner_errors``).

The five memory baselines (:mod:`mia.baselines`, docs/baselines.md) run in the harness's own
process on a SQLite file in the policy's run folder, behind the same two calls MIA's memory has
(retrieve for a question, write a finished judged trajectory); they need no memory_serve. Their
LLM is ``baselines.llm`` (roles of an llm config: the embedded default or any OpenAI-compatible
endpoint). ``expel`` and ``memento`` feed a Planner (the ``planner`` role, the same three turns
as memory_serve's: plan, reflect, replan); the other three put their context in the Executor's
guide slot, as ``rag`` does.

``feedback`` is the simple feedback baseline (docs/protocol.md): no Planner and no
memory_serve; the Executor's guide is the last question of the same template
(:func:`mia.eval.templates.question_template`: a convention id or a relation) that was judged
wrong, with its expected answer (:data:`FEEDBACK_GUIDE`). The harness keeps
that memory per policy run (:class:`FeedbackMemory`), written when the question's memory write
would be (online: once judged; batched: after its batch). The first question of a template, and
a question with no template, get no guide.

``rag`` is the paper's trace-RAG baseline made precise: ``/memory`` retrieves the same top-k
correct and top-k incorrect memories MIA's planner would see, and that context text goes into
the Executor's guide slot (``Here is a guide for your reference: ...``) instead of a plan; the
first question (empty memory) gets no guide at all, exactly as ``none``. No planner LLM is
involved. Finished trajectories are stored uncompressed: memory_serve must run with
``compress.mode=identity`` (the harness checks).

One question: the flow (PLAN via memory_serve ``/plan`` -> EXECUTE via serve ``/execute`` ->
REFLECT via ``/judge_replan`` -> REPLAN via ``/replan`` -> CONTINUE via ``/continue``, at most
once) -> the judge. The Planner reflects on every Executor run, as in Planner training. A
planner step that memory_serve answers ``502 llm_empty`` (no plan, no yes/no) is skipped and
recorded in ``planner_errors``. The memory write is the harness's job (its timing is what
``online`` and ``batched`` orders differ in).
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mia.baselines import BASELINES, BaselineMemory, Finished
from mia.data.formats import QAItem
from mia.eval.templates import question_template
from mia.judge import Judge, JudgeError
from mia.llm.base import LLMError
from mia.planner.flow import FlowConfig, Planner, PlannerFlow, PlannerRun, Task
from mia.planner.planners import ConversationPlanner, GuidePlanner, NoPlanner, RemotePlanner
from mia.prompts import planner as planner_text
from mia.services import ExecutorClient, MemoryClient, RequestFailed
from mia.trace import content_text, expected_extra, format_trace

POLICIES = ("none", "plan_only", "mia", "rag", "feedback", *BASELINES)
# The ``feedback`` policy's guide (:class:`FeedbackGuide`). Not in mia.prompts.executor: that
# module's constants are part of the warm-start recipe key, and this text trains no role.
FEEDBACK_GUIDE = (
    'A similar earlier question, "{question}", was answered wrongly; the expected answer was '
    "{answer}."
)


@dataclass(frozen=True)
class PolicySpec:
    name: str
    planner: bool  # /plan, /judge_replan, /replan
    retrieve: bool  # memories are retrieved for each question
    writes: bool  # finished trajectories are written to memory
    compress_modes: tuple[str, ...] | None  # memory_serve compress.mode(s) it needs (None: any)
    summary: str
    baseline: bool = False  # an in-process memory baseline (mia.baselines), no memory_serve
    local: bool = False  # its memory is the harness's own (feedback), no memory_serve

    @property
    def needs_memory(self) -> bool:
        """memory_serve is needed (the baselines and feedback keep their memory in the
        harness)."""
        uses = self.planner or self.retrieve or self.writes
        return uses and not self.baseline and not self.local


SPECS: dict[str, PolicySpec] = {
    "none": PolicySpec("none", False, False, False, None, "Executor alone, no plan"),
    "plan_only": PolicySpec(
        "plan_only", True, False, False, None, "planner without memories, nothing stored"
    ),
    "mia": PolicySpec(
        "mia", True, True, True, ("llm", "rules"), "planner + compressed workflow memory"
    ),
    "rag": PolicySpec(
        "rag", False, True, True, ("identity",), "retrieved raw traces as the guide, no planner"
    ),
    "feedback": PolicySpec(
        "feedback",
        False,
        True,
        True,
        None,
        "the last failed question of the same template, with its expected answer, as the guide",
        local=True,
    ),
    "mem0": PolicySpec(
        "mem0", False, True, True, None, "Mem0 facts as the guide, no planner", baseline=True
    ),
    "amem": PolicySpec(
        "amem", False, True, True, None, "A-Mem notes as the guide, no planner", baseline=True
    ),
    "reasoningbank": PolicySpec(
        "reasoningbank",
        False,
        True,
        True,
        None,
        "ReasoningBank strategies as the guide, no planner",
        baseline=True,
    ),
    "expel": PolicySpec(
        "expel", True, True, True, None, "planner + ExpeL insights and examples", baseline=True
    ),
    "memento": PolicySpec(
        "memento", True, True, True, None, "meta-planner + Memento case bank", baseline=True
    ),
}


def spec(name: str) -> PolicySpec:
    return SPECS[name]


@dataclass
class FlowContext:
    """What every question of one policy run shares."""

    policy: PolicySpec
    serve: ExecutorClient
    memory: MemoryClient | None
    judge: Judge
    top_k: int | None = None  # None: memory_serve's default
    replan_top_k: int = 0
    plan_without_memory: bool = True  # False: mia writes no plan when /memory finds nothing
    plan_without_failure: bool = True  # False: ... when /memory finds no failed question
    drop_leaked_plans: bool = False  # True: a plan naming a memory's entity is not used
    reflect: bool = True
    baseline: BaselineMemory | None = None  # the baselines' memory
    planner_llm: Any = None  # expel / memento: the Planner's chat backend
    feedback: FeedbackMemory | None = None  # feedback: the harness's memory of failures
    templates: Mapping[str, str] = dataclasses.field(default_factory=dict)  # id -> template

    def planner(self) -> Planner:
        p = self.policy
        if p.local:
            assert self.feedback is not None
            return FeedbackGuide(self.feedback, self.templates)
        if p.baseline:
            assert self.baseline is not None
            if p.planner:
                from mia.agent import ChatPolicy

                assert self.planner_llm is not None
                inner = ConversationPlanner(ChatPolicy(self.planner_llm), name=p.name)
                return BaselinePlanner(self.baseline, inner)
            return BaselineGuide(self.baseline)
        if p.planner:
            assert self.memory is not None
            top_k = self.top_k if p.retrieve else 0
            return RemotePlanner(
                self.memory,
                top_k,
                self.replan_top_k,
                skip_empty=True,
                require_memory=p.retrieve and not self.plan_without_memory,
                require_failure=p.retrieve and not self.plan_without_failure,
                drop_leaked=p.retrieve and self.drop_leaked_plans,
            )
        if p.retrieve:
            assert self.memory is not None
            return GuidePlanner(self.memory, self.top_k, redact_leaked=self.drop_leaked_plans)
        return NoPlanner()

    def flow(self) -> PlannerFlow:
        return PlannerFlow(self.planner(), self.serve, FlowConfig(reflect=self.reflect))


# ----------------------------------------------------------------------------- baselines


async def _baseline_retrieve(memory: BaselineMemory, run: PlannerRun) -> str:
    t = run.task
    caption = t.image_caption
    if isinstance(caption, list):  # the first caption, as memory_serve
        caption = caption[0] if caption else ""
    got = await memory.retrieve(t.question, str(caption or ""))
    run.memory_ids = list(got.origins)
    run.memory_context = got.context
    return got.context


class BaselineGuide(NoPlanner):
    """A baseline's retrieved context is the Executor's guide (mem0, amem, reasoningbank);
    nothing found gives no guide (as ``rag``)."""

    def __init__(self, memory: BaselineMemory) -> None:
        self.memory = memory
        self.name = memory.name

    async def plan(self, run: PlannerRun) -> bool:
        run.plan = await _baseline_retrieve(self.memory, run)
        return True


class BaselinePlanner:
    """A baseline's context in the Planner's memory slot (expel, memento): the Planner's three
    turns (plan, reflect, replan) as one conversation over the ``planner`` role. A plan prompt
    that leaves the Planner no room is skipped (recorded in ``planner_errors``): the Executor
    goes without a guide."""

    reflects = True

    def __init__(self, memory: BaselineMemory, inner: ConversationPlanner) -> None:
        self.memory = memory
        self.inner = inner
        self.name = memory.name

    async def plan(self, run: PlannerRun) -> bool:
        context = await _baseline_retrieve(self.memory, run)
        run.task = dataclasses.replace(
            run.task,
            memory_context=context or planner_text.EMPTY_MEMORY,
            memory_ids=list(run.memory_ids),
        )
        if not await self.inner.plan(run):
            run.planner_errors.append("plan prompt leaves the Planner no room")
        run.memory_context = context
        return True

    async def reflect(self, run: PlannerRun, trace: str) -> bool:
        if run.conversation is None or not run.plan:  # no plan conversation to reflect in
            return True
        return await self.inner.reflect(run, trace)

    async def replan(self, run: PlannerRun) -> bool:
        return await self.inner.replan(run)


def finished_item(row: dict[str, Any], source: str) -> Finished:
    """The baselines' write payload of a finished row (the plan includes the supplementary
    plan when there was one)."""
    plan = row.get("plan") or ""
    if row.get("replanned") and row.get("replan"):
        plan = f"{plan}\n\nSupplementary plan:\n{row['replan']}".strip()
    caption = row.get("image_caption") or ""
    if isinstance(caption, list):
        caption = caption[0] if caption else ""
    return Finished(
        data_id=str(row["id"]),
        question=str(row["question"]),
        plan=plan,
        trace=str(row.get("trace") or ""),
        answer=str(row.get("prediction") or ""),
        correct=memory_judgement(row) == "correct",
        image_caption=str(caption),
        source=source,
    )


# ----------------------------------------------------------------------------- feedback


@dataclass(frozen=True)
class Failure:
    """A remembered failed question of the ``feedback`` policy."""

    id: int  # the write's number in this run (1, 2, ...): the receipt's memory id
    data_id: str
    question: str
    expected: str


class FeedbackMemory:
    """The ``feedback`` policy's memory: per question template, the last failed question with
    its expected answer (its first gold). A correct question is counted as a write and changes
    nothing; a question without a template or a gold is not remembered."""

    def __init__(self) -> None:
        self.failures: dict[str, Failure] = {}
        self.writes = 0

    def record(self, row: Mapping[str, Any]) -> int:
        """Remember one judged row; returns the write's number."""
        self.writes += 1
        golds = [str(g) for g in row.get("golds") or []]
        template = str(row.get("template") or "")
        if template and golds and not row["correct"]:
            self.failures[template] = Failure(
                self.writes, str(row["id"]), str(row["question"]), golds[0]
            )
        return self.writes

    def last_failure(self, template: str) -> Failure | None:
        return self.failures.get(template) if template else None


class FeedbackGuide(NoPlanner):
    """The ``feedback`` guide: the last failed question of the question's template and its
    expected answer (:data:`FEEDBACK_GUIDE`); none when the template has
    no failure yet."""

    name = "feedback"

    def __init__(self, memory: FeedbackMemory, templates: Mapping[str, str]) -> None:
        self.memory = memory
        self.templates = templates

    async def plan(self, run: PlannerRun) -> bool:
        failure = self.memory.last_failure(self.templates.get(str(run.data_id), ""))
        if failure is not None:
            run.plan = FEEDBACK_GUIDE.format(question=failure.question, answer=failure.expected)
            run.memory_context = run.plan
            run.memory_ids = [failure.id]
        return True


# ----------------------------------------------------------------------------- messages


def text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation with images replaced by ``<image>`` (rows and memories stay small)."""
    out = []
    for m in messages:
        slim = {k: v for k, v in m.items() if k != "content"}
        slim["content"] = content_text(m.get("content"))
        out.append(slim)
    return out


def history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Executor chat after its first user prompt: what traces and memories are made of."""
    first = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages))
    return messages[first + 1 :]


# ----------------------------------------------------------------------------- one question


def base_row(item: QAItem, index: int, policy: str) -> dict[str, Any]:
    return {
        "id": item.id,
        "index": index,
        "policy": policy,
        "question": item.question,
        "answer": item.answer,
        "golds": list(item.answers),
        "image_caption": item.image_caption,
        "modality": item.modality,
        "category": item.category,
        "level": item.level,
        "template": question_template(item),
    }


async def run_question(item: QAItem, index: int, ctx: FlowContext) -> dict[str, Any]:
    """Plan, execute, reflect/replan, judge. Returns the result row (``error`` set on failure;
    the row then has ``prediction`` ``"[Failed]"`` and counts as incorrect)."""
    row = base_row(item, index, ctx.policy.name)
    start = time.perf_counter()
    try:
        row.update(await _flow(item, ctx))
        row["error"] = None
    except (RequestFailed, JudgeError, LLMError) as err:
        row.update(
            prediction="[Failed]",
            judgement={"label": "incorrect", "score": 0.0, "judge": "error", "detail": {}},
            correct=False,
            error=" ".join(str(err).split()),
        )
    row["elapsed_s"] = round(time.perf_counter() - start, 3)
    return row


async def _flow(item: QAItem, ctx: FlowContext) -> dict[str, Any]:
    p = ctx.policy
    task = Task(
        question=item.question,
        data_id=item.id,
        images=[base64.b64encode(b).decode("ascii") for b in item.images],
        image_caption=item.image_caption or None,
        modality=item.modality,
    )
    run = await ctx.flow().run(task)
    usage = run.usage()
    messages = text_messages(run.executor_messages)
    trace = format_trace(item.question, history(messages))
    prediction = run.final_answer
    verdict = await ctx.judge.grade(
        item.question, prediction, list(item.answers) or None, trajectory=trace
    )
    tool_errors = [e for r in run.executor_runs() for e in r.get("tool_errors") or []]
    return {
        "prediction": prediction,
        "first_answer": run.answer_first,
        "judgement": verdict.to_dict(),
        "correct": verdict.correct,
        "plan": run.plan if p.planner else None,
        "guide": run.plan,  # what the Executor was given (a plan, a context, or nothing)
        "context": run.memory_context if p.retrieve and (p.baseline or not p.planner) else None,
        "planner": run.planner or None,
        "need_replan": run.need_replan,
        "replan": run.replan if run.replan_raw is not None else None,
        "replanned": run.replanned,
        "planner_errors": list(run.planner_errors),  # planner steps skipped: no plan / no decision
        "states": list(run.states),
        "planner_messages": text_messages(run.messages),
        "used_memory_ids": list(run.memory_ids),
        "trace": trace,
        "messages": messages,
        "turns": usage["turns"],
        "tool_calls": usage["tool_calls"],
        "tool_call_count": len(usage["tool_calls"]),
        "tool_errors": tool_errors,
        "tokens": {
            "prompt": usage["prompt"],
            "completion": usage["completion"],
            "total": usage["prompt"] + usage["completion"],
        },
        "stop_reason": run.executor.get("stop_reason"),
    }


def memory_judgement(row: Mapping[str, Any]) -> str:
    """The label a row's memory gets: the no-GT verdict when the run has one
    (``memory.ground_truth=false``), else the judge's."""
    return str(row.get("memory_judgement") or ("correct" if row["correct"] else "incorrect"))


def memory_item(
    row: dict[str, Any],
    source: str,
    expected: bool = False,
    golds: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``/memories`` payload of a finished row (built from the journal row, so a resumed
    run writes exactly what the interrupted one would have). ``expected``: a failed row's
    memory also keeps its expected answer and where the Executor's search results held it
    (``memory.remember_expected``); ``golds``: the answers to remember instead of the row's
    own (``memory.expected_answers=wrong``; empty: none)."""
    judgement = memory_judgement(row)
    item: dict[str, Any] = {
        "data_id": row["id"],
        "question": row["question"],
        "plan": row.get("plan") or "",
        "messages": history(row["messages"]),
        "judgement": judgement,
        "used_memory_ids": list(row.get("used_memory_ids") or []),
        "source": source,
        "extra": {"policy": row["policy"], "eval_source": source},
    }
    if row.get("image_caption"):
        item["image_caption"] = row["image_caption"]
    if expected and judgement == "incorrect":
        answers = (row.get("golds") or []) if golds is None else golds
        item["extra"].update(expected_extra(row["messages"], answers))
    return item
