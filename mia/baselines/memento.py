"""Memento ("fine-tuning agents without fine-tuning LLMs"; docs/baselines.md): a case bank
feeding a meta-planner.

- Record: a case (kind ``case``) = question, the plan that was followed (with the
  supplementary plan when there was one) and the reward (1 correct, 0 incorrect).
- Write: append every finished case (no LLM call).
- Retrieve: the ``top_k`` most similar cases, split into correct and incorrect plans, laid out
  like MIA's memories (successes, then failures) with the plan where MIA shows a workflow; the
  Planner (the meta-planner) reads them and writes the plan, as in the reference's port.
"""

from __future__ import annotations

from mia.baselines.base import (
    Finished,
    Item,
    ItemStore,
    LLMCaller,
    Retrieval,
    StoreMemory,
    WriteResult,
    query_text,
    unique,
)
from mia.baselines.config import MementoConfig
from mia.prompts import manager as M

KIND = "case"
CORRECT_HEADER = "## Correct plans from similar past questions ({n})"
INCORRECT_HEADER = "## Incorrect plans from similar past questions ({n})"


def format_case(i: int, it: Item) -> str:
    d = it.data
    caption = f"\nImage caption: {d['image_caption']}" if d.get("image_caption") else ""
    return (
        f"### Case {i} (reward {d.get('reward', 0)})\nQuestion: {d.get('question', '')}{caption}\n"
        f"Plan:\n{d.get('plan', '') or '(no plan)'}"
    )


def section(header: str, cases: list[Item]) -> str:
    if not cases:
        return f"{header.format(n=0)}\n{M.NONE_FOUND}"
    return (
        header.format(n=len(cases))
        + "\n"
        + "\n\n".join(format_case(i, it) for i, it in enumerate(cases, 1))
    )


class MementoMemory(StoreMemory):
    name = "memento"
    planner = True
    kinds = (KIND,)

    def __init__(
        self, store: ItemStore, llm: LLMCaller, cfg: MementoConfig, trace_max_chars: int = 4000
    ) -> None:
        super().__init__(store, llm, trace_max_chars)
        self.cfg = cfg

    async def retrieve(self, question: str, image_caption: str = "") -> Retrieval:
        vec = await self.embed1(query_text(question, image_caption))
        hits = [it for it, _ in self.store.search(KIND, vec, self.cfg.top_k)]
        if not hits:
            return Retrieval("")
        good = [it for it in hits if it.data.get("reward") == 1]
        bad = [it for it in hits if it.data.get("reward") != 1]
        context = "\n\n".join(
            [M.CONTEXT_HEADER, section(CORRECT_HEADER, good), section(INCORRECT_HEADER, bad)]
        )
        shown = good + bad
        return Retrieval(context, [it.id for it in shown], unique(it.origin for it in shown))

    async def write(self, item: Finished) -> WriteResult:
        async with self.store.write_lock:
            vec = await self.embed1(query_text(item.question, item.image_caption))
            with self.store.transaction(item) as tx:
                tx.add(
                    KIND,
                    query_text(item.question, item.image_caption),
                    vec,
                    {
                        "data_id": item.data_id,
                        "question": item.question,
                        "image_caption": item.image_caption,
                        "plan": item.plan,
                        "reward": 1 if item.correct else 0,
                    },
                )
                tx.count("ADD")
            return WriteResult(tx.write_id, dict(tx.ops), 0)
