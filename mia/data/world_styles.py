"""Entity passages of drawn worlds, in the world's style (encyclopedia or narrative) and with
its drawn phrasing of each fact (:class:`mia.data.world_lexicon.Lexicon`).

Every fact a question can ask about is stated in its entity's passage, with the answer written
exactly as :class:`mia.data.world_questions.Facts` gives it; event passages (the distractors) are
the same as in legacy worlds. :func:`fact_words` names, per fact, the words its sentence uses,
so a searcher (and the gold transcripts) can aim a query at it.
"""

from __future__ import annotations

import random
from typing import Any

from mia.data.world_entities import ORG_TYPES, Entity, format_date, format_number
from mia.data.world_names import NameBook
from mia.data.world_text import SIZE_PHRASES, PassageWriter, _field, _list

# Per fact, the words its sentence uses in each phrasing variant (both styles).
FACT_WORDS: dict[str, tuple[str, ...]] = {
    "person.birth": ("born", "born", "born"),
    "person.university": ("studied", "educated"),
    "org.hq": ("headquartered", "based", "head office"),
    "org.founder": ("founded", "established", "set up"),
    "work.creator": ("by", "by"),
    "work.producer": ("published produced label", "publisher studio issued"),
    "city.region": ("in the", "of"),
    "city.founded": ("founded", "founded"),
    "city.river": ("lies on", "flows through"),
    "region.seat": ("administrative seat", "administered from"),
    "country.capital": ("capital", "capital"),
    "country.language": ("official language currency", "speak officially pay"),
}


def fact_words(lexicon: Any, fact: str) -> str:
    """The words the passage sentence of ``fact`` (``kind.relation`` group) uses."""
    return FACT_WORDS[fact][lexicon.phrasing.get(fact, 0)]


class DrawnPassageWriter(PassageWriter):
    """:class:`~mia.data.world_text.PassageWriter` with the entity passages of a drawn world."""

    def __init__(
        self, rng: random.Random, entities: dict[str, Entity], names: NameBook, lexicon: Any
    ) -> None:
        super().__init__(rng, entities, names)
        self.lex = lexicon
        self.narrative = lexicon.style == "narrative"
        self.city_noun = lexicon.nouns["city"]
        self.region_noun = lexicon.nouns["region"]

    def _v(self, fact: str) -> int:
        return self.lex.phrasing.get(fact, 0)

    # -- people ---------------------------------------------------------------------------------
    def _person(self, p: Entity) -> tuple[str, list[str]]:
        a = p.attrs
        city = self.e[a["birth_city"]]
        country = self.e[city.attrs["country"]]
        she = a["gender"] == "female"
        pro, poss = ("she", "her") if she else ("he", "his")
        dem = country.attrs["demonym"]
        occ = a["occupation"]
        born, place = format_date(a["birth"]), f"{city.name}, {country.name}"
        died = format_date(a["death"]) if a["death"] else None
        first = self._birth(p.name, born, place, dem, occ, died, pro)
        sentences = [first]
        mentions = [city.id, country.id]
        if a["university"]:
            uni = self.name(a["university"])
            field_ = _field(occ)
            study = (
                [f"{pro.capitalize()} studied {field_} at {uni}.",
                 f"{pro.capitalize()} was educated at {uni}, where {pro} read {field_}."]
                if not self.narrative
                else [f"As a student, {pro} studied {field_} at {uni}.",
                      f"Later {pro} was educated at {uni}, reading {field_} there."]
            )  # fmt: skip
            sentences.append(study[self._v("person.university")])
            mentions.append(a["university"])
        fill = {"P": pro.capitalize(), "poss": poss, "poss_c": poss.capitalize()}
        fill |= {"obj": "her" if she else "him", "occ": occ}
        sentences += self._fill("person", self.rng.randint(1, 2), **fill)
        return " ".join(sentences), mentions

    def _birth(
        self, name: str, born: str, place: str, dem: str, occ: str, died: str | None, pro: str
    ) -> str:
        v = self._v("person.birth")
        if self.narrative:
            end = f" {pro.capitalize()} died on {died}." if died else ""
            opening = (
                f"{name} was born on {born} in {place} and grew up to become a {dem} {occ}.",
                f"The story of {name} begins in {place}, where {pro} was born on {born}; "
                f"{pro} became a {dem} {occ}.",
                f"On {born}, {name} was born in {place}, and in time became a {dem} {occ}.",
            )[v]
            return opening + end
        if died:
            return (
                f"{name} ({born} – {died}) was a {dem} {occ}, born in {place}.",
                f"{name} was a {dem} {occ} (born {born}, {place}; died {died}).",
                f"{name}, born {born} in {place}, was a {dem} {occ} who died on {died}.",
            )[v]
        return (
            f"{name} (born {born} in {place}) is a {dem} {occ}.",
            f"{name} is a {dem} {occ}, born on {born} in {place}.",
            f"{name}, born {born} in {place}, is a {dem} {occ}.",
        )[v]

    # -- organisations --------------------------------------------------------------------------
    def _org(self, o: Entity) -> tuple[str, list[str]]:
        a = o.attrs
        hq = self.e[a["hq"]]
        country = self.e[hq.attrs["country"]]
        noun = self.lex.nouns.get(f"org.{a['otype']}", ORG_TYPES[a["otype"]]["noun"])
        founder = self.name(a["founder"])
        where = f"{hq.name}, {country.name}"
        seat = ("headquartered in", "based in", "with its head office in")[self._v("org.hq")]
        verb = ("founded", "established", "set up")[self._v("org.founder")]
        if self.narrative:
            first = (
                f"In {a['founded']}, {founder} {verb} {o.name}, a {noun} {seat} {where}."
                if verb != "set up"
                else f"{founder} set up {o.name} in {a['founded']}; the {noun} is {seat} {where}."
            )
        else:
            first = f"{o.name} is a {noun} {seat} {where}. It was {verb} in {a['founded']} by {founder}."
        size = SIZE_PHRASES[a["otype"]].format(n=format_number(a["size"]))
        sentences = [first, size, *self._fill("org", self.rng.randint(1, 2))]
        return " ".join(sentences), [hq.id, country.id, a["founder"]]

    # -- works ----------------------------------------------------------------------------------
    def _work(self, w: Entity) -> tuple[str, list[str]]:
        a = w.attrs
        creator = self.name(a["creator"])
        producer = self.name(a["producer"]) if a["producer"] else None
        mentions = [a["creator"]] + ([a["producer"]] if a["producer"] else [])
        wtype, year, genre = a["wtype"], a["year"], a["genre"]
        made = self._made(w.name, wtype, year, genre, creator)
        if producer:
            made += " " + self._produced(wtype, producer)
        length = {"novel": "The book runs to {n} pages.", "film": "It runs for {n} minutes."}
        made += " " + length.get(wtype, "It runs for {n} minutes.").format(n=a["length"])
        return " ".join([made, *self._fill("work", self.rng.randint(1, 2))]), mentions

    def _made(self, title: str, wtype: str, year: int, genre: str, creator: str) -> str:
        v = self._v("work.creator")
        if self.narrative:
            return {
                "novel": f"{creator} wrote {title}, a {genre} novel that appeared in {year}.",
                "film": f"{creator} directed {title}, a {genre} film released in {year}.",
                "album": f"{creator} recorded {title}, a {genre} album released in {year}.",
            }[wtype]
        return {
            "novel": (f"{title} is a {year} {genre} novel by {creator}.",
                      f"{title} is a {genre} novel by {creator}, published in {year}."),
            "film": (f"{title} is a {year} {genre} film directed by {creator}.",
                     f"{title} is a {genre} film by {creator}, released in {year}."),
            "album": (f"{title} is a {year} {genre} album by {creator}.",
                      f"{title} is a {genre} album by {creator}, released in {year}."),
        }[wtype][v]  # fmt: skip

    def _produced(self, wtype: str, producer: str) -> str:
        v = self._v("work.producer")
        return {
            "novel": (f"It was published by {producer}.", f"Its publisher is {producer}."),
            "film": (f"It was produced by {producer}.", f"The studio {producer} produced it."),
            "album": (f"It was released on the {producer} label.", f"{producer} issued the record."),
        }[wtype][v]  # fmt: skip

    # -- places ---------------------------------------------------------------------------------
    def _city(self, c: Entity) -> tuple[str, list[str]]:
        a = c.attrs
        region, country = self.e[a["region"]], self.e[a["country"]]
        cn, rn = self.city_noun, self.region_noun
        located = (
            f"{c.name} is a {cn} in the {region.name} {rn} of {country.name}.",
            f"{c.name} is a {cn} of {country.name}, in the {rn} of {region.name}.",
        )[self._v("city.region")]
        pop = format_number(a["population"])
        founded = (
            f"It was founded in {a['founded']} and has a population of {pop}.",
            f"Founded in {a['founded']}, it is home to {pop} people.",
        )[self._v("city.founded")]
        river = (
            f"{c.name} lies on the {a['river']} at an elevation of {a['elevation']} metres.",
            f"The {a['river']} flows through {c.name}, {a['elevation']} metres above sea level.",
        )[self._v("city.river")]
        sentences = [located, founded, river]
        if self.narrative:
            sentences = [f"Visitors to {c.name} find a {cn} with a long past.", *sentences]
        return self._city_end(c, region, country, sentences)

    def _region(self, r: Entity) -> tuple[str, list[str]]:
        a = r.attrs
        country = self.e[a["country"]]
        cities = _list([self.name(c) for c in a["cities"]])
        seat = self.name(a["seat"])
        plural = f"{self.city_noun}s" if self.city_noun == "town" else "cities"
        area = format_number(a["area"])
        first = (
            f"{r.name} is a {self.region_noun} of {country.name}. Its administrative seat is {seat}.",
            f"{r.name}, a {self.region_noun} of {country.name}, is administered from {seat}.",
        )[self._v("region.seat")]
        text = f"{first} It covers {area} square kilometres and includes the {plural} of {cities}."
        return text, [country.id, *a["cities"]]

    def _country(self, c: Entity) -> tuple[str, list[str]]:
        a = c.attrs
        regions = [self.name(r) for r in a["regions"]]
        capital = self.name(a["capital"])
        cap = (
            f"Its capital and largest {self.city_noun} is {capital}.",
            f"{capital} is its capital and largest {self.city_noun}.",
        )[self._v("country.capital")]
        lang = (
            f"The official language is {a['language']}, and the currency is the {a['currency']}.",
            f"People there speak {a['language']} officially and pay in the {a['currency']}.",
        )[self._v("country.language")]
        text = (
            f"{c.name} is a country with a population of about {a['population_m']} million. "
            f"{cap} {lang} Its citizens are called {a['demonym']}s. {c.name} is divided into "
            f"{len(regions)} {self.region_noun}s: {_list(regions)}."
        )
        return text, [a["capital"], *a["regions"]]
