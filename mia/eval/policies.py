"""Memory policies and the per-question flow (REFERENCE §8, "Inference, MIA without TTRL").

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

One question: plan -> ``/execute`` -> (planner policies, when the Executor gave a final reply)
``/judge_replan`` -> if yes ``/replan`` + ``/continue`` (at most once) -> judge. The memory
write is the harness's job (its timing is what ``online`` and ``batched`` orders differ in).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any

from mia.data.formats import QAItem
from mia.eval.clients import RequestFailed, ServiceClient
from mia.judge import Judge, JudgeError
from mia.trace import content_text, format_trace

POLICIES = ("none", "plan_only", "mia", "rag")
FINAL_STOPS = ("answer", "length")  # the Executor ended with a reply the planner can judge


@dataclass(frozen=True)
class PolicySpec:
    name: str
    planner: bool  # /plan, /judge_replan, /replan
    retrieve: bool  # memories are retrieved for each question
    writes: bool  # finished trajectories are written to memory
    compress_mode: str | None  # memory_serve compress.mode this policy needs (None: any)
    summary: str

    @property
    def needs_memory(self) -> bool:
        return self.planner or self.retrieve or self.writes


SPECS: dict[str, PolicySpec] = {
    "none": PolicySpec("none", False, False, False, None, "Executor alone, no plan"),
    "plan_only": PolicySpec(
        "plan_only", True, False, False, None, "planner without memories, nothing stored"
    ),
    "mia": PolicySpec("mia", True, True, True, "llm", "planner + compressed workflow memory"),
    "rag": PolicySpec(
        "rag", False, True, True, "identity", "retrieved raw traces as the guide, no planner"
    ),
}


def spec(name: str) -> PolicySpec:
    return SPECS[name]


@dataclass
class FlowContext:
    """What every question of one policy run shares."""

    policy: PolicySpec
    serve: ServiceClient
    memory: ServiceClient | None
    judge: Judge
    top_k: int | None = None  # None: memory_serve's default
    replan_top_k: int = 0
    reflect: bool = True


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


def _b64(images: list[bytes]) -> list[str] | None:
    return [base64.b64encode(b).decode("ascii") for b in images] or None


def _opt(payload: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is not None:
        payload[key] = value
    return payload


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
    caption = item.image_caption or None
    query: dict[str, Any] = {"question": item.question, "data_id": item.id}
    _opt(query, "image_caption", caption)
    plan, plan_messages, planner = "", None, None
    used: list[int] = []
    context = None
    planner_errors: list[str] = []
    if p.planner:
        req = (
            dict(query, mem_top_k=0)
            if not p.retrieve
            else _opt(dict(query), "mem_top_k", ctx.top_k)
        )
        planned = await _planner(ctx, "/plan", req, planner_errors)
        if planned is not None:  # else the Executor goes without a guide
            plan, plan_messages = planned["plan"], planned["messages"]
            used, planner = list(planned["memory_ids"]), planned["planner"]
    elif p.retrieve:
        assert ctx.memory is not None
        found = await ctx.memory.post("/memory", _opt(dict(query), "mem_top_k", ctx.top_k))
        used = list(found["positive_ids"]) + list(found["negative_ids"])
        # An empty memory gives no guide at all (the first question runs as `none`).
        context = found["context"] if used else ""
        plan = context

    images = _b64(item.images)
    execute = {"question": item.question, "plan": plan, "data_id": item.id}
    _opt(execute, "images", images)
    _opt(execute, "image_caption", caption)
    first = await ctx.serve.post("/execute", execute)
    final = first
    calls = list(first["tool_calls"])
    turns = int(first["turns"])
    prompt_tokens = int(first["usage"]["prompt_tokens"])
    completion_tokens = int(first["usage"]["completion_tokens"])
    need_replan, replan, replanned = None, None, False

    if p.planner and ctx.reflect and plan_messages and first["stop_reason"] in FINAL_STOPS:
        judged = await _planner(
            ctx,
            "/judge_replan",
            {"workflow": first["trace"], "past_messages": plan_messages, "memory_ids": used},
            planner_errors,
        )
        need_replan = None if judged is None else bool(judged["need_replan"])
        if judged is not None and need_replan:
            replanned_req = dict(query, past_messages=judged["messages"])
            replanned_req["mem_top_k"] = ctx.replan_top_k
            revised = await _planner(ctx, "/replan", replanned_req, planner_errors)
            replan = None if revised is None else revised["replan"]
            if replan and replan.strip():
                cont = {
                    "question": item.question,
                    "data_id": item.id,
                    "messages": first["messages"],  # images are inline in the messages
                    "replan": replan,
                }
                final = await ctx.serve.post("/continue", cont)
                replanned = True
                calls += list(final["tool_calls"])
                turns += int(final["turns"])
                prompt_tokens += int(final["usage"]["prompt_tokens"])
                completion_tokens += int(final["usage"]["completion_tokens"])

    messages = text_messages(final["messages"])
    trace = format_trace(item.question, history(messages))
    prediction = final["answer"]
    verdict = await ctx.judge.grade(
        item.question, prediction, list(item.answers) or None, trajectory=trace
    )
    return {
        "prediction": prediction,
        "first_answer": first["answer"],
        "judgement": verdict.to_dict(),
        "correct": verdict.correct,
        "plan": plan if p.planner else None,
        "context": context,
        "planner": planner,
        "need_replan": need_replan,
        "replan": replan,
        "replanned": replanned,
        "planner_errors": planner_errors,  # planner steps skipped: no plan / no decision
        "used_memory_ids": used,
        "trace": trace,
        "messages": messages,
        "turns": turns,
        "tool_calls": calls,
        "tool_call_count": len(calls),
        "tool_errors": list(first["tool_errors"])
        + (list(final["tool_errors"]) if replanned else []),
        "tokens": {
            "prompt": prompt_tokens,
            "completion": completion_tokens,
            "total": prompt_tokens + completion_tokens,
        },
        "stop_reason": final["stop_reason"],
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
