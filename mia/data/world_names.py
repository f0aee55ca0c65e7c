"""Fictional names built from syllables, so that no answer can come from a model's memory.

Every name *word* handed out by :class:`NameBook` is unique across the whole world (except person
given names, which repeat as in real life), and no name is a whole-word part of another, so a
question that names an entity names exactly one. Near-miss "twin" names (one letter changed) are
the distractors that make a searcher read carefully.
"""

from __future__ import annotations

import random

ONSETS = [
    "b",
    "br",
    "c",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "pr",
    "r",
    "s",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "z",
    "sh",
    "ch",
    "j",
    "w",
]
VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "y"]
CODAS = ["", "", "", "n", "r", "l", "s", "th", "k", "m", "nd", "rn", "st"]

# Suffixes give each kind of name a recognisable flavour without using real words as names.
COUNTRY_SUFFIXES = ["ia", "ora", "and", "esh", "avia", "enne", "ovar", "ara"]
CITY_SUFFIXES = ["by", "ford", "wick", "holm", "grad", "mar", "haven", "stad", "ton", "dor", "vel"]
REGION_SUFFIXES = ["shire", "mark", "land", "vale", "reach", "march"]
DEMONYM_SUFFIX = {"a": "n", "e": "an", "i": "an", "o": "an", "u": "an", "y": "an"}


def _capitalise(word: str) -> str:
    return word[:1].upper() + word[1:]


class NameBook:
    """Hands out unique fictional words and names from one seeded random stream."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def _root(self, syllables: int) -> str:
        rng = self.rng
        parts = []
        for i in range(syllables):
            coda = rng.choice(CODAS) if i == syllables - 1 else ""
            parts.append(rng.choice(ONSETS) + rng.choice(VOWELS) + coda)
        return "".join(parts)

    def _claim(self, word: str) -> bool:
        key = word.lower()
        # Unique words make whole-word matching of a name unambiguous; length bounds keep names
        # pronounceable and stop very short words from matching inside ordinary text.
        if key in self.used or len(key) < 4 or len(key) > 12:
            return False
        self.used.add(key)
        return True

    def word(self, syllables: tuple[int, int] = (2, 3), suffixes: list[str] | None = None) -> str:
        """A fresh capitalised word no other entity uses."""
        while True:
            root = self._root(self.rng.randint(*syllables))
            if suffixes:
                root = root.rstrip("aeiouy") + self.rng.choice(suffixes)
            word = _capitalise(root)
            if self._claim(word):
                return word

    def given_names(self, count: int) -> list[str]:
        """A pool of given names; people draw from it with repetition."""
        return [self.word((2, 2)) for _ in range(count)]

    def twin(self, word: str) -> str:
        """A fresh word one letter away from ``word`` (a near-miss distractor)."""
        vowels = "aeiou"
        positions = [i for i, ch in enumerate(word) if ch.lower() in vowels and i > 0]
        for _ in range(50):
            if positions:
                i = self.rng.choice(positions)
                ch = self.rng.choice([v for v in vowels if v != word[i]])
                candidate = word[:i] + ch + word[i + 1 :]
            else:
                candidate = word + self.rng.choice(vowels)
            if self._claim(candidate):
                return candidate
        return self.word()


def demonym(country: str) -> str:
    """``Velmora`` -> ``Velmoran``; ``Tarvand`` -> ``Tarvandi``."""
    last = country[-1].lower()
    return country + DEMONYM_SUFFIX.get(last, "i")


def language_name(country: str) -> str:
    """A language name distinct from the demonym (so one does not give away the other)."""
    return country.rstrip("aeiouy") + "ic"
