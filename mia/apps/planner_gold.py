"""Gold Planner conversations WITH memories: the data that makes using memory a skill.

The plain gold plan chats (:mod:`mia.apps.gold`) show the Planner an empty memory. Here each
train question also gets a plan prompt whose memory block holds what memory_serve would return
after a few similar questions: positive workflows (similar questions answered correctly) and
negative ones (answered wrongly), as ``compress.mode=rules`` writes them
(:func:`mia.trace.rule_summary` of real replayed transcripts) and laid out exactly as
memory_serve lays them out (:func:`mia.prompts.planner.memory_context`). The target is the gold
plan that follows the positives and avoids what the negatives did.

What makes it a skill rather than knowledge: for a **convention** question ("Where is X from?",
docs/world.md) the reading the target follows is drawn at random among the wording's readings
(the city or the country of birth), and the memories are consistent with that draw: the
positives concluded with the drawn fact, the negatives with another. The wording alone
therefore says nothing about the answer; only the memories do. The same Planner then meets
held-out wordings at test time, whose conventions it can only learn from the memories that
accumulate over the test stream.

Other question types get positives of the same kind (same relation, same bridge chain, same
comparison), single-hop questions also a negative that read another fact of the entity, and now
and then an unrelated memory, as retrieval returns them. Half of the chats that have both
positives and negatives are shown with the negatives only (:data:`NEGATIVES_ONLY_RATE`): what a
Planner meets first for a new kind of question, where the plan must read the fact the failure
did not.

The reason (``<think>``) may name a failure's expected answer; the plan after it never names a
remembered entity or expected answer the question lacks (the filter that drops such a Planner
plan, :func:`mia.planner.planners.leaked_entities`): a chat whose plan would is left out.
Worlds drawn per seed (docs/world.md) bring their own conventions and wordings: the readings
come from ``world.lexicon.conventions`` (:func:`readings`), the facts in the world's nouns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from mia.apps.gold import GoldExample, GoldSkip, GoldWriter, fact_phrase, generate_gold
from mia.data.world import World
from mia.data.world_questions import CONVENTIONS, Facts, Question
from mia.planner.planners import leaked_entities
from mia.prompts.planner import memory_context, plan_messages
from mia.trace import answer_evidence, rule_summary

TYPES = ("single_hop", "bridge", "comparison", "convention")
# The legacy worlds' conventions' readings: what :func:`readings` gives for a legacy world (a
# drawn world has its own conventions). The table stays, as the Planner recipe's data key has
# always hashed it (mia.apps.warm_start.data_fingerprint).
READINGS = {c.id: c.readings for c in CONVENTIONS}
# Share of the chats with both positives and negatives (single hop, conventions) shown with the
# negatives only: early in a test stream a new kind of question has only failures in memory,
# and a Planner that never saw that case copies the failure's steps. The target still reads
# the right fact: the one the failure did not.
NEGATIVES_ONLY_RATE = 0.5
# Share of the failed memories shown with the answer that was expected and the search-result
# sentence that held it, as memory_serve shows failures written with the ground truth
# (``memory.remember_expected``); the others look like the reference's memories, without it.
EXPECTED_RATE = 0.75


@dataclass
class Memory:
    """One retrieved memory, as the Planner sees it (:class:`mia.prompts.planner.MemoryView`)."""

    question: str
    workflow_summary: str
    judgement: str
    modality: str = "text-only"
    image_caption: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def readings(world: World) -> dict[str, tuple[str, ...]]:
    """Every relation each convention wording of ``world`` could mean, by the wording's id
    (``Question.template``): the world's own conventions (``world.lexicon.conventions``)."""
    return {c.id: c.readings for c in world.lexicon.conventions}


def kind_of(q: Question) -> str:
    """What makes two questions "similar" for this data: the same wording (conventions), else
    the same relation (chain)."""
    return f"convention:{q.template}" if q.type == "convention" else f"{q.type}:{q.relation}"


def reading(world: World, q: Question, relation: str) -> Question | None:
    """``q`` asked for another fact of its entity (None when the entity lacks it)."""
    ent = world.entities[q.entity_ids[0]]
    try:
        answer, aliases = Facts(world.entities, world.passages).answer(ent, relation)
    except (KeyError, TypeError, AttributeError):
        return None
    if not answer:
        return None
    return replace(
        q,
        id=f"{q.id}~{relation}",
        relation=f"{ent.kind}.{relation}",
        answer=answer,
        aliases=list(aliases),
        held_out=False,
    )


def _history(ex: GoldExample) -> list[dict[str, Any]]:
    first = next(i for i, m in enumerate(ex.messages) if m.get("role") == "user")
    return ex.messages[first + 1 :]


def _memory(ex: GoldExample, correct: bool, expected: Question | None = None) -> Memory:
    """``expected``: the fact a failed transcript should have concluded with; shown as the
    expected answer and the sentence of its search results that held it."""
    extra: dict[str, Any] = {}
    if expected is not None:
        evidence = answer_evidence(_history(ex), expected.answers)
        extra = {"expected": expected.answer, "evidence": evidence}
    return Memory(
        question=ex.question,
        workflow_summary=rule_summary(ex.question, _history(ex)),
        judgement="correct" if correct else "incorrect",
        extra=extra,
    )


def planner_memory_examples(
    world: World,
    retriever: Any,
    *,
    split: str = "train",
    style: str = "full",
    seed: int = 0,
    positives: int = 2,
    distractor_rate: float = 0.3,
    convention_draws: int = 3,
    agent_config: Any = None,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """One planner conversation with memories per question of ``split`` (text types): rows
    ``{id, type, relation, question, planner_messages}`` for SFT (``data.fields``). A convention
    question gets ``convention_draws`` conversations (readings and memories drawn anew): it is
    the case where only the memories tell the answer."""
    chats = _MemoryChats(world, seed, positives, distractor_rate)
    questions = [q for q in world.split(split) if q.type in TYPES]
    report = generate_gold(
        world,
        retriever,
        questions=chats.readings_to_replay(questions),
        with_plan=False,
        style=style,
        agent_config=agent_config,
        progress=progress,
    )
    chats.done = {ex.id: ex for ex in report.examples}
    by_kind: dict[str, list[Question]] = {}
    for q in questions:
        by_kind.setdefault(kind_of(q), []).append(q)
    writer = GoldWriter(world, retriever, style=style)
    rows = []
    draws = [
        (q, k) for q in questions for k in range(convention_draws if q.type == "convention" else 1)
    ]
    for q, draw in draws:
        peers = [p for p in by_kind[kind_of(q)] if p.id != q.id]
        chats.rng.shuffle(peers)
        row = chats.chat(q, draw, peers, writer)
        if row is not None:
            rows.append(row)
    return rows


class _MemoryChats:
    """The plan chats with memories of one world (:func:`planner_memory_examples`): its random
    streams, the readings of its conventions and, once replayed, every reading's transcript
    (``done``: by question id, ``<id>~<relation>`` for a reading other than the question's)."""

    def __init__(self, world: World, seed: int, positives: int, distractor_rate: float) -> None:
        self.world = world
        self.positives = positives
        self.distractor_rate = distractor_rate
        self.rng = random.Random(f"planner-memory:{world.seed}:{seed}")
        # Its own stream: the other chats are drawn as they were without negatives-only ones.
        self.neg_only_rng = random.Random(f"planner-memory-negatives-only:{world.seed}:{seed}")
        self.expected_rng = random.Random(f"planner-memory-expected:{world.seed}:{seed}")
        self.meanings = readings(world)
        self.done: dict[str, GoldExample] = {}

    def readings_to_replay(self, questions: list[Question]) -> list[Question]:
        """Every question under every reading it can have (conventions: all readings; single
        hop: its own fact and one other), replayed for real so each workflow is a true
        transcript."""
        world = self.world
        asked: list[Question] = []
        for q in questions:
            if q.type == "convention":
                rels = self.meanings.get(q.template, ())
            elif q.type == "single_hop":
                ent = world.entities[q.entity_ids[0]]
                others = [r for r in Facts(world.entities, world.passages).relations(ent)]
                mine = q.relation.split(".", 1)[1]
                others = [r for r in others if r != mine]
                rels = (mine, self.rng.choice(others)) if others else (mine,)
            else:
                asked.append(q)
                continue
            for rel in rels:
                alt = reading(world, q, rel)
                if alt is not None:
                    asked.append(alt)
        return asked

    def transcript(self, q: Question, rel: str | None) -> GoldExample | None:
        """The replayed transcript of ``q`` read as ``rel`` (its own reading for the types
        without readings, or ``rel`` None)."""
        if rel is None or q.type not in ("single_hop", "convention"):
            return self.done.get(q.id)
        return self.done.get(f"{q.id}~{rel}")

    def chat(
        self, q: Question, draw: int, peers: list[Question], writer: GoldWriter
    ) -> dict[str, Any] | None:
        """The ``draw``-th plan chat of ``q`` with memories of its ``peers`` (similar
        questions, shuffled); None when no memory, no plan or only a leaking plan is found."""
        picked = self._target(q)
        if picked is None:
            return None
        want, target = picked
        pos = [m for p in peers if (m := self.transcript(p, want)) is not None][: self.positives]
        neg, neg_expected = self._negative(q, peers, pos, want)
        if not pos and not neg:
            return None
        pos, pos_mem, neg_mem, neg_expected = self._memories(q, pos, neg, neg_expected)
        try:
            plan = writer.plan(target)
        except GoldSkip:  # no query finds a supporting passage: the gold has no plan for it
            return None
        context = memory_context(pos_mem, neg_mem)
        if leaked_entities(plan, q.question, context):
            # A plan never hands on a remembered entity or expected answer (a Planner's plan
            # that does is dropped): such a chat would teach the opposite, it is left out.
            return None
        return {
            "id": f"{q.id}#memory{draw}",
            "type": q.type,
            "relation": target.relation,
            "question": q.question,
            "planner_messages": [
                *plan_messages(context, q.question, image=False),
                {
                    "role": "assistant",
                    "content": _reply(self.world, target, pos, neg, plan, neg_expected),
                },
            ],
        }

    def _target(self, q: Question) -> tuple[str | None, Question] | None:
        """The reading the chat's plan follows (a convention's is drawn among those with a
        transcript) and ``q`` asked that way; None when there is none."""
        own = _own(q)
        if q.type == "convention":
            rels = [
                r for r in self.meanings.get(q.template, ()) if self.transcript(q, r) is not None
            ]
            if not rels:
                return None
            want = self.rng.choice(rels)
        else:
            want = own
        target = reading(self.world, q, want) if want and want != own else q
        return None if target is None else (want, target)

    def _negative(
        self, q: Question, peers: list[Question], pos: list[GoldExample], want: str | None
    ) -> tuple[list[GoldExample], Question | None]:
        """A failed memory (at most one) and what its question should have answered: a
        similar question whose Executor read another fact than ``want``."""
        used = {ex.id.split("~", 1)[0] for ex in pos}
        # Not one of the positives' own questions first (memory_serve keeps one memory per
        # question).
        for p in [p for p in peers if p.id not in used] + [p for p in peers if p.id in used]:
            if q.type == "convention":
                others = [r for r in self.meanings.get(p.template, ()) if r != want]
            elif q.type == "single_hop":
                others = [k.split("~", 1)[1] for k in self.done if k.startswith(f"{p.id}~")]
                others = [r for r in others if r != want]
            else:
                others = []
            found = [m for r in others if (m := self.transcript(p, r)) is not None]
            if found:
                expected = reading(self.world, p, want) if want and want != _own(p) else p
                return [found[0]], expected
        return [], None

    def _memories(
        self,
        q: Question,
        pos: list[GoldExample],
        neg: list[GoldExample],
        neg_expected: Question | None,
    ) -> tuple[list[GoldExample], list[Memory], list[Memory], Question | None]:
        """The memories shown: the positives, now and then with an unrelated one (as retrieval
        returns them), or none in a negatives-only chat; the negatives, with the expected
        answer or without it (as the reference remembers a failure). Returns the positives
        the reply names, both memory lists and the expected reading shown (or None)."""
        neg_only = bool(pos and neg) and self.neg_only_rng.random() < NEGATIVES_ONLY_RATE
        pos_mem = [_memory(ex, True) for ex in pos]
        if self.rng.random() < self.distractor_rate:  # retrieval also returns unrelated memories
            others = [ex for k, ex in self.done.items() if "~" not in k and ex.id != q.id]
            if others:
                at = self.rng.randrange(len(pos_mem) + 1)
                pos_mem.insert(at, _memory(self.rng.choice(others), True))
        if neg_only:  # only the failure is in memory: plan for the fact it did not read
            pos, pos_mem = [], []  # after the draws above: the other chats stay the same
        if self.expected_rng.random() >= EXPECTED_RATE:
            neg_expected = None  # a failure as the reference remembers it: no ground truth
        neg_mem = [_memory(ex, False, neg_expected) for ex in neg]
        return pos, pos_mem, neg_mem, neg_expected


def _own(q: Question) -> str | None:
    """The relation a single-hop or convention question asks for (None for the others)."""
    return q.relation.split(".", 1)[1] if q.type in ("single_hop", "convention") else None


def _fact(world: World, ex: GoldExample) -> str:
    """The fact a single-hop transcript concluded with, as its Planner would describe it."""
    base = ex.id.split("~", 1)[0]
    q = next(q for q in world.questions if q.id == base)
    return fact_phrase(
        world.entities[q.entity_ids[0]], ex.relation.split(".", 1)[1], lexicon=world.lexicon
    )


def _reply(
    world: World,
    target: Question,
    pos: list[GoldExample],
    neg: list[GoldExample],
    plan: str,
    expected: Question | None = None,
) -> str:
    """The Planner's answer: a short reason naming what the memories did (and, for a failure
    shown with its expected answer, which fact that answer was), then the plan."""
    if target.type in ("single_hop", "convention"):
        parts = []
        if pos:
            parts.append(
                f"A similar question was answered correctly by finding {_fact(world, pos[0])}"
            )
        else:
            parts.append("No similar question was answered correctly")
        if neg and expected is not None:
            rel = expected.relation.split(".", 1)[1]
            wanted = fact_phrase(world.entities[expected.entity_ids[0]], rel, lexicon=world.lexicon)
            parts.append(
                f"a failed one found {_fact(world, neg[0])}, but {expected.answer} was "
                f"expected, {wanted}"
            )
        elif neg:
            parts.append(f"a failed one found {_fact(world, neg[0])}")
        rel = target.relation.split(".", 1)[1]
        look = fact_phrase(world.entities[target.entity_ids[0]], rel, lexicon=world.lexicon)
        parts.append(f"so I will look for {look}" + ("" if pos else " instead"))
        why = "; ".join(parts)
    else:
        why = "A similar question was answered correctly; I will follow the same steps"
    return f"<think>\n{why}.\n</think>\n\n{plan}"
