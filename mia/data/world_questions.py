"""Questions over the synthetic world, and the checks that make them honest.

Every question is built from one *template per relation* that takes a mention ``{x}`` of the
entity: its name (single hop), a description through another entity (bridge: "the founder of
Vorlanic Institute"), or a pointer to a picture (image: "the organisation whose emblem is shown").

Validity rules (enforced here, re-checked by the tests via :func:`question_problems`):

* every type: the canonical answer occurs (as a whole phrase) in a supporting passage and not in
  the question (except comparisons, whose answer is one of the two names asked about);
* ``single_hop``: one supporting passage, the subject's own, which names the subject;
* ``bridge``: two distinct supporting passages ``[subject's, bridge entity's]``; the bridge
  entity's name is not in the question, is in the first passage; the answer (and every alias) is
  not in the first passage but is in the second; and **no passage of the corpus contains both the
  subject's name and the answer or an alias** - so no single retrieval can shortcut the hop;
* ``comparison``: two supporting passages, one per named entity; the answer is one of the names;
* ``image``: the subject is named neither in the question nor in the image caption, the answer is
  not in the caption, and the answer is in the subject's passage.
"""

from __future__ import annotations

import io
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from mia.data.world_entities import Entity, date_aliases, format_date, format_number
from mia.data.world_text import Passage

QUESTION_TYPES = ("single_hop", "bridge", "comparison", "image", "convention")
TEXT_TYPES = ("single_hop", "bridge", "comparison")  # the research question types
LEVELS = {"single_hop": 1, "bridge": 2, "comparison": 2, "image": 2, "convention": 1}

# Category of the answer, matching the memory buckets of the Manager.
REL_CATEGORY = {
    "birth_city": "location", "birth_country": "location", "birth_date": "time",
    "birth_year": "time", "death_year": "time", "occupation": "career", "university": "others",
    "founder": "human", "hq": "location", "founded": "time", "population": "property",
    "region": "location", "country": "location", "river": "location", "capital": "location",
    "language": "property", "currency": "property", "creator": "human", "year": "time",
    "producer": "others", "seat": "location", "hq_country": "location",
}  # fmt: skip

WORK_VERBS = {
    "novel": (
        "Who wrote {x}?",
        "In what year was {x} published?",
        "Which publishing house published {x}?",
    ),
    "film": ("Who directed {x}?", "In what year was {x} released?", "Which studio produced {x}?"),
    "album": (
        "Who recorded {x}?",
        "In what year was {x} released?",
        "Which record label released {x}?",
    ),
}
TEMPLATES: dict[str, dict[str, str]] = {
    "person": {
        "birth_city": "In which city was {x} born?",
        "birth_country": "In which country was {x} born?",
        "birth_date": "On what date was {x} born?",
        "birth_year": "In what year was {x} born?",
        "death_year": "In what year did {x} die?",
        "occupation": "What was the profession of {x}?",
        "university": "At which university did {x} study?",
    },
    "org": {
        "founder": "Who founded {x}?",
        "hq": "In which city is {x} headquartered?",
        "founded": "In what year was {x} founded?",
    },
    "city": {
        "population": "What is the population of {x}?",
        "region": "In which region is {x} located?",
        "country": "In which country is {x} located?",
        "founded": "In what year was {x} founded?",
        "river": "On which river does {x} lie?",
    },
    "country": {
        "capital": "What is the capital of {x}?",
        "language": "What is the official language of {x}?",
        "currency": "What is the currency of {x}?",
    },
    "region": {
        "seat": "What is the administrative seat of {x}?",
        "country": "In which country is {x}?",
    },
    "work": {"creator": "", "year": "", "producer": ""},  # phrased per work type: WORK_VERBS
}
IMAGE_MENTIONS = {
    "org": "the organisation whose emblem is shown",
    "country": "the country whose flag is shown",
    "city": "the city whose coat of arms is shown",
}
COMPARISONS = {
    # kind: (relation, question, key(entity) -> comparable, pick smallest?)
    "person": ("birth_date", "Who was born earlier, {a} or {b}?", lambda e: e.attrs["birth"], True),
    "org": (
        "founded",
        "Which was founded earlier, {a} or {b}?",
        lambda e: e.attrs["founded"],
        True,
    ),
    "city": (
        "population",
        "Which city has the larger population, {a} or {b}?",
        lambda e: e.attrs["population"],
        False,
    ),
    "work": ("year", "Which came out first, {a} or {b}?", lambda e: e.attrs["year"], True),
}
COMPARISON_CATEGORY = {"person": "human", "org": "others", "city": "location", "work": "others"}


@dataclass(frozen=True)
class Convention:
    """A vague question wording whose meaning is this world's convention: "Where is X from?"
    could ask for a city or a country; here it asks for one of them, always the same. Nothing in
    the question says which: a researcher learns it from feedback on earlier questions of the
    same wording -- what workflow memory is for. ``held_out`` wordings occur only in test splits,
    so no training data (gold, SFT, GRPO) ever contains them."""

    id: str
    kind: str  # entity kind
    wording: str  # with {x}
    relation: str
    held_out: bool
    readings: tuple[str, ...] = ()  # every relation the wording could mean (the convention's too)


CONVENTIONS: tuple[Convention, ...] = (
    # seen in training (both splits)
    Convention(
        "person.from",
        "person",
        "Where is {x} from?",
        "birth_city",
        False,
        ("birth_city", "birth_country"),
    ),
    Convention(
        "person.when",
        "person",
        "When was {x} born?",
        "birth_year",
        False,
        ("birth_year", "birth_date"),
    ),
    Convention("org.where", "org", "Where is {x}?", "hq", False, ("hq", "hq_country")),
    Convention("city.where", "city", "Where is {x}?", "region", False, ("region", "country")),
    Convention(
        "work.behind", "work", "Who is behind {x}?", "creator", False, ("creator", "producer")
    ),
    Convention(
        "country.speak", "country", "What do people speak in {x}?", "language", False, ("language",)
    ),
    # held out: test splits only; the obvious reading is often not the convention
    Convention(
        "person.origin",
        "person",
        "Where does {x} come from?",
        "birth_country",
        True,
        ("birth_city", "birth_country"),
    ),
    Convention(
        "person.arrival",
        "person",
        "When did {x} come into the world?",
        "birth_date",
        True,
        ("birth_year", "birth_date"),
    ),
    Convention("org.base", "org", "Where is {x} based?", "hq_country", True, ("hq", "hq_country")),
    Convention(
        "city.lie", "city", "Where does {x} lie?", "country", True, ("region", "country", "river")
    ),
    Convention(
        "work.put_out", "work", "Who put out {x}?", "producer", True, ("creator", "producer")
    ),
    Convention("city.age", "city", "How old is {x}?", "founded", True, ("founded",)),
)
HELD_OUT_TEMPLATES = frozenset(c.id for c in CONVENTIONS if c.held_out)


@dataclass
class Question:
    """One question of the world, with everything needed to write both QA formats."""

    id: str
    type: str  # single_hop | bridge | comparison | image
    question: str
    answer: str
    aliases: list[str]
    supporting_ids: list[str]
    split: str = "train"
    category: str = "others"
    level: int = 1
    relation: str = ""
    entity_ids: list[str] = field(default_factory=list)  # subject(s), then the bridge entity
    image_caption: str = ""
    image_png: bytes | None = None
    template: str = ""  # convention questions: the wording's id (CONVENTIONS)
    held_out: bool = False  # a wording that never occurs in a train split

    @property
    def modality(self) -> str:
        return "text-image" if self.type == "image" else "text-only"

    @property
    def answers(self) -> list[str]:
        return [self.answer, *self.aliases]

    @property
    def image(self) -> Image.Image | None:
        """The question's picture (decoded from :attr:`image_png`), for image questions."""
        if self.image_png is None:
            return None
        return Image.open(io.BytesIO(self.image_png))


class TextIndex:
    """Which passages contain a phrase as whole words; cached, word-index accelerated."""

    _WORD = re.compile(r"\w+")

    def __init__(self, passages: list[Passage]) -> None:
        self.passages = passages
        self.by_id = {p.id: p for p in passages}
        self.texts = [p.contents for p in passages]
        self.words: dict[str, set[int]] = {}
        for i, text in enumerate(self.texts):
            for w in set(self._WORD.findall(text)):
                self.words.setdefault(w, set()).add(i)
        self._cache: dict[str, frozenset[int]] = {}

    def containing(self, phrase: str) -> frozenset[int]:
        if phrase not in self._cache:
            words = self._WORD.findall(phrase)
            pools = [self.words.get(w, set()) for w in words]
            candidates = set.intersection(*pools) if pools else set(range(len(self.texts)))
            self._cache[phrase] = frozenset(
                i for i in candidates if contains(self.texts[i], phrase)
            )
        return self._cache[phrase]


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def contains(text: str, phrase: str) -> bool:
    """Whether ``phrase`` occurs in ``text`` as a whole phrase (not inside a longer word)."""
    if not phrase:
        return False
    start = text.find(phrase)
    while start >= 0:
        end = start + len(phrase)
        before_ok = start == 0 or not (_is_word_char(text[start - 1]) and _is_word_char(phrase[0]))
        after_ok = end == len(text) or not (_is_word_char(text[end]) and _is_word_char(phrase[-1]))
        if before_ok and after_ok:
            return True
        start = text.find(phrase, start + 1)
    return False


# --------------------------------------------------------------------------------------------
# facts


class Facts:
    """Answers (canonical + aliases) and passage lookups for entity relations. ``lexicon``
    (:class:`mia.data.world_lexicon.Lexicon`): how questions are worded; None = the fixed
    wordings of this module (world format 1)."""

    def __init__(
        self, entities: dict[str, Entity], passages: list[Passage], lexicon: Any = None
    ) -> None:
        self.e = entities
        self.passage_of = {p.entity_id: p for p in passages if p.entity_id}
        self.lexicon = lexicon

    def relations(self, ent: Entity) -> list[str]:
        rels = list(TEMPLATES[ent.kind])
        if ent.kind == "person":
            if not ent.attrs["death"]:
                rels.remove("death_year")
            if not ent.attrs["university"]:
                rels.remove("university")
        if ent.kind == "work" and not ent.attrs["producer"]:
            rels.remove("producer")
        return rels

    def answer(self, ent: Entity, rel: str) -> tuple[str, list[str]]:
        a, name = ent.attrs, self.e.__getitem__
        if ent.kind == "person":
            if rel == "birth_city":
                return name(a["birth_city"]).name, []
            if rel == "birth_country":
                return name(name(a["birth_city"]).attrs["country"]).name, []
            if rel == "birth_date":
                return format_date(a["birth"]), date_aliases(a["birth"])
            if rel == "birth_year":
                return str(a["birth"].year), []
            if rel == "death_year":
                return str(a["death"].year), []
            if rel == "occupation":
                return a["occupation"], []
            if rel == "university":
                return name(a["university"]).name, []
        if ent.kind == "org":
            if rel in ("founder", "hq"):
                return name(a[rel]).name, []
            if rel == "hq_country":
                return name(name(a["hq"]).attrs["country"]).name, []
            if rel == "founded":
                return str(a["founded"]), []
        if ent.kind == "city":
            if rel == "population":
                return format_number(a["population"]), [str(a["population"])]
            if rel in ("region", "country"):
                return name(a[rel]).name, []
            if rel == "founded":
                return str(a["founded"]), []
            if rel == "river":
                return a["river"], [a["river"].removesuffix(" River")]
        if ent.kind == "country":
            if rel == "capital":
                return name(a["capital"]).name, []
            return a[rel], []
        if ent.kind == "region" and rel in ("seat", "country"):
            return name(a[rel]).name, []
        if ent.kind == "work":
            if rel in ("creator", "producer"):
                return name(a[rel]).name, []
            if rel == "year":
                return str(a["year"]), []
        raise KeyError(f"{ent.kind}.{rel}")

    def template(self, ent: Entity, rel: str) -> str:
        lex = self.lexicon
        if ent.kind == "work":
            verbs = (lex.work_verbs if lex else WORK_VERBS)[ent.attrs["wtype"]]
            return verbs[["creator", "year", "producer"].index(rel)]
        return (lex.templates if lex else TEMPLATES)[ent.kind][rel]


# Bridges: (subject kind, description of the bridge entity, attribute holding the bridge id).
def _work_maker(w: Entity) -> str:
    return {
        "novel": "the author of {s}",
        "film": "the director of {s}",
        "album": "the musician who recorded {s}",
    }[w.attrs["wtype"]]


def _work_producer(w: Entity) -> str:
    return {
        "novel": "the publisher of {s}",
        "film": "the studio that produced {s}",
        "album": "the record label that released {s}",
    }[w.attrs["wtype"]]


BRIDGES: list[
    tuple[str, str, Callable[[Entity], str], Callable[[Entity, dict[str, Entity]], str | None]]
] = [
    ("org", "founder", lambda o: "the founder of {s}", lambda o, e: o.attrs["founder"]),
    ("org", "hq", lambda o: "the city where {s} is headquartered", lambda o, e: o.attrs["hq"]),
    ("work", "creator", _work_maker, lambda w, e: w.attrs["creator"]),
    ("work", "producer", _work_producer, lambda w, e: w.attrs["producer"]),
    (
        "person",
        "birth_city",
        lambda p: "the city where {s} was born",
        lambda p, e: p.attrs["birth_city"],
    ),
    (
        "person",
        "birth_country",
        lambda p: "the country where {s} was born",
        lambda p, e: e[p.attrs["birth_city"]].attrs["country"],
    ),
    (
        "person",
        "university",
        lambda p: "the university where {s} studied",
        lambda p, e: p.attrs["university"],
    ),
    ("city", "country", lambda c: "the country in which {s} lies", lambda c, e: c.attrs["country"]),
]


# --------------------------------------------------------------------------------------------
# generation


class QuestionMaker:
    def __init__(
        self,
        rng: random.Random,
        entities: dict[str, Entity],
        passages: list[Passage],
        index: TextIndex,
        captions: dict[str, str],
        lexicon: Any = None,
    ) -> None:
        self.rng = rng
        self.e = entities
        self.passages = passages
        self.index = index
        self.facts = Facts(entities, passages, lexicon)
        self.captions = captions  # entity id -> picture caption (image-bearing entities)
        self.lexicon = lexicon  # None: the fixed wordings of this module

    def _describe(self, kind: str, rel: str, describe: Callable[[Entity], str], e: Entity) -> str:
        if self.lexicon is None:
            return describe(e)
        return self.lexicon.describe(kind, rel, e.attrs.get("wtype"))

    def pid(self, entity_id: str) -> str:
        return self.facts.passage_of[entity_id].id

    def _q(self, **kw: Any) -> Question:
        q = Question(id="", level=LEVELS[kw["type"]], **kw)
        return q

    # -- candidates per type --------------------------------------------------------------------
    def single_hop(self) -> Iterable[Question]:
        for ent in self.e.values():
            rel = self.rng.choice(self.facts.relations(ent))
            answer, aliases = self.facts.answer(ent, rel)
            yield self._q(
                type="single_hop",
                question=self.facts.template(ent, rel).format(x=ent.name),
                answer=answer,
                aliases=aliases,
                supporting_ids=[self.pid(ent.id)],
                category=REL_CATEGORY[rel],
                relation=f"{ent.kind}.{rel}",
                entity_ids=[ent.id],
            )

    def bridge(self) -> Iterable[Question]:
        for kind, rel, describe, target in BRIDGES:
            for subj in (e for e in self.e.values() if e.kind == kind):
                mid_id = target(subj, self.e)
                if not mid_id:
                    continue
                mid = self.e[mid_id]
                # "The profession of the author of <novel>" answers itself: skip such targets.
                rels = [
                    r
                    for r in self.facts.relations(mid)
                    if not (rel == "creator" and r == "occupation")
                ]
                rel2 = self.rng.choice(rels)
                answer, aliases = self.facts.answer(mid, rel2)
                mention = self._describe(kind, rel, describe, subj).format(s=subj.name)
                yield self._q(
                    type="bridge",
                    question=self.facts.template(mid, rel2).format(x=mention),
                    answer=answer,
                    aliases=aliases,
                    supporting_ids=[self.pid(subj.id), self.pid(mid.id)],
                    category=REL_CATEGORY[rel2],
                    relation=f"{kind}.{rel}>{mid.kind}.{rel2}",
                    entity_ids=[subj.id, mid.id],
                )

    def comparison(self) -> Iterable[Question]:
        for kind, (rel, text, key, smallest) in COMPARISONS.items():
            if self.lexicon is not None:
                text = self.lexicon.comparisons[kind]
            pool = [e for e in self.e.values() if e.kind == kind]
            for a in pool:
                # A near-miss twin is the most confusable partner; else anyone of the same kind.
                twins = [e for e in pool if e.twin_of == a.id]
                b = twins[0] if twins and self.rng.random() < 0.5 else self.rng.choice(pool)
                if b.id == a.id or key(a) == key(b):
                    continue
                first, second = (a, b) if self.rng.random() < 0.5 else (b, a)
                pick = min if smallest else max
                winner = pick((a, b), key=key)
                yield self._q(
                    type="comparison",
                    question=text.format(a=first.name, b=second.name),
                    answer=winner.name,
                    aliases=[],
                    supporting_ids=[self.pid(first.id), self.pid(second.id)],
                    category=COMPARISON_CATEGORY[kind],
                    relation=f"{kind}.{rel}",
                    entity_ids=[first.id, second.id],
                )

    def image(self) -> Iterable[Question]:
        for ent in self.e.values():
            if ent.id not in self.captions:
                continue
            rel = self.rng.choice(self.facts.relations(ent))
            answer, aliases = self.facts.answer(ent, rel)
            yield self._q(
                type="image",
                question=self.facts.template(ent, rel).format(x=self._image_mention(ent.kind)),
                answer=answer,
                aliases=aliases,
                supporting_ids=[self.pid(ent.id)],
                category=REL_CATEGORY[rel],
                relation=f"{ent.kind}.{rel}",
                entity_ids=[ent.id],
                image_caption=self.captions[ent.id],
            )

    def _image_mention(self, kind: str) -> str:
        return (self.lexicon.image_mentions if self.lexicon else IMAGE_MENTIONS)[kind]

    def convention(self) -> Iterable[Question]:
        for conv in self.lexicon.conventions if self.lexicon else CONVENTIONS:
            for ent in (e for e in self.e.values() if e.kind == conv.kind):
                if conv.relation not in (*self.facts.relations(ent), "hq_country"):
                    continue
                answer, aliases = self.facts.answer(ent, conv.relation)
                yield self._q(
                    type="convention",
                    question=conv.wording.format(x=ent.name),
                    answer=answer,
                    aliases=aliases,
                    supporting_ids=[self.pid(ent.id)],
                    category=REL_CATEGORY[conv.relation],
                    relation=f"{ent.kind}.{conv.relation}",
                    entity_ids=[ent.id],
                    template=conv.id,
                    held_out=conv.held_out,
                )

    # -- selection --------------------------------------------------------------------------------
    def select(self, qtype: str, quota: int) -> list[Question]:
        """Up to ``quota`` valid questions, no subject twice, spread evenly by round robin over
        relations - for image questions first over the kind of picture, then relations."""
        groups: dict[str, dict[str, list[Question]]] = {}
        for q in getattr(self, qtype)():
            if not question_problems(q, self.e, self.passages, self.index):
                top = q.relation.split(".", 1)[0] if qtype == "image" else q.relation
                sub = q.template or q.relation  # conventions: even over wordings
                groups.setdefault(top if not q.template else sub, {}).setdefault(sub, []).append(q)
        for rels in groups.values():
            for qs in rels.values():
                self.rng.shuffle(qs)
        cursor = {kind: 0 for kind in groups}
        chosen: list[Question] = []
        used: set[str] = set()
        while len(chosen) < quota and any(qs for rels in groups.values() for qs in rels.values()):
            for kind in sorted(groups):
                rels = [groups[kind][r] for r in sorted(groups[kind]) if groups[kind][r]]
                while rels:
                    qs = rels[cursor[kind] % len(rels)]
                    cursor[kind] += 1
                    q = qs.pop()
                    if q.entity_ids[0] not in used:
                        used.add(q.entity_ids[0])
                        chosen.append(q)
                        break
                    rels = [r for r in rels if r]
                if len(chosen) >= quota:
                    break
        return chosen


# --------------------------------------------------------------------------------------------
# checks


def question_problems(
    q: Question,
    entities: dict[str, Entity],
    passages: list[Passage],
    index: TextIndex | None = None,
) -> list[str]:
    """Every way ``q`` breaks the validity rules of this module (``[]`` when it is sound)."""
    index = index or TextIndex(passages)
    problems: list[str] = []
    support = [index.by_id.get(pid) for pid in q.supporting_ids]
    if any(p is None for p in support):
        return [f"unknown supporting id in {q.supporting_ids}"]
    texts = [p.contents for p in support]  # type: ignore[union-attr]
    names = [entities[eid].name for eid in q.entity_ids]
    answers = [q.answer, *q.aliases]
    if not any(contains(t, q.answer) for t in texts):
        problems.append("answer not in any supporting passage")
    if q.type != "comparison" and any(contains(q.question, a) for a in answers):
        problems.append("answer appears in the question")
    if q.type in ("single_hop", "convention"):
        if (
            len(texts) != 1
            or not contains(q.question, names[0])
            or not contains(texts[0], names[0])
        ):
            problems.append("single hop must name its subject, whose passage supports it")
    elif q.type == "bridge":
        subject, bridge = names
        if len(set(q.supporting_ids)) != 2:
            problems.append("bridge needs two distinct passages")
        if contains(q.question, bridge):
            problems.append("bridge entity named in the question")
        if not contains(q.question, subject):
            problems.append("subject not named in the question")
        if not contains(texts[0], bridge):
            problems.append("first passage does not name the bridge entity")
        if any(contains(texts[0], a) for a in answers):
            problems.append("answer in the first passage")
        if not contains(texts[1], q.answer):
            problems.append("answer not in the second passage")
        shortcut = index.containing(subject) & frozenset().union(
            *(index.containing(a) for a in answers)
        )
        if shortcut:
            problems.append(f"passages {sorted(shortcut)[:3]} hold both subject and answer")
    elif q.type == "comparison":
        if (
            len(texts) != 2
            or q.answer not in names
            or not all(contains(q.question, n) for n in names)
        ):
            problems.append("comparison must name both entities and answer with one")
    elif q.type == "image":
        subject = names[0]
        if contains(q.question, subject) or contains(q.image_caption, subject):
            problems.append("image question names its subject")
        if any(contains(q.image_caption, a) for a in answers):
            problems.append("answer in the image caption")
        if not q.image_caption:
            problems.append("image question without caption")
    else:
        problems.append(f"unknown type {q.type!r}")
    return problems
