"""ReasoningBank (arXiv 2509.25140; docs/baselines.md): strategy items from successes and
failures.

- Record: a strategy item (kind ``strategy``): title, one-line description, content, and the
  question it was distilled from (items are found by that question, as the paper indexes
  items by their task query).
- Write: the LLM distils at most ``max_items`` items from the trajectory, with one prompt for a
  success (what made it work) and another for a failure (what went wrong and how to avoid it),
  so failures teach too. JSON replies, or the paper's Markdown layout (``# Memory Item``,
  ``## Title``, ``## Description``, ``## Content``); anything else stores nothing (counted).
  Append only (the paper's minimal consolidation). The outcome is the harness's judge verdict.
- Retrieve: cosine similarity between the question and the items' questions, top ``top_k``.
"""

from __future__ import annotations

import re
from typing import Any

from mia.baselines.base import (
    Finished,
    Item,
    Retrieval,
    StoreMemory,
    WriteResult,
    caption_line,
    parse_json,
    query_text,
)
from mia.baselines.config import ReasoningBankConfig

KIND = "strategy"


def _distil_prompt(task: str, item: str) -> str:
    """A distillation prompt (``str.format`` fields: n, question, caption, answer, trace): the
    ``task``, the question with the agent's answer and trace, and the JSON reply asked for,
    whose items are each one ``item``."""
    return (
        "A research agent answered the question below with search tools, and its answer was "
        "judged " + task + "\n\nQuestion: {question}{caption}\nFinal answer: {answer}\nTrace:\n"
        "{trace}\n\n"
        'Reply with JSON only: {{"items": [{{"title": "short name of the ' + item + '", '
        '"description": "one sentence summary", "content": "1-3 sentences: the ' + item + " itself"
        '"}}]}}'
    )


SUCCESS_PROMPT = _distil_prompt(
    "CORRECT. Think about why it succeeded, then distil at most {n} reusable reasoning "
    "strategies (general, not tied to this question's names) that would help on similar tasks.",
    "strategy",
)
FAILURE_PROMPT = _distil_prompt(
    "INCORRECT. Reflect on why it failed, then distil at most {n} lessons (general, not tied "
    "to this question's names): pitfalls to avoid and what to do instead on similar tasks.",
    "lesson",
)

CONTEXT_HEADER = "# Strategies learned from earlier questions"
_MD_ITEM = re.compile(r"^#\s*Memory Item.*$", re.M | re.I)
_MD_FIELD = re.compile(r"^##\s*(Title|Description|Content)\s*:?\s*(.*)$", re.I)


def parse_items(text: str) -> list[dict[str, str]] | None:
    """Items from a JSON reply or the paper's Markdown layout; None when there are none."""
    reply: Any = parse_json(text)
    raw = reply.get("items") if isinstance(reply, dict) else reply
    items = []
    if isinstance(raw, list):
        for r in raw:
            if isinstance(r, dict):
                items.append(
                    {k: str(r.get(k) or "").strip() for k in ("title", "description", "content")}
                )
    else:
        for block in _MD_ITEM.split(text)[1:]:
            item = {"title": "", "description": "", "content": ""}
            key = None
            for line in block.splitlines():
                m = _MD_FIELD.match(line.strip())
                if m:
                    key = m.group(1).lower()
                    item[key] = m.group(2).strip()
                elif key and line.strip():
                    item[key] = (item[key] + " " + line.strip()).strip()
            items.append(item)
    items = [it for it in items if it["title"] and it["content"]]
    return items or None


class ReasoningBankMemory(StoreMemory[ReasoningBankConfig]):
    name = "reasoningbank"
    planner = False
    kinds = (KIND,)

    def show(self, hits: list[Item]) -> Retrieval:
        blocks = [
            f"## {it.data['title']}\n{it.data['description']}\n{it.data['content']}" for it in hits
        ]
        return Retrieval.of("\n\n".join([CONTEXT_HEADER, *blocks]), hits)

    async def write(self, item: Finished) -> WriteResult:
        async with self.store.write_lock:
            prompt = SUCCESS_PROMPT if item.correct else FAILURE_PROMPT
            text = await self.llm.text(
                prompt.format(
                    n=self.cfg.max_items,
                    question=item.question,
                    caption=caption_line(item.image_caption),
                    answer=item.answer,
                    trace=self.trace_text(item),
                )
            )
            items = parse_items(text)
            junk = 0
            if items is None:
                self.llm.junk += 1
                junk = 1
            query = query_text(item.question, item.image_caption)
            vec = await self.embed1(query)
            with self.transaction(item, junk) as tx:
                if junk:
                    tx.count("NOOP")
                for it in (items or [])[: self.cfg.max_items]:
                    data: dict[str, Any] = {
                        **it,
                        "question": query,
                        "data_id": item.data_id,
                        "from": item.outcome,
                    }
                    tx.add(KIND, it["title"], vec, data)
                    tx.count("ADD")
            return tx.result()
