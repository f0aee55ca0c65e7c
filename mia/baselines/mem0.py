"""Mem0, the paper's classic pipeline (arXiv 2504.19413; docs/baselines.md).

- Record: one short natural-language fact (kind ``fact``) with a text hash.
- Write: the LLM extracts candidate facts from the finished, judged attempt; the top
  ``similar_k`` existing facts of each candidate are gathered (shown under temporary ids, as
  Mem0 does, so the LLM cannot invent real ids); one update call answers, per fact, ADD (a new
  fact), UPDATE (rewrite an existing fact: its text is replaced), DELETE (remove a contradicted
  fact) or NONE (already known). With no similar fact at all every candidate is added without
  the update call (the only possible answer). Unparsable replies and unknown ids are no-ops,
  counted.
- Retrieve: cosine similarity between the question and the facts, top ``top_k`` above
  ``min_score``, shown as a bullet list.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from mia.baselines.base import (
    Finished,
    Item,
    Retrieval,
    StoreMemory,
    WriteResult,
    caption_line,
    str_list,
    unique,
)
from mia.baselines.config import Mem0Config

KIND = "fact"

EXTRACT_PROMPT = """You keep a memory of facts that help a research agent answer future \
questions. Below is one finished attempt: the question, what the agent did, its final answer \
and whether that answer was judged correct.

Question: {question}{caption}
Final answer: {answer}
Judged: {outcome}
Agent trace:
{trace}

Extract short, self-contained facts worth remembering: entities and how they relate, which \
searches or sources worked, and the answer when it was judged correct (when it was judged \
incorrect, record that this answer is wrong). One fact per string.
Reply with JSON only: {{"facts": ["fact 1", "fact 2"]}} ({{"facts": []}} if nothing is worth \
keeping)."""

UPDATE_PROMPT = """You manage a memory of facts. Compare the new facts with the existing ones \
and decide, for each, one event:
- ADD: the new fact is new information (give its text);
- UPDATE: an existing fact is about the same thing and the new fact completes or corrects it \
(give the existing id and the merged text);
- DELETE: an existing fact is contradicted by the new facts (give its id);
- NONE: the new fact is already known (give the existing id).

Existing facts:
{existing}

New facts:
{new}

Reply with JSON only:
{{"memory": [{{"event": "ADD", "text": "..."}}, {{"event": "UPDATE", "id": "0", "text": "..."}}, \
{{"event": "DELETE", "id": "1"}}, {{"event": "NONE", "id": "2"}}]}}"""

CONTEXT_HEADER = "# Facts remembered from earlier questions"


def fact_hash(text: str) -> str:
    return hashlib.md5(text.strip().lower().encode()).hexdigest()


class Mem0Memory(StoreMemory[Mem0Config]):
    name = "mem0"
    planner = False
    kinds = (KIND,)

    def show(self, hits: list[Item]) -> Retrieval:
        return Retrieval.of("\n".join([CONTEXT_HEADER, *(f"- {it.text}" for it in hits)]), hits)

    async def extract(self, item: Finished) -> list[str]:
        reply = await self.llm.json(
            EXTRACT_PROMPT.format(
                question=item.question,
                caption=caption_line(item.image_caption),
                answer=item.answer,
                outcome=item.outcome,
                trace=self.trace_text(item),
            )
        )
        facts = str_list(reply.get("facts") if isinstance(reply, dict) else reply)
        return unique(facts)[: self.cfg.max_facts]

    async def write(self, item: Finished) -> WriteResult:
        async with self.store.write_lock:
            junk0 = self.llm.junk
            facts = await self.extract(item)
            vecs = await self.store.embed(facts)
            # The existing facts similar to any candidate, under temporary ids "0", "1", ...
            similar: dict[int, Any] = {}
            for v in vecs:
                for it, _ in self.store.search(KIND, v, self.cfg.similar_k):
                    similar.setdefault(it.id, it)
            temp = {str(i): it for i, it in enumerate(similar.values())}
            if not facts:
                events: list[dict[str, Any]] = []
            elif not temp:
                events = [{"event": "ADD", "text": f} for f in facts]
            else:
                existing = [{"id": k, "text": it.text} for k, it in temp.items()]
                reply = await self.llm.json(
                    UPDATE_PROMPT.format(
                        existing=json.dumps(existing, ensure_ascii=False, indent=1),
                        new=json.dumps(facts, ensure_ascii=False),
                    )
                )
                memory = reply.get("memory") if isinstance(reply, dict) else reply
                events = (
                    [e for e in memory if isinstance(e, dict)] if isinstance(memory, list) else []
                )
            texts, vec_of = await self.embed_texts(events)
            with self.transaction(item, self.llm.junk - junk0) as tx:
                if not events:
                    tx.count("NOOP")
                seen_hashes = {it.data.get("hash") for it in self.store.items(KIND)}
                done: set[str] = set()  # an id is edited once per write
                for e, text in zip(events, texts, strict=True):
                    event = str(e.get("event") or "").upper()
                    target = temp.get(str(e.get("id", "")).strip())
                    if event == "ADD" and text:
                        h = fact_hash(text)
                        if h in seen_hashes:  # the exact fact is already stored
                            tx.count("NOOP")
                            continue
                        seen_hashes.add(h)
                        tx.add(KIND, text, vec_of[text], {"hash": h})
                        tx.count("ADD")
                    elif (
                        event == "UPDATE"
                        and target is not None
                        and text
                        and str(target.id) not in done
                    ):
                        done.add(str(target.id))
                        tx.update(
                            target.id, text=text, vec=vec_of[text], data={"hash": fact_hash(text)}
                        )
                        tx.count("UPDATE")
                    elif event == "DELETE" and target is not None and str(target.id) not in done:
                        done.add(str(target.id))
                        tx.delete(target.id)
                        tx.count("DELETE")
                    elif event in ("NONE", "NOOP"):
                        tx.count("NOOP")
                    else:  # unknown event, unknown id or no text: nothing happens
                        tx.count("invalid")
            return tx.result()
