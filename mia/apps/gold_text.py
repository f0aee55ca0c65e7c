"""The text gold programs (:mod:`mia.apps.gold`) write and read: the assistant's turns (a
``<think>`` block, then a tool call or the answer), the deterministic choice among phrasings, the
words a drawn world's passages state a fact with, and the sentences read out of observations.

No phrase table lives here: the warm start's data key hashes the upper-case names of
:mod:`mia.apps.gold` only (:func:`mia.apps.warm_start.data_fingerprint`), so a table that shapes
gold data belongs there.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mia.data.world_questions import contains

if TYPE_CHECKING:
    from mia.data.world_entities import Entity
    from mia.data.world_lexicon import Lexicon


def pick(key: str, options: Sequence[str]) -> str:
    """A deterministic choice among phrasings (so SFT does not see one sentence a thousand
    times), stable across runs and Python versions."""
    return options[zlib.crc32(key.encode("utf-8")) % len(options)]


def drawn_query_words(lexicon: Lexicon, ent: Entity, rel: str) -> str:
    """The words of the drawn passage sentence that states ``ent``'s ``rel``
    (:mod:`mia.data.world_styles`: the lexicon's style and phrasing of that fact, its nouns), so
    BM25 ranks the passage for the sentence, not only for the name. The words live in code, not
    in a table of :mod:`mia.apps.gold`: the warm start's data key hashes that module's upper-case
    tables (:func:`mia.apps.warm_start.data_fingerprint`), and the shipped adapters' legacy gold
    does not depend on these."""
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


def cap(text: str) -> str:
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


def has_any(text: str, needles: Sequence[str]) -> bool:
    return any(contains(text, n) for n in needles)


def evidence(observation: str, title: str, needles: Sequence[str]) -> str | None:
    """The first sentence of the passage titled ``title`` in ``observation`` that contains one of
    ``needles`` as a whole phrase, or None."""
    text = passage_text(observation, title)
    if text is None:
        return None
    for sentence in _SENTENCE_END.split(text):
        if has_any(sentence, needles):
            return sentence.strip()
    return None


_IMAGE_HIT = re.compile(r"^1\. title: (.+?)(?: <image>| \(image unavailable\))?$", re.M)


def top_image_title(observation: str) -> str | None:
    """The title of the first image-search hit (``1. title: <title> <image>``)."""
    m = _IMAGE_HIT.search(observation)
    return m.group(1).strip() if m else None
