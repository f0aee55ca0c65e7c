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

This module holds the phrase tables and the programs (:class:`GoldWriter`); the records and their
files are :mod:`mia.apps.gold_records`, the turns' text and the reading of observations
:mod:`mia.apps.gold_text`, the replay :mod:`mia.apps.gold_replay`. Their names are importable
from here too.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mia.apps.gold_records import (  # noqa: F401  (re-exported: importers of this module use them)
    GoldExample,
    GoldReport,
    GoldSkip,
    Message,
    Skipped,
    dumps_gold,
    iter_gold,
    load_gold,
    write_gold,
)
from mia.apps.gold_replay import (  # noqa: F401  (as above)
    Program,
    corpus_sha256,
    gets_plan,
    replay_gold,
    validate_replay,
)
from mia.apps.gold_text import (  # noqa: F401  (as above)
    answer_turn,
    cap,
    drawn_query_words,
    evidence,
    has_any,
    image_search_turn,
    passage_text,
    pick,
    search_turn,
    top_image_title,
)

# QUESTION_TYPES is not used here (GoldReport moved) but stays in this namespace: the warm-start
# data key hashes this module's upper-case names, imported ones included
# (mia.apps.warm_start.data_fingerprint), and the shipped adapters' keys pin that set.
from mia.data.world_questions import BRIDGES, QUESTION_TYPES, Facts  # noqa: F401
from mia.errors import MiaError
from mia.prompts import planner as planner_text
from mia.prompts.planner import EMPTY_MEMORY, plan_messages

if TYPE_CHECKING:
    from local_search import Retriever
    from mia.agent import AgentConfig
    from mia.data.world import Question, World
    from mia.data.world_entities import Entity
    from mia.data.world_lexicon import Lexicon

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


# --------------------------------------------------------------------------------------------
# wording helpers


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


def fact_phrase(ent: Entity, rel: str, x: str | None = None, lexicon: Lexicon | None = None) -> str:
    """``the <fact> of <x>`` (``x`` defaults to the entity's name), in ``lexicon``'s nouns."""
    return worded(_rel(ent, rel, FACT_PHRASES, WORK_FACT_PHRASES), lexicon).format(x=x or ent.name)


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
            if any(str(h.id) == pid and has_any(h.contents, needles) for h in hits):
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
            opener = pick(
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
        return cap(conclusion)

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
            " ".join(lines) + f" {cap(verdict)}, so {winner.name} {verb}.", winner.name
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

    def planner_chats(
        self, q: Question, plan: str, trace: str
    ) -> tuple[list[Message], list[Message]]:
        """The plan chat of ``q`` (:func:`planner_messages`) and the reflection chat that
        continues it with the judge prompt over the Executor's ``trace`` and decides ``no``."""
        planner = planner_messages(q.question, self.planner_reply(q, plan), image=q.type == "image")
        reflection = [
            *planner,
            {"role": "user", "content": planner_text.judge_prompt(trace)},
            {"role": "assistant", "content": REFLECTION_DECISION},
        ]
        return planner, reflection


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
# replay through the real loop (mia.apps.gold_replay)


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
    if limit is not None and limit < 0:
        raise MiaError(f"gold: limit must be >= 0, got {limit}")
    if with_plan not in PLAN_MODES:
        raise MiaError(f"gold: with_plan must be True, False or 'alternate', got {with_plan!r}")
    if style not in STYLES:
        raise MiaError(f"gold: style must be one of {STYLES}, got {style!r}")
    questions = list(questions) if questions is not None else _questions(world, split, limit)
    return replay_gold(
        world,
        index,
        questions,
        image_cache_root,
        lambda retriever, topk: GoldWriter(world, retriever, topk, style),
        agent_config=agent_config,
        with_plan=with_plan,
        progress=progress,
    )


def build_gold(
    world: World,
    index: str | os.PathLike[str] | Retriever,
    split: str = "train",
    image_cache_root: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> list[GoldExample]:
    """The gold examples of ``split`` (see :func:`generate_gold`; skipped questions dropped)."""
    return generate_gold(world, index, split, image_cache_root, **kwargs).examples


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
