"""ExpeL (arXiv 2308.10144; docs/baselines.md): an insight list plus successful examples.

Two stores: the experience pool (kind ``trajectory``: every finished attempt, success or
failure) and the insight list (kind ``insight``: natural-language rules with an importance
count, at most ``max_insights``).

- Write: the attempt joins the pool. Then it is contrasted with earlier attempts: a failure
  with the ``compare_k`` most similar successes, a success with the most similar failures, or,
  when there are none, with the most similar successes (ExpeL's success-list comparison). The
  LLM edits the insight list with ADD (importance ``new_importance``), EDIT (text replaced,
  +1), UPVOTE (+1) and DOWNVOTE (-1; an insight at 0 is removed). ADD is refused when the list
  is full. Replies are JSON, or ExpeL's own ``ADD: ...`` / ``EDIT 2: ...`` / ``AGREE 1`` /
  ``REMOVE 3`` lines; anything else is a no-op (counted).
- Retrieve: every insight (most important first), plus the ``examples_k`` most task-similar
  successful trajectories as examples; the text goes to the Planner.
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
    cut,
    parse_json,
    query_text,
)
from mia.baselines.config import ExpelConfig

TRAJ = "trajectory"
INSIGHT = "insight"
OPS = ("ADD", "EDIT", "UPVOTE", "DOWNVOTE")
ALIASES = {"AGREE": "UPVOTE", "REMOVE": "DOWNVOTE"}

CONTRAST_PROMPT = """You improve a list of general insights for a research agent that answers \
questions with search tools. Compare the attempts below ({kind}) and find what made the \
difference.

{attempts}

Current insights (number: rule):
{rules}

Edit the list with these operations:
- ADD: a new general rule{full}
- EDIT n: rewrite rule n (give the new text)
- UPVOTE n: rule n is confirmed by these attempts
- DOWNVOTE n: rule n is wrong or useless
Rules must be general (no question-specific names). Reply with JSON only:
{{"operations": [{{"op": "ADD", "text": "..."}}, {{"op": "EDIT", "id": 1, "text": "..."}}, \
{{"op": "UPVOTE", "id": 2}}, {{"op": "DOWNVOTE", "id": 3}}]}}"""

INSIGHTS_HEADER = "# Insights from earlier questions"
EXAMPLES_HEADER = "# Successful attempts at similar questions"
_LINE = re.compile(
    r"^\s*[-*\d.)\s]*(ADD|EDIT|UPVOTE|DOWNVOTE|AGREE|REMOVE)\b\s*(\d+)?\s*[:.-]?\s*(.*)$", re.I
)


def parse_ops(reply: Any, text: str) -> list[dict[str, Any]] | None:
    """Operations from a JSON reply, else from ExpeL's text lines; None when there are none."""
    ops = reply.get("operations") if isinstance(reply, dict) else reply
    if isinstance(ops, list):
        return [o for o in ops if isinstance(o, dict)]
    found = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            found.append({"op": m.group(1).upper(), "id": m.group(2), "text": m.group(3).strip()})
    return found or None


def format_attempt(label: str, it: Item, trace_max_chars: int) -> str:
    d = it.data
    return (
        f"## {label} ({'success' if d.get('correct') else 'failure'})\n"
        f"Question: {d.get('question', '')}\nPlan: {d.get('plan', '') or '(none)'}\n"
        f"Final answer: {d.get('answer', '')}\nTrace:\n{cut(str(d.get('trace', '')), trace_max_chars)}"
    )


class ExpelMemory(StoreMemory[ExpelConfig]):
    name = "expel"
    planner = True
    kinds = (TRAJ, INSIGHT)

    def insights(self) -> list[Item]:
        """The insight list, most important first (then oldest)."""
        return sorted(
            self.store.items(INSIGHT), key=lambda it: (-int(it.data.get("importance", 0)), it.id)
        )

    async def retrieve(self, question: str, image_caption: str = "") -> Retrieval:
        rules = self.insights()
        examples = []
        if self.cfg.examples_k:
            examples = await self.nearest(
                TRAJ,
                question,
                image_caption,
                self.cfg.examples_k,
                where=lambda it: bool(it.data.get("correct")),
            )
        if not rules and not examples:
            return Retrieval("")
        parts = []
        if rules:
            parts.append(
                "\n".join([INSIGHTS_HEADER, *(f"{i}. {r.text}" for i, r in enumerate(rules, 1))])
            )
        if examples:
            blocks = [
                format_attempt(f"Example {i}", it, self.trace_max_chars)
                for i, it in enumerate(examples, 1)
            ]
            parts.append("\n\n".join([EXAMPLES_HEADER, *blocks]))
        return Retrieval.of("\n\n".join(parts), rules + examples)

    def _compare_with(self, item: Finished, vec: Any) -> tuple[str, list[Item]]:
        k = self.cfg.compare_k
        ok = lambda it: bool(it.data.get("correct"))  # noqa: E731
        if item.correct:
            fails = self.store.search(TRAJ, vec, k, where=lambda it: not ok(it))
            if fails:
                return "a success against similar failures", [it for it, _ in fails]
            succ = self.store.search(TRAJ, vec, k, where=ok)
            return "successes at similar questions", [it for it, _ in succ]
        succ = self.store.search(TRAJ, vec, k, where=ok)
        return "a failure against similar successes", [it for it, _ in succ]

    async def write(self, item: Finished) -> WriteResult:
        async with self.store.write_lock:
            junk0 = self.llm.junk
            vec = await self.embed1(query_text(item.question, item.image_caption))
            kind, others = self._compare_with(item, vec)
            rules = self.insights()
            ops: list[dict[str, Any]] = []
            if others or item.correct:
                data = self._traj_data(item)
                current = Item(0, TRAJ, "", data, 0, 0.0, 0.0)
                attempts = [format_attempt("Current attempt", current, self.trace_max_chars)]
                attempts += [
                    format_attempt(f"Earlier attempt {i}", it, self.trace_max_chars)
                    for i, it in enumerate(others, 1)
                ]
                full = len(rules) >= self.cfg.max_insights
                text = await self.llm.text(
                    CONTRAST_PROMPT.format(
                        kind=kind,
                        attempts="\n\n".join(attempts),
                        rules="\n".join(f"{i}: {r.text}" for i, r in enumerate(rules, 1))
                        or "(none yet)",
                        full=" (NOT allowed now: the list is full)" if full else "",
                    )
                )
                parsed = parse_ops(parse_json(text), text)
                if parsed is None:
                    self.llm.junk += 1
                ops = parsed or []
            texts, vec_of = await self.embed_texts(ops)
            with self.transaction(item, self.llm.junk - junk0) as tx:
                tx.add(
                    TRAJ, query_text(item.question, item.image_caption), vec, self._traj_data(item)
                )
                self._apply(tx, rules, ops, texts, vec_of)
            return tx.result()

    def _traj_data(self, item: Finished) -> dict[str, Any]:
        return {
            "data_id": item.data_id,
            "question": item.question,
            "image_caption": item.image_caption,
            "plan": item.plan,
            "trace": item.trace,
            "answer": item.answer,
            "correct": item.correct,
        }

    def _apply(
        self,
        tx: Any,
        rules: list[Item],
        ops: list[dict[str, Any]],
        texts: list[str],
        vec_of: dict[str, Any],
    ) -> None:
        votes = {r.id: int(r.data.get("importance", 0)) for r in rules}
        gone: set[int] = set()
        size = len(rules)
        if not ops:
            tx.count("NOOP")
        for o, text in zip(ops, texts, strict=True):
            op = str(o.get("op") or o.get("operation") or "").upper()
            op = ALIASES.get(op, op)
            target = None
            try:
                n = int(o.get("id"))  # type: ignore[arg-type]
                if 1 <= n <= len(rules) and rules[n - 1].id not in gone:
                    target = rules[n - 1]
            except (TypeError, ValueError):
                pass
            if op == "ADD" and text:
                if size >= self.cfg.max_insights:
                    tx.count("refused")
                    continue
                tx.add(INSIGHT, text, vec_of[text], {"importance": self.cfg.new_importance})
                size += 1
                tx.count("ADD")
            elif op == "EDIT" and target is not None and text:
                votes[target.id] += 1
                tx.update(
                    target.id, text=text, vec=vec_of[text], data={"importance": votes[target.id]}
                )
                tx.count("EDIT")
            elif op in ("UPVOTE", "DOWNVOTE") and target is not None:
                votes[target.id] += 1 if op == "UPVOTE" else -1
                if votes[target.id] <= 0:
                    tx.delete(target.id)
                    gone.add(target.id)
                    size -= 1
                    tx.count("REMOVED")
                else:
                    tx.update(target.id, data={"importance": votes[target.id]}, origin=False)
                tx.count(op)
            else:
                tx.count("invalid")
