"""The entity graph of the synthetic world: places, people, organisations and works.

Relations point one way only (a person names their birth city; an organisation names its founder
and headquarters; a work names its creator and producer), and each relation is written only in the
passage of the entity that holds it. That is what makes two-hop questions truly two-hop: the
passage that names the bridge entity does not also carry the answer.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

from mia.data.world_emblem import Emblem, EmblemBook
from mia.data.world_names import (
    CITY_SUFFIXES,
    COUNTRY_SUFFIXES,
    REGION_SUFFIXES,
    NameBook,
    demonym,
    language_name,
)

MONTHS = [
    "January", "February", "March", "April", "May", "June",
    "July", "August", "September", "October", "November", "December",
]  # fmt: skip

# Organisation types: name suffixes, and which kind of work each produces (if any).
ORG_TYPES: dict[str, dict[str, Any]] = {
    "publisher": {"suffixes": ["Press", "Books", "Publishing"], "noun": "publishing house"},
    "studio": {"suffixes": ["Pictures", "Studios", "Films"], "noun": "film studio"},
    "label": {"suffixes": ["Records", "Sound", "Music"], "noun": "record label"},
    "university": {"suffixes": ["University"], "noun": "university"},
    "company": {"suffixes": ["Industries", "Holdings", "Group", "Works"], "noun": "company"},
    "museum": {"suffixes": ["Museum", "Gallery"], "noun": "museum"},
    "institute": {
        "suffixes": ["Institute", "Observatory", "Laboratory"],
        "noun": "research institute",
    },
    "orchestra": {"suffixes": ["Philharmonic", "Orchestra", "Ensemble"], "noun": "orchestra"},
}
ORG_TYPE_WEIGHTS = {
    "publisher": 3, "studio": 2, "label": 2, "university": 2,
    "company": 3, "museum": 1, "institute": 1, "orchestra": 1,
}  # fmt: skip
WORK_TYPES: dict[str, dict[str, Any]] = {
    "novel": {"maker": "writer", "producer": "publisher", "genres": ["historical", "crime", "science fiction", "literary", "fantasy"]},
    "film": {"maker": "film director", "producer": "studio", "genres": ["drama", "comedy", "thriller", "documentary", "war"]},
    "album": {"maker": "musician", "producer": "label", "genres": ["jazz", "folk", "rock", "electronic", "choral"]},
}  # fmt: skip
OCCUPATIONS = {
    "writer": 5, "film director": 3, "musician": 3, "physicist": 2, "chemist": 1,
    "entrepreneur": 3, "architect": 1, "painter": 1, "engineer": 2,
}  # fmt: skip
FIELDS = {
    "writer": "literature", "film director": "film", "musician": "music", "physicist": "physics",
    "chemist": "chemistry", "entrepreneur": "economics", "architect": "architecture",
    "painter": "fine art", "engineer": "engineering",
}  # fmt: skip
TITLE_ADJECTIVES = [
    "Silent",
    "Last",
    "Hollow",
    "Crimson",
    "Northern",
    "Distant",
    "Quiet",
    "Burning",
    "Winter",
    "Golden",
    "Broken",
    "Long",
    "Iron",
    "Paper",
    "Glass",
    "Hidden",
]
TITLE_NOUNS = [
    "Harbour",
    "Orchard",
    "Lantern",
    "River",
    "Garden",
    "Tower",
    "Letters",
    "Bells",
    "Road",
    "Shore",
    "Mirror",
    "Season",
    "Archive",
    "Bridge",
    "Compass",
    "Meadow",
]
CURRENCY_NOUNS = ["crown", "mark", "florin", "talar", "dinar"]
FIRST_YEAR, LAST_YEAR = 1850, 2024


@dataclass
class Entity:
    """One thing in the world. ``attrs`` hold facts; ids in attrs refer to other entities."""

    id: str
    kind: str  # country | region | city | person | org | work
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)
    emblem: Emblem | None = None
    twin_of: str | None = None  # near-miss copy of another entity (a distractor)


def format_date(d: dt.date) -> str:
    return f"{d.day} {MONTHS[d.month - 1]} {d.year}"


def date_aliases(d: dt.date) -> list[str]:
    return [f"{MONTHS[d.month - 1]} {d.day}, {d.year}", d.isoformat()]


def format_number(n: int) -> str:
    return f"{n:,}"


def _random_date(rng: random.Random, year: int) -> dt.date:
    start = dt.date(year, 1, 1).toordinal()
    return dt.date.fromordinal(start + rng.randrange(365))


def _weighted(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


class EntityBuilder:
    """Builds the entity graph for one world from a seeded stream."""

    def __init__(self, rng: random.Random, cfg: Any) -> None:
        self.rng = rng
        self.cfg = cfg
        self.names = NameBook(rng)
        self.emblems = EmblemBook(rng)
        self.entities: dict[str, Entity] = {}
        self.by_kind: dict[str, list[Entity]] = {}

    def _add(self, entity: Entity) -> Entity:
        self.entities[entity.id] = entity
        self.by_kind.setdefault(entity.kind, []).append(entity)
        return entity

    def _id(self, kind: str) -> str:
        return f"{kind}-{len(self.by_kind.get(kind, [])):05d}"

    def build(self) -> dict[str, Entity]:
        self._places()
        self._people()
        self._organisations()
        self._works()
        self._twins()
        return self.entities

    # -- places -------------------------------------------------------------------------------
    def _places(self) -> None:
        rng, cfg = self.rng, self.cfg
        for _ in range(cfg.countries):
            name = self.names.word((2, 2), COUNTRY_SUFFIXES)
            language = language_name(name)
            self.names.used.add(language.lower())
            country = self._add(
                Entity(
                    self._id("country"),
                    "country",
                    name,
                    {
                        "demonym": demonym(name),
                        "language": language,
                        "currency": f"{self.names.word((2, 2))} {rng.choice(CURRENCY_NOUNS)}",
                        "regions": [],
                    },
                    emblem=self.emblems.new("flag"),
                )
            )
            for _ in range(cfg.regions_per_country):
                region = self._add(
                    Entity(
                        self._id("region"),
                        "region",
                        self.names.word((2, 2), REGION_SUFFIXES),
                        {"country": country.id, "cities": [], "area": rng.randrange(800, 40_000)},
                    )
                )
                country.attrs["regions"].append(region.id)
                river = f"{self.names.word((2, 2))} River"
                for _ in range(cfg.cities_per_region):
                    city = self._add(
                        Entity(
                            self._id("city"),
                            "city",
                            self.names.word((1, 2), CITY_SUFFIXES),
                            {
                                "region": region.id,
                                "country": country.id,
                                "population": rng.randrange(8_000, 2_400_000, 10),
                                "founded": rng.randrange(620, 1820),
                                # Cities of one region share a river: a shared attribute.
                                "river": river
                                if rng.random() < 0.6
                                else f"{self.names.word((2, 2))} River",
                                "elevation": rng.randrange(2, 1900),
                            },
                            emblem=self.emblems.new("shield"),
                        )
                    )
                    region.attrs["cities"].append(city.id)
                region.attrs["seat"] = rng.choice(region.attrs["cities"])
            cities = [c for r in country.attrs["regions"] for c in self.entities[r].attrs["cities"]]
            capital = rng.choice(cities)
            country.attrs["capital"] = capital
            # The capital is the most populous city, as in most countries.
            top = max(self.entities[c].attrs["population"] for c in cities)
            self.entities[capital].attrs["population"] = top + rng.randrange(10_000, 900_000, 10)
            country.attrs["population_m"] = round(rng.uniform(1.5, 80.0), 1)

    # -- people -------------------------------------------------------------------------------
    def _new_person(self, given: str, family: str, occupation: str, birth: dt.date) -> Entity:
        rng = self.rng
        city = rng.choice(self.by_kind["city"])
        attrs: dict[str, Any] = {
            "given": given,
            "family": family,
            "gender": rng.choice(["female", "male"]),
            "birth": birth,
            "birth_city": city.id,
            "occupation": occupation,
            "death": None,
            "university": None,
        }
        if birth.year < 1945 and rng.random() < 0.7:
            death_year = min(LAST_YEAR - 1, birth.year + rng.randrange(48, 96))
            attrs["death"] = _random_date(rng, death_year)
            if attrs["death"] <= birth:
                attrs["death"] = None
        return self._add(Entity(self._id("person"), "person", f"{given} {family}", attrs))

    def _people(self) -> None:
        rng, cfg = self.rng, self.cfg
        self.given_pool = self.names.given_names(max(8, cfg.people // 3))
        for _ in range(cfg.people):
            birth = _random_date(rng, rng.randrange(FIRST_YEAR, 1996))
            self._new_person(
                rng.choice(self.given_pool),
                self.names.word((2, 3)),
                _weighted(rng, OCCUPATIONS),
                birth,
            )

    # -- organisations -------------------------------------------------------------------------
    def _org_name(self, otype: str) -> str:
        suffix = self.rng.choice(ORG_TYPES[otype]["suffixes"])
        return f"{self.names.word((2, 3))} {suffix}"

    def _pick_founder(self, otype: str) -> Entity:
        rng = self.rng
        people = self.by_kind["person"]
        preferred = {"company": "entrepreneur", "institute": "physicist", "museum": "painter"}.get(
            otype
        )
        pool = [p for p in people if p.attrs["birth"].year <= 1990]
        if preferred and rng.random() < 0.5:
            pool = [p for p in pool if p.attrs["occupation"] == preferred] or pool
        return rng.choice(pool)

    def _founding_year(self, founder: Entity) -> int:
        birth = founder.attrs["birth"].year
        latest = min(2020, (founder.attrs["death"].year if founder.attrs["death"] else 2020))
        return min(latest, birth + self.rng.randrange(24, 60))

    def _organisations(self) -> None:
        rng, cfg = self.rng, self.cfg
        types = list(ORG_TYPES)
        for i in range(cfg.organisations):
            # Every type exists at least once; the rest follow the weights.
            otype = types[i] if i < len(types) else _weighted(rng, ORG_TYPE_WEIGHTS)
            founder = self._pick_founder(otype)
            self._add(
                Entity(
                    self._id("org"),
                    "org",
                    self._org_name(otype),
                    {
                        "otype": otype,
                        "founder": founder.id,
                        "founded": self._founding_year(founder),
                        "hq": rng.choice(self.by_kind["city"]).id,
                        "size": rng.randrange(40, 48_000, 10),
                    },
                    emblem=self.emblems.new("emblem"),
                )
            )
        universities = [o for o in self.by_kind["org"] if o.attrs["otype"] == "university"]
        for person in self.by_kind["person"]:
            studied = [
                u for u in universities if u.attrs["founded"] <= person.attrs["birth"].year + 18
            ]
            if studied and rng.random() < 0.7:
                person.attrs["university"] = rng.choice(studied).id

    # -- works ---------------------------------------------------------------------------------
    def _title(self, wtype: str) -> str:
        rng = self.rng
        core = self.names.word((2, 2))
        patterns = [
            f"The {rng.choice(TITLE_ADJECTIVES)} {rng.choice(TITLE_NOUNS)} of {core}",
            f"{core} {rng.choice(TITLE_NOUNS)}",
            f"The {core} {rng.choice(TITLE_NOUNS)}",
            f"{rng.choice(TITLE_ADJECTIVES)} {core}",
        ]
        if wtype == "album":
            patterns.append(f"Songs from {core}")
        return rng.choice(patterns)

    def _works(self) -> None:
        rng, cfg = self.rng, self.cfg
        makers = {
            wtype: [p for p in self.by_kind["person"] if p.attrs["occupation"] == spec["maker"]]
            for wtype, spec in WORK_TYPES.items()
        }
        wtypes = [w for w in WORK_TYPES if makers[w]]
        for i in range(cfg.works):
            wtype = wtypes[i % len(wtypes)]
            creator = rng.choice(makers[wtype])
            birth = creator.attrs["birth"].year
            death = creator.attrs["death"].year if creator.attrs["death"] else LAST_YEAR
            year = min(death, LAST_YEAR, birth + rng.randrange(22, 72))
            producers = [
                o
                for o in self.by_kind["org"]
                if o.attrs["otype"] == WORK_TYPES[wtype]["producer"] and o.attrs["founded"] <= year
            ]
            self._add(
                Entity(
                    self._id("work"),
                    "work",
                    self._title(wtype),
                    {
                        "wtype": wtype,
                        "creator": creator.id,
                        "year": year,
                        "producer": rng.choice(producers).id if producers else None,
                        "genre": rng.choice(WORK_TYPES[wtype]["genres"]),
                        "length": rng.randrange(90, 720)
                        if wtype == "novel"
                        else rng.randrange(30, 190),
                    },
                )
            )

    # -- twins (near-miss distractors) ----------------------------------------------------------
    def _twins(self) -> None:
        rng, cfg = self.rng, self.cfg
        people = list(self.by_kind["person"])
        orgs = list(self.by_kind["org"])
        for person in rng.sample(people, int(len(people) * cfg.twin_fraction)):
            a = person.attrs
            # Same given name, same birth year and occupation; different day and birthplace.
            birth = _random_date(rng, a["birth"].year)
            while birth == a["birth"]:
                birth = _random_date(rng, a["birth"].year)
            twin = self._new_person(
                a["given"], self.names.twin(a["family"]), a["occupation"], birth
            )
            while twin.attrs["birth_city"] == a["birth_city"]:
                twin.attrs["birth_city"] = rng.choice(self.by_kind["city"]).id
            twin.attrs["university"] = a["university"]
            twin.twin_of = person.id
        for org in rng.sample(orgs, int(len(orgs) * cfg.twin_fraction)):
            core, suffix = org.name.rsplit(" ", 1)
            founder = self._pick_founder(org.attrs["otype"])
            founded = self._founding_year(founder)
            if founded == org.attrs["founded"]:
                founded -= 1
            twin = self._add(
                Entity(
                    self._id("org"),
                    "org",
                    f"{self.names.twin(core)} {suffix}",
                    # Same type and headquarters city: a shared attribute.
                    {
                        **org.attrs,
                        "founder": founder.id,
                        "founded": founded,
                        "size": rng.randrange(40, 48_000, 10),
                    },
                    emblem=self.emblems.new("emblem"),
                    twin_of=org.id,
                )
            )
            assert twin.attrs["hq"] == org.attrs["hq"]
