"""What a world says and how: its lexicon, drawn per seed.

A :class:`Lexicon` holds every surface choice of one world: the nouns of its entity kinds
(a region may be a province, a city a town), how each fact is phrased in the passages and which
of two passage styles they use (encyclopedia or narrative), how each question is worded, and its
conventions: which vague wording ("Who is behind X?") means which relation in this world.

Seeds are split into ranges by ``configs/world/seeds.yaml`` (:class:`SeedRanges`). Legacy seeds
keep the one fixed lexicon of world format 1 (:data:`LEGACY`). Every other seed draws its
lexicon from the pools below; its conventions come only from the wording-meaning pairs of its
own range (:func:`pair_range`), so no test world's convention occurs in a train or dev world.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from mia.data.world_questions import (
    BRIDGES,
    COMPARISONS,
    CONVENTIONS,
    IMAGE_MENTIONS,
    TEMPLATES,
    WORK_VERBS,
    Convention,
)
from mia.errors import MiaError
from mia.paths import config_dir

RANGES = ("legacy", "train", "dev", "test")
DRAWN_RANGES = ("train", "dev", "test")
STYLES = ("encyclopedia", "narrative")
WORK_TYPES = ("novel", "film", "album")
WORK_RELATIONS = ("creator", "year", "producer")


# ----------------------------------------------------------------------------- seed ranges


@dataclass(frozen=True)
class SeedRanges:
    """``range name -> (first, last)`` seeds, inclusive (``configs/world/seeds.yaml``)."""

    ranges: Mapping[str, tuple[int, int]]

    def of(self, seed: int) -> str:
        """The range ``seed`` belongs to; a MiaError for a seed in none."""
        for name in RANGES:
            first, last = self.ranges[name]
            if first <= seed <= last:
                return name
        raise MiaError(f"world seed {seed} is in no range of configs/world/seeds.yaml")

    def seeds(self, name: str, count: int, start: int = 0) -> list[int]:
        """``count`` seeds of range ``name`` from its ``start``-th on."""
        first, last = self.ranges[name]
        out = list(range(first + start, min(last, first + start + count - 1) + 1))
        if len(out) < count:
            raise MiaError(f"range {name} has no {count} seeds from its {start}-th")
        return out


@cache
def seed_ranges() -> SeedRanges:
    data = yaml.safe_load(Path(config_dir() / "world" / "seeds.yaml").read_text())
    missing = [r for r in RANGES if r not in data]
    if missing:
        raise MiaError(f"configs/world/seeds.yaml lacks the range(s) {missing}")
    ranges = {name: (int(data[name][0]), int(data[name][1])) for name in RANGES}
    spans = sorted(ranges.values())
    if any(a[1] >= b[0] for a, b in zip(spans, spans[1:], strict=False)):
        raise MiaError("configs/world/seeds.yaml: the seed ranges overlap")
    return SeedRanges(ranges)


# ----------------------------------------------------------------------------- the lexicon


@dataclass(frozen=True)
class Lexicon:
    """Every surface choice of one world (see the module docstring).

    Question wordings and descriptions hold ``{x}`` (the entity mention), ``{s}`` (a bridge's
    subject), ``{a}``/``{b}`` (compared entities). ``phrasing`` picks, per fact, one of the
    variants of :mod:`mia.data.world_styles` (``kind.relation -> index``).
    """

    name: str  # "legacy" or "drawn"
    style: str = "encyclopedia"
    nouns: Mapping[str, str] = field(default_factory=lambda: {"region": "region", "city": "city"})
    templates: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    work_verbs: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    bridges: Mapping[str, str] = field(default_factory=dict)  # "kind.rel[.wtype]" -> {s}
    comparisons: Mapping[str, str] = field(default_factory=dict)
    image_mentions: Mapping[str, str] = field(default_factory=dict)
    conventions: tuple[Convention, ...] = ()
    phrasing: Mapping[str, int] = field(default_factory=dict)

    @property
    def legacy(self) -> bool:
        return self.name == "legacy"

    def describe(self, kind: str, rel: str, wtype: str | None = None) -> str:
        """The bridge description of ``kind.rel`` (works: per work type), with ``{s}``."""
        key = f"{kind}.{rel}" + (f".{wtype}" if kind == "work" else "")
        return self.bridges[key]

    def pairs(self) -> set[tuple[str, str]]:
        """This world's conventions as ``(wording, relation)`` pairs."""
        return {(c.wording, c.relation) for c in self.conventions}

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "style": self.style,
            "nouns": dict(self.nouns),
            "conventions": [
                {"id": c.id, "kind": c.kind, "wording": c.wording, "relation": c.relation}
                for c in self.conventions
            ],
        }


def _legacy_bridges() -> dict[str, str]:
    from mia.data.world_entities import Entity

    out: dict[str, str] = {}
    for kind, rel, describe, _target in BRIDGES:
        if kind == "work":
            for wtype in WORK_TYPES:
                probe = Entity("w", "work", "w", {"wtype": wtype})
                out[f"{kind}.{rel}.{wtype}"] = describe(probe)
        else:
            out[f"{kind}.{rel}"] = describe(None)  # type: ignore[arg-type]
    return out


LEGACY = Lexicon(
    name="legacy",
    templates=TEMPLATES,
    work_verbs=WORK_VERBS,
    bridges=_legacy_bridges(),
    comparisons={k: v[1] for k, v in COMPARISONS.items()},
    image_mentions=IMAGE_MENTIONS,
    conventions=CONVENTIONS,
)


# ----------------------------------------------------------------------------- pools
# {city} and {region} stand for the world's nouns of those kinds.

NOUNS = {
    "region": ("region", "province", "district", "county"),
    "city": ("city", "town"),
    # what each kind of organisation is called in its passage
    "org.publisher": ("publishing house", "publisher", "press"),
    "org.studio": ("film studio", "studio", "production company"),
    "org.label": ("record label", "label", "recording company"),
    "org.university": ("university", "college of higher learning"),
    "org.company": ("company", "firm", "corporation"),
    "org.museum": ("museum", "gallery"),
    "org.institute": ("research institute", "institute", "laboratory"),
    "org.orchestra": ("orchestra", "ensemble"),
}

QUESTION_POOL: dict[str, dict[str, tuple[str, ...]]] = {
    "person": {
        "birth_city": (
            "In which {city} was {x} born?",
            "Which {city} is the birthplace of {x}?",
            "{x} was born in which {city}?",
            "In what {city} was {x} born?",
        ),
        "birth_country": (
            "In which country was {x} born?",
            "What is the country of birth of {x}?",
            "{x} was born in which country?",
        ),
        "birth_date": (
            "On what date was {x} born?",
            "What is the date of birth of {x}?",
            "On which day was {x} born?",
        ),
        "birth_year": (
            "In what year was {x} born?",
            "What is the birth year of {x}?",
            "{x} was born in what year?",
        ),
        "death_year": (
            "In what year did {x} die?",
            "What is the year of death of {x}?",
            "In which year did {x} pass away?",
        ),
        "occupation": (
            "What was the profession of {x}?",
            "What did {x} do for a living?",
            "What was the occupation of {x}?",
            "In what line of work was {x}?",
        ),
        "university": (
            "At which university did {x} study?",
            "Which university did {x} attend?",
            "{x} studied at which university?",
        ),
    },
    "org": {
        "founder": (
            "Who founded {x}?",
            "Who is the founder of {x}?",
            "Who established {x}?",
            "By whom was {x} founded?",
        ),
        "hq": (
            "In which {city} is {x} headquartered?",
            "In which {city} does {x} have its head office?",
            "Which {city} is home to the headquarters of {x}?",
        ),
        "founded": (
            "In what year was {x} founded?",
            "In which year was {x} established?",
            "What is the founding year of {x}?",
        ),
    },
    "city": {
        "population": (
            "What is the population of {x}?",
            "How many people live in {x}?",
            "How many inhabitants does {x} have?",
        ),
        "region": (
            "In which {region} is {x} located?",
            "Which {region} is {x} in?",
            "To which {region} does {x} belong?",
        ),
        "country": (
            "In which country is {x} located?",
            "Which country is {x} in?",
            "To which country does {x} belong?",
        ),
        "founded": (
            "In what year was {x} founded?",
            "In which year was {x} founded?",
            "What is the founding year of {x}?",
        ),
        "river": (
            "On which river does {x} lie?",
            "Which river flows through {x}?",
            "On what river is {x} situated?",
        ),
    },
    "country": {
        "capital": (
            "What is the capital of {x}?",
            "Which {city} is the capital of {x}?",
            "Name the capital of {x}.",
        ),
        "language": (
            "What is the official language of {x}?",
            "Which language is official in {x}?",
            "What language is officially spoken in {x}?",
        ),
        "currency": (
            "What is the currency of {x}?",
            "Which currency is used in {x}?",
            "What money does {x} use?",
        ),
    },
    "region": {
        "seat": (
            "What is the administrative seat of {x}?",
            "Which {city} is the seat of {x}?",
            "From which {city} is {x} administered?",
        ),
        "country": (
            "In which country is {x}?",
            "Which country does {x} belong to?",
            "{x} is part of which country?",
        ),
    },
}
WORK_VERB_POOL: dict[str, dict[str, tuple[str, ...]]] = {
    "novel": {
        "creator": ("Who wrote {x}?", "Who is the author of {x}?", "Who penned {x}?"),
        "year": (
            "In what year was {x} published?",
            "In which year did {x} first appear in print?",
            "What year was {x} published?",
        ),
        "producer": (
            "Which publishing house published {x}?",
            "Who was the publisher of {x}?",
            "Which publisher brought out {x}?",
        ),
    },
    "film": {
        "creator": (
            "Who directed {x}?",
            "Who was the director of {x}?",
            "Who directed the film {x}?",
        ),
        "year": (
            "In what year was {x} released?",
            "In which year did {x} come out?",
            "What year was {x} released in cinemas?",
        ),
        "producer": (
            "Which studio produced {x}?",
            "Which film studio produced {x}?",
            "What studio made {x}?",
        ),
    },
    "album": {
        "creator": ("Who recorded {x}?", "Which musician recorded {x}?", "Whose album is {x}?"),
        "year": (
            "In what year was {x} released?",
            "In which year did {x} come out?",
            "What year was {x} released?",
        ),
        "producer": (
            "Which record label released {x}?",
            "On which label was {x} released?",
            "Which label issued {x}?",
        ),
    },
}
BRIDGE_POOL: dict[str, tuple[str, ...]] = {
    "org.founder": ("the founder of {s}", "the person who established {s}"),
    "org.hq": (
        "the {city} where {s} is headquartered",
        "the {city} that is home to {s}",
        "the {city} in which {s} has its head office",
    ),
    "work.creator.novel": ("the author of {s}", "the writer of {s}"),
    "work.creator.film": ("the director of {s}", "the person who directed {s}"),
    "work.creator.album": ("the musician who recorded {s}", "the artist who recorded {s}"),
    "work.producer.novel": ("the publisher of {s}", "the publishing house that published {s}"),
    "work.producer.film": ("the studio that produced {s}", "the film studio of {s}"),
    "work.producer.album": ("the record label that released {s}", "the label that issued {s}"),
    "person.birth_city": ("the {city} where {s} was born", "the {city} of {s}'s birth"),
    "person.birth_country": ("the country where {s} was born", "the country of {s}'s birth"),
    "person.university": ("the university where {s} studied", "the university {s} attended"),
    "city.country": ("the country in which {s} lies", "the country where {s} is located"),
}
COMPARISON_POOL: dict[str, tuple[str, ...]] = {
    "person": (
        "Who was born earlier, {a} or {b}?",
        "Which of {a} and {b} was born first?",
        "Who is older, {a} or {b}?",
    ),
    "org": (
        "Which was founded earlier, {a} or {b}?",
        "Which of {a} and {b} was established first?",
        "Which is older, {a} or {b}?",
    ),
    "city": (
        "Which {city} has the larger population, {a} or {b}?",
        "Which is more populous, {a} or {b}?",
        "Which of {a} and {b} has more inhabitants?",
    ),
    "work": (
        "Which came out first, {a} or {b}?",
        "Which was released earlier, {a} or {b}?",
        "Which of {a} and {b} appeared first?",
    ),
}
IMAGE_POOL: dict[str, tuple[str, ...]] = {
    "org": ("the organisation whose emblem is shown", "the organisation with the emblem pictured"),
    "country": ("the country whose flag is shown", "the country with the flag pictured"),
    "city": ("the {city} whose coat of arms is shown", "the {city} with the coat of arms pictured"),
}

# How many phrasing variants each fact has in mia.data.world_styles (kept in step there).
PHRASING_VARIANTS = {
    "person.birth": 3,
    "person.university": 2,
    "org.hq": 3,
    "org.founder": 3,
    "work.creator": 2,
    "work.producer": 2,
    "city.region": 2,
    "city.founded": 2,
    "city.river": 2,
    "region.seat": 2,
    "country.capital": 2,
    "country.language": 2,
}


# ----------------------------------------------------------------------------- conventions


@dataclass(frozen=True)
class Family:
    """Vague wordings about one kind that could each mean any of ``readings``."""

    id: str
    kind: str
    readings: tuple[str, ...]
    wordings: tuple[str, ...]


FAMILIES: tuple[Family, ...] = (
    Family(
        "person.place",
        "person",
        ("birth_city", "birth_country"),
        (
            "Where is {x} from?",
            "Where does {x} come from?",
            "Where does {x} hail from?",
            "What place does {x} call home?",
            "Where are {x}'s roots?",
            "Which place is {x} a native of?",
            "Where did {x}'s story begin?",
            "Where did {x} grow up?",
        ),
    ),
    Family(
        "person.time",
        "person",
        ("birth_year", "birth_date"),
        (
            "When was {x} born?",
            "When did {x} come into the world?",
            "When did {x}'s life begin?",
            "When is {x}'s birth recorded?",
            "When did {x} arrive in the world?",
            "What is {x}'s birth?",
        ),
    ),
    Family(
        "org.place",
        "org",
        ("hq", "hq_country"),
        (
            "Where is {x}?",
            "Where is {x} based?",
            "Where does {x} operate from?",
            "Where can one find {x}?",
            "Where is {x} run from?",
            "Where is {x} at home?",
        ),
    ),
    Family(
        "city.place",
        "city",
        ("region", "country", "river"),
        (
            "Where does {x} lie?",
            "Where is {x} situated?",
            "Where would one find {x}?",
            "What is {x} part of?",
            "Where does {x} sit?",
        ),
    ),
    Family(
        "work.person",
        "work",
        ("creator", "producer"),
        (
            "Who is behind {x}?",
            "Who put out {x}?",
            "Who gave us {x}?",
            "Who is responsible for {x}?",
            "Who brought {x} into being?",
            "Who made {x}?",
        ),
    ),
    Family(
        "org.origin",
        "org",
        ("founder", "founded"),
        (
            "How did {x} begin?",
            "What is known about the start of {x}?",
            "What was the beginning of {x}?",
            "How did {x} come about?",
        ),
    ),
    Family(
        "country.use",
        "country",
        ("language", "currency", "capital"),
        (
            "What do people use in {x}?",
            "What is standard in {x}?",
            "What is central to {x}?",
            "What does everyone in {x} share?",
        ),
    ),
)
# Shares of each family's wording-meaning pairs that go to the test and dev ranges (the rest:
# train), by the pair's hash: fixed by the code, the same on every machine.
TEST_SHARE, DEV_SHARE = 0.25, 0.2


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def pair_ranges() -> dict[tuple[str, str], str]:
    """Every ``(wording, relation)`` pair of :data:`FAMILIES` -> the range it belongs to."""
    out: dict[tuple[str, str], str] = {}
    for fam in FAMILIES:
        pairs = sorted(
            ((w, r) for w in fam.wordings for r in fam.readings),
            key=lambda p: _digest(f"{fam.id}|{p[0]}|{p[1]}"),
        )
        n_test = max(1, round(TEST_SHARE * len(pairs)))
        n_dev = max(1, round(DEV_SHARE * len(pairs)))
        for i, pair in enumerate(pairs):
            out[pair] = "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
    return out


def pair_range(wording: str, relation: str) -> str:
    return pair_ranges()[(wording, relation)]


def _slug(text: str) -> str:
    words = [w.strip("?'.,").lower() for w in text.replace("{x}", " ").split()]
    return "_".join(w.removesuffix("'s") for w in words if w)


def _draw_conventions(rng: random.Random, where: str) -> tuple[Convention, ...]:
    """One convention per family, from the pairs of range ``where``: a wording and the one
    relation it means in this world."""
    out = []
    ranges = pair_ranges()
    for fam in FAMILIES:
        pairs = sorted(
            (w, r) for w in fam.wordings for r in fam.readings if ranges[(w, r)] == where
        )
        wording, relation = rng.choice(pairs)
        out.append(
            Convention(
                id=f"{fam.kind}.{_slug(wording)}",
                kind=fam.kind,
                wording=wording,
                relation=relation,
                held_out=False,
                readings=fam.readings,
            )
        )
    return tuple(out)


# ----------------------------------------------------------------------------- drawing


def _fill_nouns(text: str, nouns: Mapping[str, str]) -> str:
    return text.replace("{city}", nouns["city"]).replace("{region}", nouns["region"])


def draw_lexicon(seed: int, where: str) -> Lexicon:
    """The lexicon of drawn world ``seed`` of range ``where`` (train, dev or test)."""
    if where not in DRAWN_RANGES:
        raise MiaError(f"no drawn lexicon for the {where} range")
    rng = random.Random(f"mia-world:{seed}:lexicon")
    nouns = {kind: rng.choice(pool) for kind, pool in NOUNS.items()}
    fill = lambda text: _fill_nouns(text, nouns)  # noqa: E731
    templates = {
        kind: {rel: fill(rng.choice(pool)) for rel, pool in rels.items()}
        for kind, rels in QUESTION_POOL.items()
    }
    templates["work"] = {rel: "" for rel in WORK_RELATIONS}  # phrased per work type
    work_verbs = {
        wtype: tuple(fill(rng.choice(rels[r])) for r in WORK_RELATIONS)
        for wtype, rels in WORK_VERB_POOL.items()
    }
    return Lexicon(
        name="drawn",
        style=rng.choice(STYLES),
        nouns=nouns,
        templates=templates,
        work_verbs=work_verbs,  # type: ignore[arg-type]
        bridges={key: fill(rng.choice(pool)) for key, pool in BRIDGE_POOL.items()},
        comparisons={kind: fill(rng.choice(pool)) for kind, pool in COMPARISON_POOL.items()},
        image_mentions={kind: fill(rng.choice(pool)) for kind, pool in IMAGE_POOL.items()},
        conventions=_draw_conventions(rng, where),
        phrasing={fact: rng.randrange(n) for fact, n in PHRASING_VARIANTS.items()},
    )


def lexicon_for(seed: int) -> Lexicon:
    """The lexicon of world ``seed``: :data:`LEGACY` for a legacy seed, else drawn."""
    where = seed_ranges().of(seed)
    return LEGACY if where == "legacy" else draw_lexicon(seed, where)
