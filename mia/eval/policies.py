"""Memory policies of ``mia eval``: which Planner the one flow (:mod:`mia.planner.flow`) runs.

| policy      | plan                               | reflection + replan | memory written        |
|-------------|------------------------------------|---------------------|-----------------------|
| `none`      | none: the Executor alone           | no                  | no                    |
| `plan_only` | Planner with no memories (top_k 0) | yes                 | no                    |
| `mia`       | Planner with retrieved workflows   | yes                 | LLM-compressed trace  |
| `rag`       | none: the retrieved context itself | no                  | raw trace (identity)  |

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
import time
from dataclasses import dataclass
from typing import Any

from mia.data.formats import QAItem
from mia.judge import Judge, JudgeError
from mia.planner.flow import FlowConfig, Planner, PlannerFlow, Task
from mia.planner.planners import GuidePlanner, NoPlanner, RemotePlanner
from mia.services import ExecutorClient, MemoryClient, RequestFailed
from mia.trace import content_text, format_trace

POLICIES = ("none", "plan_only", "mia", "rag")


@dataclass(frozen=True)
class PolicySpec:
    name: str
    planner: bool  # /plan, /judge_replan, /replan
    retrieve: bool  # memories are retrieved for each question
    writes: bool  # finished trajectories are written to memory
    compress_modes: tuple[str, ...] | None  # memory_serve compress.mode(s) it needs (None: any)
    summary: str

    @property
    def needs_memory(self) -> bool:
        return self.planner or self.retrieve or self.writes


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
    reflect: bool = True

    def planner(self) -> Planner:
        p = self.policy
        if p.planner:
            assert self.memory is not None
            top_k = self.top_k if p.retrieve else 0
            return RemotePlanner(self.memory, top_k, self.replan_top_k, skip_empty=True)
        if p.retrieve:
            assert self.memory is not None
            return GuidePlanner(self.memory, self.top_k)
        return NoPlanner()

    def flow(self) -> PlannerFlow:
        return PlannerFlow(self.planner(), self.serve, FlowConfig(reflect=self.reflect))


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
    }


async def run_question(item: QAItem, index: int, ctx: FlowContext) -> dict[str, Any]:
    """Plan, execute, reflect/replan, judge. Returns the result row (``error`` set on failure;
    the row then has ``prediction`` ``"[Failed]"`` and counts as incorrect)."""
    row = base_row(item, index, ctx.policy.name)
    start = time.perf_counter()
    try:
        row.update(await _flow(item, ctx))
        row["error"] = None
    except (RequestFailed, JudgeError) as err:
        row.update(
            prediction="[Failed]",
            judgement={"label": "incorrect", "score": 0.0, "judge": "error", "detail": {}},
            correct=False,
            error=" ".join(str(err).split()),
        )
    row["elapsed_s"] = round(time.perf_counter() - start, 3)
    return row


async def _planner(
    ctx: FlowContext, path: str, payload: dict[str, Any], errors: list[str]
) -> dict[str, Any] | None:
    """A planner route's answer, or None when the planner LLM gave nothing usable (502
    ``llm_empty``: no plan, no yes/no): the step is skipped and the reason recorded in
    ``errors`` (retrying a greedy model would not help). Other failures fail the question."""
    assert ctx.memory is not None
    try:
        return await ctx.memory.post(path, payload)
    except RequestFailed as err:
        if err.code != "llm_empty":
            raise
        errors.append(" ".join(str(err).split()))
        return None


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
        "context": run.memory_context if p.retrieve and not p.planner else None,
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


def memory_item(row: dict[str, Any], source: str) -> dict[str, Any]:
    """The ``/memories`` payload of a finished row (built from the journal row, so a resumed
    run writes exactly what the interrupted one would have)."""
    item: dict[str, Any] = {
        "data_id": row["id"],
        "question": row["question"],
        "plan": row.get("plan") or "",
        "messages": history(row["messages"]),
        "judgement": "correct" if row["correct"] else "incorrect",
        "used_memory_ids": list(row.get("used_memory_ids") or []),
        "source": source,
        "extra": {"policy": row["policy"], "eval_source": source},
    }
    if row.get("image_caption"):
        item["image_caption"] = row["image_caption"]
    return item
