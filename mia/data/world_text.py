"""Wikipedia-style passages for the synthetic world.

One passage per entity (several facts each, phrased with a few templates so the text is not
uniform), plus event passages (prizes, symposia, exhibitions, reviews, visits, town twinnings)
that mention entities without stating the facts questions ask about: they are the distractors a
searcher must read past, together with the near-miss twin entities.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

from mia.data.world_entities import FIELDS, ORG_TYPES, Entity, format_date, format_number
from mia.data.world_names import NameBook

FILLER = {
    "person": [
        "{P} is regarded as one of the most distinctive {occ}s of {poss} generation.",
        "Colleagues remembered {obj} as exacting, patient and quick to share credit.",
        "{P} gave few interviews and kept most of {poss} notebooks private.",
        "{poss_c} methods have been the subject of several studies.",
        "{P} received a number of honorary titles during {poss} career.",
    ],
    "org": [
        "Its archives are open to researchers by appointment.",
        "The organisation has been reorganised several times since its foundation.",
        "Its annual report is published each spring.",
        "It has been led by a board of trustees since the early years.",
    ],
    "work": [
        "It received warm reviews on release.",
        "Critics were divided on its ending.",
        "It has since been reissued several times.",
        "Its opening section is often quoted.",
    ],
    "city": [
        "The old town is known for its covered markets.",
        "A railway line connects it with the surrounding towns.",
        "Its main square hosts a seasonal fair.",
    ],
}
SIZE_PHRASES = {
    "publisher": "It has published more than {n} titles.",
    "studio": "Its back lot covers about {n} square metres.",
    "label": "Its catalogue lists about {n} recordings.",
    "university": "It enrols about {n} students.",
    "company": "It employs about {n} people.",
    "museum": "Its collection holds about {n} objects.",
    "institute": "It employs about {n} researchers and staff.",
    "orchestra": "It has given more than {n} concerts.",
}


@dataclass(frozen=True)
class Passage:
    """A corpus document. ``contents`` is the Search-R1 form: ``"Title\\ntext"``."""

    id: str
    title: str
    text: str
    kind: str  # entity | event
    entity_id: str | None = None  # the entity an entity passage describes
    mentions: tuple[str, ...] = field(default=())  # ids of the entities it names

    @property
    def contents(self) -> str:
        return f"{self.title}\n{self.text}"


def _list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class PassageWriter:
    def __init__(self, rng: random.Random, entities: dict[str, Entity], names: NameBook) -> None:
        self.rng = rng
        self.e = entities
        self.names = names  # for prize / symposium names
        self.by_kind: dict[str, list[Entity]] = {}
        for ent in entities.values():
            self.by_kind.setdefault(ent.kind, []).append(ent)

    def name(self, entity_id: str) -> str:
        return self.e[entity_id].name

    def _fill(self, kind: str, k: int, **fmt: str) -> list[str]:
        return [s.format(**fmt) for s in self.rng.sample(FILLER[kind], k)]

    # -- entity passages -----------------------------------------------------------------------
    def entity(self, ent: Entity) -> tuple[str, list[str]]:
        """Text and mentioned ids of an entity's own passage."""
        return getattr(self, f"_{ent.kind}")(ent)

    def _person(self, p: Entity) -> tuple[str, list[str]]:
        rng, a = self.rng, p.attrs
        city = self.e[a["birth_city"]]
        country = self.e[city.attrs["country"]]
        # Mostly the birth country's demonym; sometimes another one (emigrants exist).
        nat_country = country
        if rng.random() < 0.15:
            nat_country = rng.choice(self.by_kind["country"])
        dem = nat_country.attrs["demonym"]
        she = a["gender"] == "female"
        pro = {"P": "She" if she else "He", "poss": "her" if she else "his"}
        pro |= {
            "poss_c": pro["poss"].capitalize(),
            "obj": "her" if she else "him",
            "occ": a["occupation"],
        }
        born = format_date(a["birth"])
        place = f"{city.name}, {country.name}"
        if a["death"]:
            died = format_date(a["death"])
            first = rng.choice(
                [
                    f"{p.name} ({born} – {died}) was a {dem} {a['occupation']}, born in {place}.",
                    f"{p.name} (born {born} in {place}; died {died}) was a {dem} {a['occupation']}.",
                ]
            )
        else:
            first = rng.choice(
                [
                    f"{p.name} (born {born} in {place}) is a {dem} {a['occupation']}.",
                    f"{p.name} is a {dem} {a['occupation']}, born on {born} in {place}.",
                ]
            )
        sentences = [first]
        mentions = [city.id, country.id]
        if a["university"]:
            field_ = _field(a["occupation"])
            sentences.append(f"{pro['P']} studied {field_} at {self.name(a['university'])}.")
            mentions.append(a["university"])
        sentences += self._fill("person", rng.randint(1, 2), **pro)
        return " ".join(sentences), mentions

    def _org(self, o: Entity) -> tuple[str, list[str]]:
        rng, a = self.rng, o.attrs
        hq = self.e[a["hq"]]
        country = self.e[hq.attrs["country"]]
        noun = ORG_TYPES[a["otype"]]["noun"]
        founder = self.name(a["founder"])
        first = rng.choice(
            [
                f"{o.name} is a {noun} headquartered in {hq.name}, {country.name}. "
                f"It was founded in {a['founded']} by {founder}.",
                f"Founded by {founder} in {a['founded']}, {o.name} is a {noun} based in "
                f"{hq.name}, {country.name}.",
            ]
        )
        size = SIZE_PHRASES[a["otype"]].format(n=format_number(a["size"]))
        sentences = [first, size, *self._fill("org", rng.randint(1, 2))]
        return " ".join(sentences), [hq.id, country.id, a["founder"]]

    def _work(self, w: Entity) -> tuple[str, list[str]]:
        rng, a = self.rng, w.attrs
        creator = self.name(a["creator"])
        producer = self.name(a["producer"]) if a["producer"] else None
        mentions = [a["creator"]] + ([a["producer"]] if a["producer"] else [])
        wtype, year, genre = a["wtype"], a["year"], a["genre"]
        if wtype == "novel":
            s = f"{w.name} is a {year} {genre} novel by {creator}."
            if producer:
                s += f" It was published by {producer}."
            s += f" The book runs to {a['length']} pages."
        elif wtype == "film":
            s = f"{w.name} is a {year} {genre} film directed by {creator}."
            if producer:
                s += f" It was produced by {producer}."
            s += f" It has a running time of {a['length']} minutes."
        else:
            s = f"{w.name} is a {year} {genre} album by {creator}."
            if producer:
                s += f" It was released on the {producer} label."
            s += f" It runs for {a['length']} minutes."
        return " ".join([s, *self._fill("work", rng.randint(1, 2))]), mentions

    def _city(self, c: Entity) -> tuple[str, list[str]]:
        rng, a = self.rng, c.attrs
        region, country = self.e[a["region"]], self.e[a["country"]]
        sentences = [
            rng.choice(
                [
                    f"{c.name} is a city in the {region.name} region of {country.name}.",
                    f"{c.name} is a city of {country.name}, in the region of {region.name}.",
                ]
            ),
            f"It was founded in {a['founded']} and has a population of {format_number(a['population'])}.",
            f"{c.name} lies on the {a['river']} at an elevation of {a['elevation']} metres.",
        ]
        return self._city_end(c, region, country, sentences)

    def _city_end(
        self, c: Entity, region: Entity, country: Entity, sentences: list[str]
    ) -> tuple[str, list[str]]:
        """A city's passage from its opening ``sentences``: then whether it is its country's
        capital and its region's seat, and one filler sentence."""
        if country.attrs["capital"] == c.id:
            sentences.append(f"It is the capital of {country.name}.")
        if region.attrs["seat"] == c.id:
            sentences.append(f"It is the administrative seat of {region.name}.")
        sentences += self._fill("city", 1)
        return " ".join(sentences), [region.id, country.id]

    def _region(self, r: Entity) -> tuple[str, list[str]]:
        a = r.attrs
        country = self.e[a["country"]]
        cities = [self.name(c) for c in a["cities"]]
        text = (
            f"{r.name} is a region of {country.name}. Its administrative seat is "
            f"{self.name(a['seat'])}. It covers {format_number(a['area'])} square kilometres "
            f"and includes the cities of {_list(cities)}."
        )
        return text, [country.id, *a["cities"]]

    def _country(self, c: Entity) -> tuple[str, list[str]]:
        a = c.attrs
        regions = [self.name(r) for r in a["regions"]]
        text = (
            f"{c.name} is a country with a population of about {a['population_m']} million. "
            f"Its capital and largest city is {self.name(a['capital'])}. The official language is "
            f"{a['language']}, and the currency is the {a['currency']}. Its citizens are called "
            f"{a['demonym']}s. {c.name} is divided into {len(regions)} regions: {_list(regions)}."
        )
        return text, [a["capital"], *a["regions"]]

    # -- event passages (distractors) -----------------------------------------------------------
    def event(self) -> tuple[str, str, list[str]]:
        """Title, text and mentioned ids of one event passage."""
        kind = self.rng.choice(["prize", "symposium", "exhibition", "review", "visit", "twinning"])
        return getattr(self, f"_event_{kind}")()

    def _pick(self, kind: str, k: int = 1) -> list[Entity]:
        pool = self.by_kind[kind]
        return self.rng.sample(pool, min(k, len(pool)))

    def _org_in(self, year: int) -> Entity:
        """An organisation that already existed in ``year`` (any, if none did)."""
        pool = [o for o in self.by_kind["org"] if o.attrs["founded"] <= year] or self.by_kind["org"]
        return self.rng.choice(pool)

    def _active_year(self, person: Entity) -> int:
        a = person.attrs
        end = a["death"].year if a["death"] else 2024
        return min(end, a["birth"].year + self.rng.randrange(30, 70))

    def _event_prize(self) -> tuple[str, str, list[str]]:
        people = self._pick("person", 3)
        year = self._active_year(people[0])
        org = self._org_in(year)
        prize = f"{self.names.word((2, 2))} Prize"
        date = format_date(_date_in(self.rng, year))
        text = (
            f"The {year} {prize} was awarded to {people[0].name} for contributions to "
            f"{_field(people[0].attrs['occupation'])}. The ceremony was held on {date} at {org.name}. "
            f"Other nominees included {_list([p.name for p in people[1:]])}."
        )
        return f"{year} {prize}", text, [p.id for p in people] + [org.id]

    def _event_symposium(self) -> tuple[str, str, list[str]]:
        people = self._pick("person", 3)
        city = self._pick("city")[0]
        year = self.rng.randrange(1950, 2024)
        org = self._org_in(year)
        name = f"{self.names.word((2, 2))} Symposium"
        text = (
            f"The {name} of {year} was hosted by {org.name} in {city.name}. Speakers included "
            f"{_list([p.name for p in people])}. The proceedings were published the following year."
        )
        return f"{name} ({year})", text, [p.id for p in people] + [org.id, city.id]

    def _event_exhibition(self) -> tuple[str, str, list[str]]:
        person = self._pick("person")[0]
        year = self.rng.randrange(1960, 2024)
        org = self._org_in(year)
        date = format_date(_date_in(self.rng, year))
        visitors = format_number(self.rng.randrange(2_000, 400_000, 100))
        title = f"{self.names.word((2, 2))} Exhibition"
        text = (
            f"The {title} on the life and work of {person.name} opened at {org.name} on {date}. "
            f"It drew about {visitors} visitors and later travelled abroad."
        )
        return title, text, [person.id, org.id]

    def _event_review(self) -> tuple[str, str, list[str]]:
        work = self._pick("work")[0]
        critic = self._pick("person")[0]
        verdict = self.rng.choice(["a quiet triumph", "uneven but brave", "overlong", "essential"])
        journal = f"{self.names.word((2, 2))} Review"
        text = (
            f"{work.name} was reviewed in the {journal} by {critic.name}, who called it "
            f"{verdict}. The review was later reprinted in an anthology of criticism."
        )
        return f"Reception of {work.name}", text, [work.id, critic.id]

    def _event_visit(self) -> tuple[str, str, list[str]]:
        person = self._pick("person")[0]
        city = self._pick("city")[0]
        year = self._active_year(person)
        org = self._org_in(year)
        text = (
            f"In {year}, {person.name} travelled to {city.name} to give a series of lectures at "
            f"{org.name}. The lectures were recorded and broadcast later that year."
        )
        title = f"{self.names.word((2, 2))} Lectures"
        return title, text, [person.id, city.id, org.id]

    def _event_twinning(self) -> tuple[str, str, list[str]]:
        a, b = self._pick("city", 2)
        year = self.rng.randrange(1950, 2020)
        text = (
            f"{a.name} and {b.name} have been twin towns since {year}. The partnership began with "
            f"a school exchange and now includes an annual cultural festival."
        )
        return f"Twinning of {a.name} and {b.name}", text, [a.id, b.id]


def _field(occupation: str) -> str:
    return FIELDS[occupation]


def _date_in(rng: random.Random, year: int) -> dt.date:
    return dt.date.fromordinal(dt.date(year, 1, 1).toordinal() + rng.randrange(365))


def build_passages(
    rng: random.Random,
    entities: dict[str, Entity],
    names: NameBook,
    num_events: int,
    writer: PassageWriter | None = None,
) -> list[Passage]:
    """Entity passages + ``num_events`` event passages, shuffled, with ids ``"0"``, ``"1"``, ...
    ``writer``: how entity passages read (default: the legacy worlds' :class:`PassageWriter`
    over ``rng``)."""
    writer = writer or PassageWriter(rng, entities, names)
    drafts: list[tuple[str, str, str, str | None, list[str]]] = []
    for ent in entities.values():
        text, mentions = writer.entity(ent)
        drafts.append((ent.name, text, "entity", ent.id, mentions))
    for _ in range(num_events):
        title, text, mentions = writer.event()
        drafts.append((title, text, "event", None, mentions))
    # Shuffle so a passage id says nothing about what the passage is.
    rng.shuffle(drafts)
    return [
        Passage(str(i), title, text, kind, eid, tuple(mentions))
        for i, (title, text, kind, eid, mentions) in enumerate(drafts)
    ]


__all__ = ["Passage", "PassageWriter", "build_passages"]
