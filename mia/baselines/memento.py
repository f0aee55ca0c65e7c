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
    Retrieval,
    StoreMemory,
    WriteResult,
    caption_line,
    query_text,
)
from mia.baselines.config import MementoConfig
from mia.prompts import manager as manager_text

KIND = "case"
CORRECT_HEADER = "## Correct plans from similar past questions ({n})"
INCORRECT_HEADER = "## Incorrect plans from similar past questions ({n})"


def format_case(i: int, it: Item) -> str:
    d = it.data
    caption = caption_line(d.get("image_caption") or "")
    return (
        f"### Case {i} (reward {d.get('reward', 0)})\nQuestion: {d.get('question', '')}{caption}\n"
        f"Plan:\n{d.get('plan', '') or '(no plan)'}"
    )


def section(header: str, cases: list[Item]) -> str:
    if not cases:
        return f"{header.format(n=0)}\n{manager_text.NONE_FOUND}"
    return (
        header.format(n=len(cases))
        + "\n"
        + "\n\n".join(format_case(i, it) for i, it in enumerate(cases, 1))
    )


class MementoMemory(StoreMemory[MementoConfig]):
    name = "memento"
    planner = True
    kinds = (KIND,)

    def show(self, hits: list[Item]) -> Retrieval:
        good = [it for it in hits if it.data.get("reward") == 1]
        bad = [it for it in hits if it.data.get("reward") != 1]
        context = "\n\n".join(
            [
                manager_text.CONTEXT_HEADER,
                section(CORRECT_HEADER, good),
                section(INCORRECT_HEADER, bad),
            ]
        )
        return Retrieval.of(context, good + bad)

    async def write(self, item: Finished) -> WriteResult:
        async with self.store.write_lock:
            vec = await self.embed1(query_text(item.question, item.image_caption))
            with self.transaction(item) as tx:
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
            return tx.result()
