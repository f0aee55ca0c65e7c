"""Gold Executor trajectories and Planner plans for the synthetic world (the SFT cold start).

The embedded SmolLM2 reads passages but never calls a tool on its own (docs/sft.md): it needs
demonstrations before RL can start. This module writes them from the world's facts and the REAL
index, and never paraphrases a tool result:

* Each question gets a small *program* (a generator) per type that writes one assistant turn at a
  time and receives the observation the loop produced for it. Queries are chosen by probing the
  real retriever with deterministic variants until the needed passage is in the top-k; the bridge
  entity and the image's owner are read from the ACTUAL observation text, and every conclusion
  quotes the sentence it comes from.
* The program is replayed through the real :class:`mia.agent.ExecutorLoop` (a
  :class:`mia.llm.scripted.ScriptedChat` policy whose replies are the program's turns) with the
  real ``search`` tool talking to a local_search server on the same index and the real image-search
  tool reading the world's cache. ``Trajectory.messages`` is therefore by construction what
  training and serving see. A replay whose answer the rule judge does not accept, whose turns fail
  :func:`mia.agent.check_format`, or whose tool calls were not all valid strict JSON, is skipped
  with a reason (as is a question whose passage no query variant retrieves).
* The Planner side: the plan chat ``[system, user(plan prompt with an empty memory context),
  assistant(plan)]`` and a reflection chat that continues it with the judge prompt over the gold
  trace and answers ``no`` (the Executor was right).

    from mia.apps.gold import build_gold, write_gold, load_gold
    examples = build_gold(world, "indexes/w0-bm25", split="train", image_cache_root="w0/image_cache")
    write_gold("gold.jsonl", examples)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import ExitStack
from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mia.data.world_questions import BRIDGES, QUESTION_TYPES, Facts, contains
from mia.errors import MiaError
from mia.paths import atomic_write_text
from mia.prompts import planner as planner_text
from mia.prompts.planner import EMPTY_MEMORY, plan_messages
from mia.trace import content_text

if TYPE_CHECKING:
    from local_search import Retriever
    from mia.agent import AgentConfig, Trajectory
    from mia.data.world import Question, World
    from mia.data.world_entities import Entity
    from mia.data.world_lexicon import Lexicon

Message = dict[str, Any]
Program = Generator[str, str, None]  # yields assistant turns, receives observation texts

SPLITS = ("train", "test", "all")
# How much the Executor's <think> says (docs/gold.md, "Styles"):
#   full    -- a sentence of intent per search, and every conclusion quotes its sentence;
#   concise -- one short sentence per search turn (what the question asks; a bridge adds what
#              it needs first); the answer-bearing sentence is still quoted (comparisons state
#              each value instead of quoting), and a bridge's answer restates the question;
#   terse   -- one short sentence per turn and no quotes.
STYLES = ("full", "concise", "terse")
# with_plan="alternate": about half the questions get the gold plan in the Executor's prompt.
PLAN_MODES = (True, False, "alternate")

# Words appended to an entity's name in a search query, per relation (words the passages use,
# so BM25 rewards the right sentence, not only the name). Legacy worlds; a drawn world's passages
# word facts as its lexicon chose (drawn_query_words).
QUERY_WORDS: dict[str, str] = {
    "person.birth_city": "born city",
    "person.birth_country": "born country",
    "person.birth_date": "date of birth",
    "person.birth_year": "year of birth",
    "person.death_year": "died",
    "person.occupation": "profession",
    "person.university": "studied university",
    "org.founder": "founded by",
    "org.hq": "headquarters",
    "org.hq_country": "headquartered country",
    "org.founded": "founded year",
    "city.population": "population",
    "city.region": "region",
    "city.country": "country",
    "city.founded": "founded",
    "city.river": "river",
    "country.capital": "capital",
    "country.language": "official language",
    "country.currency": "currency",
    "region.seat": "administrative seat",
    "region.country": "country",
}
WORK_QUERY_WORDS = {
    "novel": {"creator": "novel author", "year": "novel published", "producer": "publisher"},
    "film": {"creator": "film director", "year": "film released", "producer": "studio"},
    "album": {"creator": "album musician", "year": "album released", "producer": "record label"},
}
# "the <fact> of {x}": what the Executor is looking for, in its reasoning and in the plan. A
# drawn world says its own nouns for cities and regions ("the town where {x} was born").
FACT_PHRASES: dict[str, str] = {
    "person.birth_city": "the city where {x} was born",
    "person.birth_country": "the country where {x} was born",
    "person.birth_date": "the date of birth of {x}",
    "person.birth_year": "the year in which {x} was born",
    "person.death_year": "the year in which {x} died",
    "person.occupation": "the profession of {x}",
    "person.university": "the university where {x} studied",
    "org.founder": "the founder of {x}",
    "org.hq": "the city where {x} is headquartered",
    "org.hq_country": "the country where {x} is headquartered",
    "org.founded": "the year in which {x} was founded",
    "city.population": "the population of {x}",
    "city.region": "the region in which {x} lies",
    "city.country": "the country in which {x} lies",
    "city.founded": "the year in which {x} was founded",
    "city.river": "the river on which {x} lies",
    "country.capital": "the capital of {x}",
    "country.language": "the official language of {x}",
    "country.currency": "the currency of {x}",
    "region.seat": "the administrative seat of {x}",
    "region.country": "the country in which {x} lies",
}
WORK_FACT_PHRASES = {
    "novel": {
        "creator": "the author of {x}",
        "year": "the year in which {x} was published",
        "producer": "the publisher of {x}",
    },
    "film": {
        "creator": "the director of {x}",
        "year": "the year in which {x} was released",
        "producer": "the studio that produced {x}",
    },
    "album": {
        "creator": "the musician who recorded {x}",
        "year": "the year in which {x} was released",
        "producer": "the record label that released {x}",
    },
}
# How the answer should look (plan's last step), per relation name.
ANSWER_FORMS = {
    "birth_city": "the city's name",
    "birth_country": "the country's name",
    "birth_date": "the date",
    "birth_year": "the year",
    "death_year": "the year",
    "occupation": "the profession",
    "university": "the university's name",
    "founder": "the person's name",
    "hq": "the city's name",
    "hq_country": "the country's name",
    "founded": "the year",
    "population": "the number",
    "region": "the region's name",
    "country": "the country's name",
    "river": "the river's name",
    "capital": "the city's name",
    "language": "the language",
    "currency": "the currency",
    "seat": "the city's name",
    "creator": "the person's name",
    "year": "the year",
    "producer": "the organisation's name",
}
KIND_NOUNS = {
    "person": "person",
    "org": "organisation",
    "city": "city",
    "country": "country",
    "region": "region",
    "work": "work",
}
IMAGE_NOUNS = {"org": "emblem", "country": "flag", "city": "coat of arms"}
# Comparison wording per kind: value of one entity, and why the winner wins.
COMPARE_VALUE = {
    "person": ("date of birth", "{n} was born on {v}."),
    "org": ("founding year", "{n} was founded in {v}."),
    "city": ("population", "{n} has a population of {v}."),
    "work": ("year of release", "{n} came out in {v}."),
}
COMPARE_VERDICT = {
    "person": ("{a} is earlier than {b}", "was born earlier", "earlier"),
    "org": ("{a} is earlier than {b}", "was founded earlier", "earlier"),
    "city": ("{a} is larger than {b}", "has the larger population", "larger"),
    "work": ("{a} is earlier than {b}", "came out first", "earlier"),
}
# Query words for comparisons, tried in order. Works: the question does not say whether it is a
# novel, film or album, and many works have "Reception of <title>" reviews that outrank the work's
# own passage on the bare title; each word matches one kind's own passage.
COMPARE_QUERY_WORDS = {
    "person": ("born",),
    "org": ("founded",),
    "city": ("population",),
    "work": ("release year", "published", "film directed"),
}


class GoldSkip(Exception):
    """A question without a valid gold transcript; the message is the reason."""


@dataclass
class GoldExample:
    """One question's gold data. ``messages``: the Executor conversation exactly as the loop
    produced it (OpenAI format, images as data URLs); ``planner_messages``: ``[system, user(plan
    prompt), assistant(plan)]``; ``reflection_messages``: that chat continued with the judge
    prompt over the gold trace and the decision ``no``."""

    id: str
    type: str
    relation: str
    split: str
    question: str
    answer: str
    plan: str
    messages: list[Message]
    planner_messages: list[Message]
    reflection_messages: list[Message]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "gold example") -> GoldExample:
        if not isinstance(data, dict):
            raise MiaError(f"{where}: expected a JSON object")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise MiaError(f"{where}: missing field(s) {missing}")
        for n in names:
            want = list if n.endswith("messages") else str
            if not isinstance(data[n], want):
                raise MiaError(f"{where}: field {n!r} must be a {want.__name__}")
        return cls(**{n: data[n] for n in names})


@dataclass
class Skipped:
    id: str
    type: str
    relation: str
    reason: str


@dataclass
class GoldReport:
    """Everything a run produced: the examples, the skipped questions with reasons, totals."""

    examples: list[GoldExample] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    # How many chosen queries were the first variant (0), the second (1), ... (incl. skipped).
    variant_use: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.examples) + len(self.skipped)

    @property
    def coverage(self) -> float:
        """Share of questions with a valid gold transcript (1.0 for no questions)."""
        return len(self.examples) / self.total if self.total else 1.0

    def by_type(self) -> dict[str, tuple[int, int]]:
        """``{type: (with gold, total)}`` in the world's type order."""
        ok = Counter(e.type for e in self.examples)
        total = ok + Counter(s.type for s in self.skipped)
        return {t: (ok[t], total[t]) for t in QUESTION_TYPES if total[t]}

    def summary(self) -> str:
        parts = [f"{t} {a}/{n}" for t, (a, n) in self.by_type().items()]
        head = f"coverage {len(self.examples)}/{self.total} ({100 * self.coverage:.1f}%)"
        return head + (f": {', '.join(parts)}" if parts else "")


# --------------------------------------------------------------------------------------------
# wording helpers


def _pick(key: str, options: Sequence[str]) -> str:
    """A deterministic choice among phrasings (so SFT does not see one sentence a thousand
    times), stable across runs and Python versions."""
    return options[zlib.crc32(key.encode("utf-8")) % len(options)]


def _rel(ent: Entity, rel: str, table: dict[str, str], work: dict[str, dict[str, str]]) -> str:
    if ent.kind == "work":
        return work[ent.attrs["wtype"]][rel]
    return table[f"{ent.kind}.{rel}"]


_KIND_WORD = re.compile(r"\b(?:city|region)\b")


def worded(text: str, lexicon: Lexicon | None = None) -> str:
    """``text`` in the world's nouns: a drawn world may call its cities towns and its regions
    provinces or counties (``lexicon.nouns``). Legacy worlds (and ``None``) keep the text."""
    if lexicon is None or lexicon.legacy:
        return text
    return _KIND_WORD.sub(lambda m: lexicon.nouns[m.group(0)], text)


def query_words(ent: Entity, rel: str, lexicon: Lexicon | None = None) -> str:
    """The words a query adds to ``ent``'s name to find its ``rel``: :data:`QUERY_WORDS` on a
    legacy world (``lexicon`` None or legacy), else :func:`drawn_query_words`."""
    if lexicon is None or lexicon.legacy:
        return _rel(ent, rel, QUERY_WORDS, WORK_QUERY_WORDS)
    return drawn_query_words(lexicon, ent, rel)


def drawn_query_words(lexicon: Lexicon, ent: Entity, rel: str) -> str:
    """The words of the drawn passage sentence that states ``ent``'s ``rel``
    (:mod:`mia.data.world_styles`: the lexicon's style and phrasing of that fact, its nouns), so
    BM25 ranks the passage for the sentence, not only for the name. The words live here, not in
    a module table: the warm start's data key hashes this module's upper-case tables
    (:func:`mia.apps.warm_start.data_fingerprint`), and the shipped adapters' legacy gold does
    not depend on these."""
    from mia.data.world_styles import fact_words

    narrative = lexicon.style == "narrative"
    variant = lexicon.phrasing.get
    if ent.kind == "person":  # one sentence holds the birth, the place, the job (and death)
        if rel == "university":
            return fact_words(lexicon, "person.university")
        if rel == "death_year" and (narrative or variant("person.birth", 0)):
            return "died"  # the encyclopedia's first phrasing dates it: "(born – died)"
        return fact_words(lexicon, "person.birth")
    if ent.kind == "org":
        return fact_words(lexicon, "org.hq" if rel in ("hq", "hq_country") else "org.founder")
    if ent.kind == "work":
        wtype = ent.attrs["wtype"]
        if rel == "creator":
            verbs = {"novel": "wrote", "film": "directed", "album": "recorded"}
            return f"{wtype} {verbs[wtype] if narrative else 'by'}"
        if rel == "year":
            if not narrative and not variant("work.creator", 0):
                return wtype  # "X is a 1983 crime novel by Y."
            novel = "appeared" if narrative else "published"
            return f"{wtype} {novel if wtype == 'novel' else 'released'}"
        words = {  # per phrasing of the producer's sentence
            "novel": ("published", "publisher"),
            "film": ("produced", "studio produced"),
            "album": ("label", "issued record"),
        }
        return f"{wtype} {words[wtype][variant('work.producer', 0)]}"
    if ent.kind == "city":
        if rel == "region":
            return lexicon.nouns["region"]  # "X is a town in the Y county of Z."
        if rel == "country":
            return lexicon.nouns["city"]
        if rel == "population":  # "... has a population of N." / "... is home to N people."
            return ("population", "home people")[variant("city.founded", 0)]
        return fact_words(lexicon, f"city.{rel}")  # founded, river
    if ent.kind == "region":
        return fact_words(lexicon, "region.seat") if rel == "seat" else lexicon.nouns["region"]
    if rel == "capital":
        return fact_words(lexicon, "country.capital")
    # one sentence: "The official language is L, and the currency is the C." / "People there
    # speak L officially and pay in the C."
    words = {"language": ("official language", "speak officially"), "currency": ("currency", "pay")}
    return words[rel][variant("country.language", 0)]


def fact_phrase(ent: Entity, rel: str, x: str | None = None, lexicon: Lexicon | None = None) -> str:
    """``the <fact> of <x>`` (``x`` defaults to the entity's name), in ``lexicon``'s nouns."""
    return worded(_rel(ent, rel, FACT_PHRASES, WORK_FACT_PHRASES), lexicon).format(x=x or ent.name)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _think(text: str) -> str:
    return f"<think>\n{text}\n</think>\n"


def search_turn(think: str, queries: list[str]) -> str:
    call = {"name": "search", "arguments": {"query_list": queries}}
    return _think(think) + f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def image_search_turn(think: str) -> str:
    call = {"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}
    return _think(think) + f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def answer_turn(think: str, answer: str) -> str:
    return _think(think) + f"<answer>{answer}</answer>"


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def passage_text(observation: str, title: str) -> str | None:
    """The text of the first passage titled ``title`` in a search observation (the
    ``Doc k(Title: ...) text`` lines of :func:`mia.agent.tools.format_passages`)."""
    marker = f"(Title: {title}) "
    for line in observation.split("\n"):
        if line.startswith("Doc ") and marker in line:
            return line.split(marker, 1)[1]
    return None


def _has_any(text: str, needles: Sequence[str]) -> bool:
    return any(contains(text, n) for n in needles)


def evidence(observation: str, title: str, needles: Sequence[str]) -> str | None:
    """The first sentence of the passage titled ``title`` in ``observation`` that contains one of
    ``needles`` as a whole phrase, or None."""
    text = passage_text(observation, title)
    if text is None:
        return None
    for sentence in _SENTENCE_END.split(text):
        if _has_any(sentence, needles):
            return sentence.strip()
    return None


_IMAGE_HIT = re.compile(r"^1\. title: (.+?)(?: <image>| \(image unavailable\))?$", re.M)


def top_image_title(observation: str) -> str | None:
    """The title of the first image-search hit (``1. title: <title> <image>``)."""
    m = _IMAGE_HIT.search(observation)
    return m.group(1).strip() if m else None


# --------------------------------------------------------------------------------------------
# programs: one per question type


class GoldWriter:
    """Writes the gold programs, plans and planner chats of one world's questions. ``retriever``
    is the index the ``search`` tool serves (probed to choose queries); ``topk`` its depth.

    A drawn world (``world.lexicon`` not legacy) is written in its own words: bridge mentions
    are its descriptions, queries use the words its passages use (:func:`drawn_query_words`),
    and facts, plans and answer forms its nouns ("the town where X was born"). A legacy world's
    gold is what it always was, byte for byte."""

    def __init__(
        self, world: World, retriever: Retriever, topk: int = 3, style: str = "full"
    ) -> None:
        if style not in STYLES:
            raise MiaError(f"gold: style must be one of {STYLES}, got {style!r}")
        self.style = style
        self.world = world
        self.lexicon = world.lexicon
        self.e = world.entities
        self.facts = Facts(world.entities, world.passages)
        self.retriever = retriever
        self.topk = topk
        self.variant_use: Counter[int] = Counter()  # which variant (0 = first) each query used
        self._chosen: dict[tuple[Any, ...], str] = {}

    # -- queries --------------------------------------------------------------------------------
    def choose_query(self, variants: Sequence[str], pid: str, needles: Sequence[str]) -> str:
        """The first variant whose top-k holds passage ``pid`` with one of ``needles`` in it
        (memoised: the plan and the program of a question agree on it)."""
        tried = list(dict.fromkeys(v for v in variants if v.strip()))
        key = (tuple(tried), pid, tuple(needles))
        if key in self._chosen:
            return self._chosen[key]
        for k, query in enumerate(tried):
            hits = self.retriever.search([query], self.topk)[0]
            if any(str(h.id) == pid and _has_any(h.contents, needles) for h in hits):
                self.variant_use[k] += 1
                self._chosen[key] = query
                return query
        raise GoldSkip(f"passage {pid} is not in the top {self.topk} for any query variant {tried}")

    def first_query(self, q: Question) -> str:
        """The query of the first search of a single-hop or bridge question."""
        if q.type == "bridge":
            subj, rel1, mid, _rel2, _mention = self.bridge_parts(q)
            return self.choose_query(self.variants(subj, rel1), q.supporting_ids[0], [mid.name])
        ent = self.e[q.entity_ids[0]]
        rel = q.relation.split(".", 1)[1]
        variants = self.variants(ent, rel, q.question)
        return self.choose_query(variants, q.supporting_ids[0], q.answers)

    def variants(self, ent: Entity, rel: str, *extra: str) -> list[str]:
        return [f"{ent.name} {self.query_words(ent, rel)}", ent.name, *extra]

    # -- the world's words ----------------------------------------------------------------------
    def query_words(self, ent: Entity, rel: str) -> str:
        return query_words(ent, rel, self.lexicon)

    def fact(self, ent: Entity, rel: str, x: str | None = None) -> str:
        return fact_phrase(ent, rel, x, self.lexicon)

    def noun(self, kind: str) -> str:
        return worded(KIND_NOUNS[kind], self.lexicon)

    def answer_form(self, rel: str) -> str:
        return worded(ANSWER_FORMS[rel], self.lexicon)

    def compare_words(self, ent: Entity, rel: str) -> tuple[str, ...]:
        """Words for a comparison's query about ``ent``, tried in order."""
        if self.lexicon.legacy:
            return COMPARE_QUERY_WORDS[ent.kind]
        return (self.query_words(ent, rel),)

    # -- dispatch -------------------------------------------------------------------------------
    def program(self, q: Question) -> Program:
        # A convention question is a single hop whose wording does not say which fact it
        # wants; the transcript names the fact the convention picks.
        kind = "single_hop" if q.type == "convention" else q.type
        return getattr(self, f"_{kind}")(q)

    def _read(self, obs: str, ent: Entity, needles: Sequence[str], what: str) -> str:
        sentence = evidence(obs, ent.name, needles)
        if sentence is None:
            raise GoldSkip(f"the observation has no passage on {ent.name!r} stating {what}")
        return sentence

    def _single_hop(self, q: Question) -> Program:
        ent = self.e[q.entity_ids[0]]
        rel = q.relation.split(".", 1)[1]
        fact = self.fact(ent, rel)
        query = self.first_query(q)
        if self.style == "full":
            opener = _pick(
                q.id + ":open",
                [
                    f"The question asks for {fact}. I will search for {ent.name}.",
                    f"I need {fact}. Searching for {ent.name} should find its passage.",
                    f"To answer, I need {fact}. Let me search for it.",
                ],
            )
        else:
            opener = f"I need {fact}."
        obs = yield search_turn(opener, [query])
        quote = self._read(obs, ent, q.answers, fact)
        yield answer_turn(self._conclude(ent.name, quote, f"{fact} is {q.answer}."), q.answer)

    def _conclude(self, title: str, quote: str, conclusion: str) -> str:
        """The reasoning that reads a fact: the quoted sentence (full, concise) and the
        conclusion drawn from it."""
        if self.style == "full":
            return f'The passage on {title} says: "{quote}" So {conclusion}'
        if self.style == "concise":
            return f'"{quote}" So {conclusion}'
        return _cap(conclusion)

    def bridge_parts(self, q: Question) -> tuple[Entity, str, Entity, str, str]:
        """``(subject, first relation, bridge entity, second relation, mention)`` where the
        mention is how the question describes the bridge entity ("the founder of X"): the
        world's own description (:meth:`mia.data.world_lexicon.Lexicon.describe`)."""
        first, second = q.relation.split(">")
        kind1, rel1 = first.split(".", 1)
        rel2 = second.split(".", 1)[1]
        subj, mid = self.e[q.entity_ids[0]], self.e[q.entity_ids[1]]
        if self.lexicon.legacy:  # the fixed descriptions (the same as LEGACY.bridges)
            describe = next(d for k, r, d, _t in BRIDGES if k == kind1 and r == rel1)(subj)
        else:
            describe = self.lexicon.describe(kind1, rel1, subj.attrs.get("wtype"))
        return subj, rel1, mid, rel2, describe.format(s=subj.name)

    def _bridge(self, q: Question) -> Program:
        subj, rel1, mid, rel2, mention = self.bridge_parts(q)
        goal = self.fact(mid, rel2, x=mention)
        query1 = self.first_query(q)
        first = (
            f"The question asks for {goal}. First I need the name of {mention}, "
            f"so I will search for {subj.name}."
            if self.style == "full"
            else f"I need {goal}. First I need the name of {mention}."
        )
        obs = yield search_turn(first, [query1])
        quote1 = self._read(obs, subj, [mid.name], f"the name of {mention}")
        fact2 = self.fact(mid, rel2)
        query2 = self.choose_query(self.variants(mid, rel2), q.supporting_ids[1], q.answers)
        obs = yield search_turn(
            self._conclude(subj.name, quote1, f"{mention} is {mid.name}.")
            + f" Now I need {fact2}.",
            [query2],
        )
        quote2 = self._read(obs, mid, q.answers, fact2)
        # full: "... is X, and that answers the question."; shorter styles restate the goal
        done = (
            f"{fact2} is {q.answer}, and that answers the question."
            if self.style == "full"
            else f"{goal} is {q.answer}."
        )
        yield answer_turn(self._conclude(mid.name, quote2, done), q.answer)

    def _comparison(self, q: Question) -> Program:
        kind, rel = q.relation.split(".", 1)
        a, b = (self.e[i] for i in q.entity_ids)
        noun, value_line = COMPARE_VALUE[kind]
        values = {e.id: self.facts.answer(e, rel)[0] for e in (a, b)}
        queries = []
        for ent, pid in zip((a, b), q.supporting_ids, strict=True):
            variants = [f"{ent.name} {w}" for w in self.compare_words(ent, rel)] + [ent.name]
            queries.append(self.choose_query(variants, pid, [values[ent.id]]))
        opener = f"I need the {noun} of {a.name} and of {b.name}"
        obs = yield search_turn(
            opener + " to compare them. I will search for both at once."
            if self.style == "full"
            else opener + ".",
            queries,
        )
        lines = []
        for ent in (a, b):
            quote = self._read(obs, ent, [values[ent.id]], f"its {noun}")
            value = value_line.format(n=ent.name, v=values[ent.id])
            lines.append(
                f'The passage on {ent.name} says: "{quote}" So {value}'
                if self.style == "full"
                else value
            )
        winner = a if q.answer == a.name else b
        loser = b if winner is a else a
        relation, verb, _ = COMPARE_VERDICT[kind]
        verdict = relation.format(a=values[winner.id], b=values[loser.id])
        yield answer_turn(
            " ".join(lines) + f" {_cap(verdict)}, so {winner.name} {verb}.", winner.name
        )

    def _image(self, q: Question) -> Program:
        ent = self.e[q.entity_ids[0]]
        rel = q.relation.split(".", 1)[1]
        picture = IMAGE_NOUNS[ent.kind]
        noun = self.noun(ent.kind)
        obs = yield image_search_turn(
            f"The question is about the {noun} whose {picture} is shown. I do not know whose "
            f"{picture} it is, so I will search for similar images first."
            if self.style == "full"
            else f"I need to know whose {picture} this is."
        )
        title = top_image_title(obs)
        if title is None:
            raise GoldSkip("the image search returned no titled hit")
        if title != ent.name:
            raise GoldSkip(f"the top image hit is {title!r}, not {ent.name!r}")
        fact = self.fact(ent, rel, x=title)
        query = self.choose_query(self.variants(ent, rel), q.supporting_ids[0], q.answers)
        obs = yield search_turn(
            f'The top result is titled "{title}", so the image shows the {picture} of {title}. '
            f"Now I need {fact}."
            if self.style == "full"
            else f"The image shows the {picture} of {title}. Now I need {fact}.",
            [query],
        )
        quote = self._read(obs, ent, q.answers, fact)
        yield answer_turn(self._conclude(title, quote, f"{fact} is {q.answer}."), q.answer)

    # -- the Planner side -----------------------------------------------------------------------
    def plan(self, q: Question) -> str:
        """The gold plan: numbered atomic steps with search intents; no facts beyond the
        question's own words and no answer. A first search names the query the Executor runs."""
        if q.type in ("single_hop", "convention"):
            ent = self.e[q.entity_ids[0]]
            rel = q.relation.split(".", 1)[1]
            steps = [
                f'Search for "{self.first_query(q)}" to find the passage about {ent.name}.',
                f"Read that passage and find {self.fact(ent, rel)}.",
                f"Answer with {self.answer_form(rel)} only.",
            ]
        elif q.type == "bridge":
            subj, rel1, mid, rel2, mention = self.bridge_parts(q)
            that = f"that {self.noun(mid.kind)}"
            steps = [
                f'Search for "{self.first_query(q)}" to find the passage about {subj.name}.',
                f"Read that passage and take the name of {mention}.",
                f'Search for that name together with words such as "{self.query_words(mid, rel2)}".',
                f"Read the passage about {that} and find {self.fact(mid, rel2, x=that)}.",
                f"Answer with {self.answer_form(rel2)} only.",
            ]
        elif q.type == "comparison":
            kind = q.relation.split(".", 1)[0]
            a, b = (self.e[i] for i in q.entity_ids)
            noun, _ = COMPARE_VALUE[kind]
            _, verb, adjective = COMPARE_VERDICT[kind]
            steps = [
                f"Search for {a.name} and {b.name} in one call, with one query for each.",
                f"Read the {noun} of each from its own passage.",
                f"Compare the two values and pick the {adjective} one.",
                f"Answer with the name of the one that {verb}, and nothing else.",
            ]
        else:
            ent = self.e[q.entity_ids[0]]
            rel = q.relation.split(".", 1)[1]
            noun = self.noun(ent.kind)
            that = f"that {noun}"
            steps = [
                f'Call web_image_to_image_search once with img_idx "0" to identify the {noun} '
                f"whose {IMAGE_NOUNS[ent.kind]} is shown.",
                f"Take the title of the top result as the name of {that}.",
                f'Search for that name together with words such as "{self.query_words(ent, rel)}".',
                f"Read the passage and find {self.fact(ent, rel, x=that)}.",
                f"Answer with {self.answer_form(rel)} only.",
            ]
        return "\n".join(f"{i}. {s}" for i, s in enumerate(steps, 1))

    def planner_reply(self, q: Question, plan: str) -> str:
        if q.type == "convention":  # the wording is vague: the plan names the fact it means
            fact = self.fact(self.e[q.entity_ids[0]], q.relation.split(".", 1)[1])
            why = f"the wording is vague; here it asks for {fact}"
        else:
            why = {
                "single_hop": "one search for the named entity should find the fact",
                "bridge": "two hops are needed, and the second search depends on the first result",
                "comparison": "both entities need a search, then their values are compared",
                "image": "the image must be identified once before the text search",
            }[q.type]
        return f"<think>\nNo memories of similar questions were found; {why}.\n</think>\n\n{plan}"


REFLECTION_DECISION = (
    "<think>\nEvery step of the plan was carried out, and the answer is quoted from a retrieved "
    "passage.\n</think>\n\nno"
)


def empty_memory_context() -> str:
    """The Planner's memory block when nothing was retrieved (as memory_serve renders it)."""
    return EMPTY_MEMORY


def planner_messages(question: str, reply: str, *, image: bool) -> list[Message]:
    return [
        *plan_messages(EMPTY_MEMORY, question, image=image),
        {"role": "assistant", "content": reply},
    ]


# --------------------------------------------------------------------------------------------
# replay through the real loop


class _Script:
    """``ScriptedChat`` reply function driving a program: the first call starts it, every later
    call sends it the text of the last message (the observation)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.started = False

    def __call__(self, messages: list[Message]) -> str:
        if not self.started:
            self.started = True
            return next(self.program)
        try:
            return self.program.send(content_text(messages[-1].get("content")))
        except StopIteration:
            raise GoldSkip("the loop asked for a turn after the final answer") from None


def validate_replay(traj: Trajectory, q: Question) -> None:
    """Raise :class:`GoldSkip` unless the replay is a clean, correct trajectory."""
    from mia.agent import check_format
    from mia.judge.rules import RuleJudge

    if traj.stop_reason != "answer":
        raise GoldSkip(f"the replay stopped with {traj.stop_reason!r}")
    bad = [r for r in traj.tool_calls if not (r.ok and r.strict_json and not r.repaired)]
    if bad or traj.tool_errors:
        detail = bad[0].error if bad else traj.tool_errors[0]
        raise GoldSkip(f"a tool call failed in the replay: {detail}")
    check = check_format(traj.assistant_texts())
    if not check.ok:
        raise GoldSkip(f"the replay breaks the format rules: {'; '.join(check.issues)}")
    verdict = RuleJudge(mode="em").grade_sync(q.question, traj.answer, q.answers)
    if not verdict.correct:
        raise GoldSkip(f"the replayed answer {traj.answer!r} is not {q.answer!r}")


def _tools_config(cfg: AgentConfig, search_url: str, cache_root: Path | None) -> dict[str, Any]:
    tools = deepcopy(dict(cfg.tools))
    search = tools.get("search")
    if not search or search.get("type") != "search":
        raise MiaError("gold: the agent config needs a 'search' tool of type search")
    params = search.setdefault("params", {})
    if params.get("backend", "local") != "local":
        raise MiaError("gold: the search tool must use backend: local (the world's index)")
    params["url"] = search_url
    params.pop("token", None)
    image = tools.get("web_image_to_image_search")
    if image and cache_root is not None:
        image.setdefault("params", {})["cache_roots"] = [str(cache_root)]
    return tools


def corpus_sha256(world: World) -> str:
    """The sha256 of the world's ``corpus.jsonl`` as :meth:`World.write` writes it."""
    h = hashlib.sha256()
    for p in world.passages:
        h.update(
            (json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n").encode()
        )
    return h.hexdigest()


def _questions(world: World, split: str, limit: int | None) -> list[Question]:
    if split not in SPLITS:
        raise MiaError(f"gold: split must be one of {SPLITS}, got {split!r}")
    qs = list(world.questions) if split == "all" else world.split(split)
    return qs[:limit] if limit is not None else qs


def generate_gold(
    world: World,
    index: str | os.PathLike[str] | Retriever,
    split: str = "train",
    image_cache_root: str | os.PathLike[str] | None = None,
    *,
    agent_config: AgentConfig | None = None,
    with_plan: bool | str = True,
    limit: int | None = None,
    progress: bool | Callable[[int, int], None] = False,
    style: str = "full",
    questions: Sequence[Question] | None = None,
) -> GoldReport:
    """Gold examples for ``split`` (``train``/``test``/``all``) plus the skipped questions.
    ``questions``: these questions of the world instead of a split (e.g. other readings of a
    question, :mod:`mia.apps.planner_gold`).

    ``index``: an index folder or an opened :class:`local_search.Retriever` of THIS world's
    corpus (checked by sha256). ``image_cache_root``: the world's ``image_cache`` folder; when
    None the cache is written to a temporary folder from ``world``. ``agent_config``: the loop
    and tool settings (observation format, truncation, top-k); defaults to
    ``configs/agent/default.yaml``'s values. ``with_plan``: the Executor's user prompt carries the
    gold plan (as when a Planner is in the loop); else it gets the question alone; ``"alternate"``:
    about half the questions get the plan (chosen from the question id, see :func:`gets_plan`).
    ``style``: how much the Executor's reasoning says (:data:`STYLES`).
    """
    from local_search import open_index

    if limit is not None and limit < 0:
        raise MiaError(f"gold: limit must be >= 0, got {limit}")
    if with_plan not in PLAN_MODES:
        raise MiaError(f"gold: with_plan must be True, False or 'alternate', got {with_plan!r}")
    if style not in STYLES:
        raise MiaError(f"gold: style must be one of {STYLES}, got {style!r}")
    questions = list(questions) if questions is not None else _questions(world, split, limit)
    with ExitStack() as stack:
        if isinstance(index, str | os.PathLike):
            retriever = open_index(index)
            stack.callback(retriever.close)
        else:
            retriever = index
        want = corpus_sha256(world)
        if retriever.manifest.corpus_sha256 != want:
            raise MiaError(
                f"gold: the index {retriever.index_dir} was built from another corpus "
                f"(sha256 {retriever.manifest.corpus_sha256[:12]}..., this world's corpus.jsonl "
                f"is {want[:12]}...): build it from the world's corpus.jsonl"
            )
        cache_root = Path(image_cache_root) if image_cache_root is not None else None
        if cache_root is None and any(q.type == "image" for q in questions):
            from mia.data.world_io import _write_cache

            cache_root = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "image_cache"
            _write_cache(world, cache_root, show=False)
        elif cache_root is not None and not cache_root.is_dir():
            raise MiaError(f"gold: image cache folder not found: {cache_root}")
        return asyncio.run(
            _replay_all(
                world, retriever, questions, cache_root, agent_config, with_plan, progress, style
            )
        )


def gets_plan(question_id: str, with_plan: bool | str) -> bool:
    """Whether a question's Executor prompt carries the gold plan. ``"alternate"``: a stable
    function of the id (crc32 parity), so about half of each type get one."""
    if with_plan == "alternate":
        return zlib.crc32(question_id.encode("utf-8")) % 2 == 0
    return bool(with_plan)


def build_gold(
    world: World,
    index: str | os.PathLike[str] | Retriever,
    split: str = "train",
    image_cache_root: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> list[GoldExample]:
    """The gold examples of ``split`` (see :func:`generate_gold`; skipped questions dropped)."""
    return generate_gold(world, index, split, image_cache_root, **kwargs).examples


async def _replay_all(
    world: World,
    retriever: Retriever,
    questions: list[Question],
    cache_root: Path | None,
    agent_config: AgentConfig | None,
    with_plan: bool | str,
    progress: bool | Callable[[int, int], None],
    style: str = "full",
) -> GoldReport:
    from local_search import ServeConfig
    from local_search.server import create_search_app
    from mia.agent import AgentConfig, build_tools
    from mia.http import ServerThread

    cfg = (agent_config or AgentConfig()).validate()
    topk = int(cfg.tools.get("search", {}).get("params", {}).get("topk", 3))
    serve = ServeConfig(default_topk=topk, max_topk=max(100, topk))
    report = GoldReport()
    writer = GoldWriter(world, retriever, topk, style)
    with ServerThread(create_search_app(retriever, serve)) as url:
        cfg = replace(cfg, tools=_tools_config(cfg, url, cache_root))
        tools = build_tools(cfg.tools)
        try:
            for done, q in enumerate(_progress(questions, progress), 1):
                try:
                    report.examples.append(
                        await _replay_one(writer, q, tools, cfg, gets_plan(q.id, with_plan))
                    )
                except GoldSkip as why:
                    report.skipped.append(Skipped(q.id, q.type, q.relation, str(why)))
                if callable(progress):
                    progress(done, len(questions))
        finally:
            await tools.aclose()
    report.variant_use = dict(sorted(writer.variant_use.items()))
    return report


def _progress(questions: list[Question], progress: bool | Callable[[int, int], None]) -> Any:
    if progress is True:
        from tqdm import tqdm

        return tqdm(questions, desc="gold", unit="q")
    return questions


async def _replay_one(
    writer: GoldWriter,
    q: Question,
    tools: Any,
    cfg: AgentConfig,
    with_plan: bool,
) -> GoldExample:
    from mia.agent import ChatPolicy, ExecutorLoop
    from mia.llm.scripted import ScriptedChat

    plan = writer.plan(q)
    loop = ExecutorLoop(ChatPolicy(ScriptedChat(_Script(writer.program(q)))), tools, cfg)
    task = {
        "question": q.question,
        "images": [q.image_png] if q.image_png else [],
        "plan": plan if with_plan else None,
        "data_id": q.id,
        "image_caption": q.image_caption or None,
    }
    traj = await loop.run(task)
    validate_replay(traj, q)
    planner = planner_messages(q.question, writer.planner_reply(q, plan), image=q.type == "image")
    reflection = [
        *planner,
        {"role": "user", "content": planner_text.judge_prompt(traj.trace)},
        {"role": "assistant", "content": REFLECTION_DECISION},
    ]
    return GoldExample(
        id=q.id,
        type=q.type,
        relation=q.relation,
        split=q.split,
        question=q.question,
        answer=q.answer,
        plan=plan,
        messages=traj.messages,
        planner_messages=planner,
        reflection_messages=reflection,
    )


# --------------------------------------------------------------------------------------------
# files


def dumps_gold(examples: Sequence[GoldExample]) -> str:
    return "".join(json.dumps(e.to_dict(), ensure_ascii=False) + "\n" for e in examples)


def write_gold(path: str | os.PathLike[str], examples: Sequence[GoldExample]) -> Path:
    """Write ``examples`` as JSONL (one object per line), atomically."""
    out = Path(path)
    if out.is_dir():
        raise MiaError(f"gold: {out} is a folder, not a file")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, dumps_gold(examples))
    return out


def iter_gold(path: str | os.PathLike[str]) -> Iterator[GoldExample]:
    p = Path(path)
    if not p.is_file():
        raise MiaError(f"gold file not found: {p}")
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as err:
                raise MiaError(f"{p.name} line {lineno}: invalid JSON: {err.msg}") from None
            yield GoldExample.from_dict(data, f"{p.name} line {lineno}")


def load_gold(path: str | os.PathLike[str]) -> list[GoldExample]:
    """Read a gold JSONL file; a bad line raises :class:`MiaError` naming it."""
    return list(iter_gold(path))


__all__ = [
    "GoldExample",
    "GoldReport",
    "GoldSkip",
    "GoldWriter",
    "REFLECTION_DECISION",
    "Skipped",
    "build_gold",
    "corpus_sha256",
    "empty_memory_context",
    "evidence",
    "generate_gold",
    "gets_plan",
    "STYLES",
    "iter_gold",
    "load_gold",
    "passage_text",
    "planner_messages",
    "top_image_title",
    "validate_replay",
    "write_gold",
]
