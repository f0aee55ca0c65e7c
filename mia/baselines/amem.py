"""A-Mem (arXiv 2502.12110; docs/baselines.md): agentic notes that link and evolve.

- Record: a note (kind ``note``): content (the question, outcome, answer and the trace), LLM
  written ``keywords``, ``tags`` and a one-line ``context``, ``links`` (ids of other notes) and a
  retrieval count. Its embedding covers content, context, keywords and tags.
- Write: the LLM analyses the new content (keywords, context, tags; JSON; a junk reply gives
  A-Mem's defaults: no keywords or tags, context "General"). The ``neighbours_k`` nearest notes
  are fetched and the LLM decides on evolution: ``strengthen`` (link the new note to the chosen
  neighbours and replace its tags by ``tags_to_update``) and/or ``update_neighbor`` (rewrite
  each neighbour's context and tags from ``new_context_neighborhood`` /
  ``new_tags_neighborhood``, in neighbour order; the neighbour is re-embedded). No dedup.
- Retrieve: cosine similarity with the question, top ``top_k`` notes, plus the linked notes of
  each hit (A-Mem's neighbourhood expansion).
"""

from __future__ import annotations

from typing import Any

from mia.baselines.base import (
    Finished,
    Item,
    Retrieval,
    StoreMemory,
    WriteResult,
    caption_line,
    str_list,
)
from mia.baselines.config import AMemConfig

KIND = "note"
DEFAULT_CONTEXT = "General"

ANALYSE_PROMPT = """Analyse the note below and reply with JSON only:
{{"keywords": [several key terms: names, places, concepts, most important first], \
"context": "one sentence: the topic, the main point and what the note is for", \
"tags": [several broad categories for classifying the note]}}

Note:
{content}"""

EVOLVE_PROMPT = """You are an agentic memory manager. A new note is being added; decide \
whether it should evolve the memory.

New note:
context: {context}
keywords: {keywords}
content: {content}

Its nearest notes (index: content, context, keywords, tags):
{neighbours}

Decide:
1. should_evolve: true when the new note relates to these notes;
2. actions: "strengthen" (link the new note to some neighbours and set its tags) and/or \
"update_neighbor" (rewrite the neighbours' context and tags in light of the new note).
Reply with JSON only:
{{"should_evolve": true, "actions": ["strengthen", "update_neighbor"], \
"suggested_connections": [neighbour indices], "tags_to_update": [tags of the new note], \
"new_context_neighborhood": [one new context per neighbour, in order], \
"new_tags_neighborhood": [[new tags of neighbour 0], [new tags of neighbour 1]]}}"""

CONTEXT_HEADER = "# Notes from earlier questions"


def note_content(item: Finished, trace: str) -> str:
    return (
        f"Question: {item.question}{caption_line(item.image_caption)}\nOutcome: {item.outcome}\n"
        f"Final answer: {item.answer}\nTrace:\n{trace}"
    )


def embed_text(content: str, data: dict[str, Any]) -> str:
    """What a note is embedded as (A-Mem's enriched document)."""
    return "\n".join(
        [
            content,
            f"context: {data.get('context', '')}",
            f"keywords: {', '.join(data.get('keywords', []))}",
            f"tags: {', '.join(data.get('tags', []))}",
        ]
    )


def format_note(item: Item) -> str:
    d = item.data
    return (
        f"## Note {item.id}\n{item.text}\ncontext: {d.get('context', '')}\n"
        f"keywords: {', '.join(d.get('keywords', []))}\ntags: {', '.join(d.get('tags', []))}"
    )


class AMemMemory(StoreMemory[AMemConfig]):
    name = "amem"
    planner = False
    kinds = (KIND,)

    def show(self, hits: list[Item]) -> Retrieval:
        shown = list(hits)
        if self.cfg.follow_links:
            linked = 0
            for it in hits:
                for link in it.data.get("links", []):
                    if linked >= self.cfg.max_linked or any(s.id == link for s in shown):
                        continue
                    note = self.store.get(int(link))
                    if note is not None:
                        shown.append(note)
                        linked += 1
        for it in shown:  # A-Mem counts retrievals (not used for ranking)
            it.data["retrieval_count"] = int(it.data.get("retrieval_count", 0)) + 1
            self.store.con.execute(
                "UPDATE items SET data = json_set(data, '$.retrieval_count', ?) WHERE id = ?",
                (it.data["retrieval_count"], it.id),
            )
        context = "\n\n".join([CONTEXT_HEADER, *(format_note(it) for it in shown)])
        return Retrieval.of(context, shown)

    async def analyse(self, content: str) -> dict[str, Any]:
        reply = await self.llm.json(ANALYSE_PROMPT.format(content=content))
        reply = reply if isinstance(reply, dict) else {}
        context = reply.get("context")
        return {
            "keywords": str_list(reply.get("keywords")),
            "context": context.strip()
            if isinstance(context, str) and context.strip()
            else DEFAULT_CONTEXT,
            "tags": str_list(reply.get("tags")),
        }

    async def write(self, item: Finished) -> WriteResult:
        async with self.store.write_lock:
            junk0 = self.llm.junk
            content = note_content(item, self.trace_text(item))
            data = await self.analyse(content)
            data.update(links=[], retrieval_count=0, data_id=item.data_id)
            vec = await self.embed1(embed_text(content, data))
            neighbours = [it for it, _ in self.store.search(KIND, vec, self.cfg.neighbours_k)]
            evolution: dict[str, Any] = {}
            if neighbours:
                listing = "\n".join(
                    f"{i}: {n.text[:600]} | context: {n.data.get('context', '')} | "
                    f"keywords: {', '.join(n.data.get('keywords', []))} | "
                    f"tags: {', '.join(n.data.get('tags', []))}"
                    for i, n in enumerate(neighbours)
                )
                reply = await self.llm.json(
                    EVOLVE_PROMPT.format(
                        context=data["context"],
                        keywords=", ".join(data["keywords"]),
                        content=content,
                        neighbours=listing,
                    )
                )
                evolution = reply if isinstance(reply, dict) else {}
            edits = self._evolve(data, neighbours, evolution)
            vecs = await self.store.embed([embed_text(n.text, d) for n, d in edits])
            vec = await self.embed1(embed_text(content, data))  # tags may have changed
            with self.transaction(item, self.llm.junk - junk0) as tx:
                tx.add(KIND, content, vec, data)
                tx.count("ADD")
                if data["links"]:
                    tx.count("LINK", len(data["links"]))
                for (n, d), v in zip(edits, vecs, strict=True):
                    tx.update(n.id, data=d, vec=v, origin=False)
                    tx.count("EVOLVE")
            return tx.result()

    def _evolve(
        self, data: dict[str, Any], neighbours: list[Item], evo: dict[str, Any]
    ) -> list[tuple[Item, dict[str, Any]]]:
        """Apply the evolution decision to the new note's ``data``; the neighbours to rewrite."""
        if not evo.get("should_evolve") or not neighbours:
            return []
        actions = {a.lower() for a in str_list(evo.get("actions"))}
        if "strengthen" in actions:
            for idx in evo.get("suggested_connections") or []:
                try:
                    i = int(idx)
                except (TypeError, ValueError):
                    continue
                if 0 <= i < len(neighbours) and neighbours[i].id not in data["links"]:
                    data["links"].append(neighbours[i].id)
            tags = str_list(evo.get("tags_to_update"))
            if tags:
                data["tags"] = tags
        edits: list[tuple[Item, dict[str, Any]]] = []
        if "update_neighbor" in actions:
            contexts = evo.get("new_context_neighborhood") or []
            tag_lists = evo.get("new_tags_neighborhood") or []
            for i, n in enumerate(neighbours):
                d = dict(n.data)
                changed = False
                if i < len(contexts) and isinstance(contexts[i], str) and contexts[i].strip():
                    d["context"] = contexts[i].strip()
                    changed = True
                if i < len(tag_lists) and str_list(tag_lists[i]):
                    d["tags"] = str_list(tag_lists[i])
                    changed = True
                if changed and d != n.data:
                    edits.append((n, d))
        return edits
