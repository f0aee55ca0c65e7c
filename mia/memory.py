"""MIA's memory from any agent, in three calls: ``plan``, ``record``, ``search`` (and
``feedback`` for tasks that went through the proxy).

A thin, synchronous face over :class:`mia.services.memory.MemoryClient` (memory_serve's one
client, called through its blocking wrapper ``MemoryClient.sync``) for agents that prefer
calls over the OpenAI-compatible proxy (docs/proxy.md)::

    from mia.memory import Client

    with Client("http://127.0.0.1:5000", token=None) as memory:
        plan = memory.plan("Where is the Eiffel Tower?")      # memories -> the Planner's plan
        ...  # the agent works, guided by plan.text
        memory.record("Where is the Eiffel Tower?", correct=True, plan=plan, messages=chat)
        hits = memory.search("Where is the Eiffel Tower located?")   # what would be retrieved

``record`` credits the memories the plan was built from (their win-rate), so memories that keep
leading to failures sink in retrieval. Errors raise :class:`mia.services.ServiceError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mia.services.base import RequestFailed
from mia.services.memory import MemoryClient, MemoryResponse, ScoredMemory, WriteOutcome

__all__ = ["Client", "Hit", "Plan", "Recorded", "Search"]


@dataclass(frozen=True)
class Plan:
    text: str  # the plan (what to follow)
    memory_ids: list[int]  # the memories it was built from (credited by ``record``)
    context: str  # the memory block the Planner read
    planner: str  # "planner", or "manager" on a cold start (few memories yet)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the planning conversation


@dataclass(frozen=True)
class Recorded:
    action: str  # inserted | replaced | kept_existing (a duplicate that did not win)
    id: int  # the memory that stands for this task
    credited_ids: list[int]  # memories whose win-rate this outcome moved


@dataclass(frozen=True)
class Hit:
    id: int
    question: str
    workflow_summary: str
    judgement: str
    similarity: float  # raw mixed cosine
    normalised: float  # min-max normalised over the bucket
    win_rate: float
    score: float  # the ranking score


@dataclass(frozen=True)
class Search:
    positives: list[Hit]  # successes, best first
    negatives: list[Hit]  # failures, best first
    context: str  # the block the Planner would read
    bucket_size: int


def _hit(s: ScoredMemory) -> Hit:
    return Hit(
        id=s.id,
        question=s.question,
        workflow_summary=s.workflow_summary,
        judgement=s.judgement,
        similarity=s.similarity,
        normalised=s.normalised,
        win_rate=s.win_rate,
        score=s.score,
    )


def _recorded(out: WriteOutcome) -> Recorded:
    return Recorded(action=out.action, id=out.id, credited_ids=list(out.credited_ids))


class Client:
    """memory_serve at ``url`` (bearer ``token`` if it has one). ``service``: the async
    :class:`MemoryClient` underneath (its every route, typed; ``service.sync`` for blocking
    calls)."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:5000",
        *,
        token: str | None = None,
        timeout_s: float = 600,
    ) -> None:
        self.service = MemoryClient(url, token=token, timeout_s=timeout_s)

    def plan(
        self,
        question: str,
        *,
        image_caption: str | None = None,
        top_k: int | None = None,
    ) -> Plan:
        """Retrieve memories for ``question`` and have the Planner write a plan from them."""
        out = self.service.sync.plan(question, image_caption=image_caption, top_k=top_k)
        return Plan(
            text=out.plan,
            memory_ids=list(out.memory_ids),
            context=out.context,
            planner=out.planner,
            messages=out.messages,
        )

    def record(
        self,
        question: str,
        *,
        correct: bool,
        messages: Sequence[Mapping[str, Any]] = (),
        plan: Plan | str = "",
        used_memory_ids: Sequence[int] | None = None,
        summary: str | None = None,
        image_caption: str | None = None,
        data_id: str = "",
        source: str = "client",
    ) -> Recorded:
        """Remember a finished task. ``messages``: the agent's conversation after the task's
        first prompt (OpenAI format; the Manager summarises it into a workflow) or ``summary``:
        a workflow written by the caller. ``plan``: the :class:`Plan` it followed (its memories
        are credited) or a plan text; ``used_memory_ids`` overrides which memories to credit."""
        ids = used_memory_ids
        if ids is None:
            ids = plan.memory_ids if isinstance(plan, Plan) else []
        item: dict[str, Any] = {
            "question": question,
            "judgement": "correct" if correct else "incorrect",
            "messages": [dict(m) for m in messages],
            "plan": plan.text if isinstance(plan, Plan) else plan,
            "used_memory_ids": [int(i) for i in ids],
            "data_id": data_id,
            "source": source,
        }
        if summary is not None:
            item["workflow_summary"] = summary
        if image_caption:
            item["image_caption"] = image_caption
        return _recorded(self.service.sync.save_memories([item]).results[0])

    def feedback(
        self,
        task_id: str | None = None,
        *,
        correct: bool,
        completion_id: str | None = None,
        feedback: str | None = None,
    ) -> Recorded:
        """The outcome of a task run through the proxy, named by its ``X-MIA-Task-Id`` header
        (``task_id``) or a completion's ``id`` (``completion_id``): the proxy writes that
        conversation to memory, once, crediting the memories its plan came from."""
        out = self.service.sync.feedback(
            task_id, completion_id=completion_id, correct=correct, feedback=feedback
        )
        return _recorded(out.result)

    def search(
        self, question: str, *, image_caption: str | None = None, top_k: int | None = None
    ) -> Search:
        """What would be retrieved for ``question``, with the numbers that ranked it."""
        out: MemoryResponse = self.service.sync.explain(
            question, image_caption=image_caption, top_k=top_k
        )
        x = out.explain
        if x is None:  # an /explain-less answer: not this service
            raise RequestFailed("memory_serve /memory: the answer has no explain")
        return Search(
            positives=[_hit(s) for s in x.positives],
            negatives=[_hit(s) for s in x.negatives],
            context=out.context,
            bucket_size=x.bucket_size,
        )

    def memories(
        self,
        *,
        query: str = "",
        judgement: str | None = None,
        offset: int = 0,
        limit: int = 50,
        sort: str = "newest",
    ) -> dict[str, Any]:
        """One page of the store: ``{total, offset, limit, memories: [...]}``."""
        page = self.service.sync.list_memories(
            q=query or None, judgement=judgement, offset=offset, limit=limit, sort=sort
        )
        return page.model_dump(mode="json")

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
