"""A procedurally generated corpus of any size, for retrieval benchmarks.

Passage ``i`` is a pure function of ``(seed, i, num_passages)``: nothing is kept in memory, so
streaming a million passages costs the same memory as streaming ten, and a benchmark query can
name the passage it should retrieve without generating the corpus first.

Layout: ids are ``"0" .. str(n-1)``; slot ``i % 10`` fixes the kind (4 people, 2 organisations,
1 city, 2 works, 1 event per ten passages), names are scrambled from ``i`` so they look random
(person names never repeat, other names rarely), and references (birth city, founder, author) point at passages of the right
kind inside the corpus. The text style matches :mod:`mia.data.world_text`.
"""

from __future__ import annotations

from collections.abc import Iterator

from mia.data.world_entities import MONTHS, TITLE_NOUNS
from mia.data.world_names import CITY_SUFFIXES, ONSETS, VOWELS

_M64 = (1 << 64) - 1
# The names' syllables (mia.data.world_names), kept to plain consonant-vowel pairs: no "th" / "ch"
# onsets, no diphthongs.
_ONSETS = [o for o in ONSETS if o not in ("th", "ch")]
_VOWELS = VOWELS[:5]
_SYL = [o + v for o in _ONSETS for v in _VOWELS]  # 130 syllables, consonant-vowel
_CODAS = ["", "n", "r", "s", "th", "l", "k", "m"]
_CITY_SUFFIX = CITY_SUFFIXES[:8]
_ORG_SUFFIX = [
    "Institute",
    "Press",
    "Industries",
    "Museum",
    "Records",
    "Studios",
    "University",
    "Group",
]
_COUNTRIES = [
    "Velmora",
    "Tarvand",
    "Ostrenne",
    "Kaldesh",
    "Morivia",
    "Surrand",
    "Bentovar",
    "Aldara",
]
_DEMONYMS = [
    "Velmoran",
    "Tarvandi",
    "Ostrennian",
    "Kaldeshi",
    "Morivian",
    "Surrandi",
    "Bentovari",
    "Aldaran",
]
_OCCUPATIONS = [
    "writer",
    "film director",
    "musician",
    "physicist",
    "entrepreneur",
    "architect",
    "painter",
    "engineer",
]
_GENRES = [
    ("historical novel", "published"),
    ("crime novel", "published"),
    ("drama film", "produced"),
    ("comedy film", "produced"),
    ("jazz album", "released"),
    ("folk album", "released"),
]
_NOUNS = TITLE_NOUNS[:12]
_FILLER = [
    "Contemporaries described the work as patient and exact.",
    "Its archives are open to researchers by appointment.",
    "Several later studies have examined this period in detail.",
    "The old records were catalogued again in the following decade.",
    "A number of anniversaries have been marked with public events.",
    "The details are disputed by some historians.",
    "It has been reissued and reprinted several times.",
    "Local newspapers covered the occasion at length.",
]
_KINDS = ["person", "org", "person", "work", "city", "person", "org", "work", "person", "event"]
_SLOTS = {k: [s for s, kind in enumerate(_KINDS) if kind == k] for k in set(_KINDS)}


def _mix(x: int) -> int:
    """splitmix64 finaliser: a fast, well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _scramble(i: int, seed: int) -> int:
    """A bijection on 32-bit integers (odd multiply, xor-shift): distinct i, distinct names."""
    x = (i + seed * 0x5851F42D + 0x6A09E667) & 0xFFFFFFFF
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x297A2D39) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _word(n: int, syllables: int) -> tuple[str, int]:
    parts = []
    for _ in range(syllables):
        n, d = divmod(n, len(_SYL))
        parts.append(_SYL[d])
    return "".join(parts).capitalize(), n


def person_name(i: int, seed: int = 0) -> str:
    # 2 + 3 base-130 digits cover all 32 bits: person names never repeat.
    given, rest = _word(_scramble(i, seed), 2)
    family, _ = _word(rest, 3)
    return f"{given} {family}"


def org_name(i: int, seed: int = 0) -> str:
    core, rest = _word(_scramble(i, seed + 1), 3)
    return f"{core}{_CODAS[rest % len(_CODAS)]} {_ORG_SUFFIX[i % len(_ORG_SUFFIX)]}"


def city_name(i: int, seed: int = 0) -> str:
    core, rest = _word(_scramble(i, seed + 2), 2)
    return f"{core}{_CITY_SUFFIX[rest % len(_CITY_SUFFIX)]}"


def work_title(i: int, seed: int = 0) -> str:
    core, rest = _word(_scramble(i, seed + 3), 3)
    return f"The {_NOUNS[rest % len(_NOUNS)]} of {core}"


def _kind(i: int) -> str:
    return _KINDS[i % 10]


def _pick(h: int, kind: str, n: int) -> int:
    """A passage index of ``kind`` below ``n`` chosen by hash ``h`` (falls back to slot 0..)."""
    slots = _SLOTS[kind]
    blocks = max(1, n // 10)
    i = (h % blocks) * 10 + slots[(h >> 20) % len(slots)]
    return i if i < n else slots[0]


def _name(i: int, seed: int) -> str:
    kind = _kind(i)
    if kind == "person":
        return person_name(i, seed)
    if kind == "org":
        return org_name(i, seed)
    if kind == "city":
        return city_name(i, seed)
    if kind == "work":
        return work_title(i, seed)
    return f"{org_name(i, seed).split()[0]} Symposium"


def corpus_passage(i: int, num_passages: int, seed: int = 0) -> dict[str, str]:
    """Passage ``i`` of the ``num_passages``-passage corpus: ``{"id", "contents"}``."""
    n = num_passages
    h = _mix((seed << 40) ^ i)
    g = _mix(h)
    kind = _kind(i)
    name = _name(i, seed)
    year = 1850 + h % 170
    first = (g >> 8) % 8
    filler = f"{_FILLER[first]} {_FILLER[(first + 1 + (g >> 12) % 7) % 8]}"
    if kind == "person":
        city = _pick(g, "city", n)
        country = _COUNTRIES[(h >> 8) % 8]
        date = f"{1 + (h >> 16) % 28} {MONTHS[(h >> 24) % 12]} {year}"
        occ = _OCCUPATIONS[(h >> 32) % 8]
        uni = org_name(_pick(g >> 24, "org", n), seed)
        demonym = _DEMONYMS[(h >> 8) % 8]
        article = "an" if demonym[0] in "AEIOU" else "a"
        text = (
            f"{name} (born {date} in {city_name(city, seed)}, {country}) is {article} {demonym} {occ}. "
            f"{name.split()[0]} studied at {uni} and later worked in several countries. {filler}"
        )
    elif kind == "org":
        founder = person_name(_pick(g, "person", n), seed)
        hq = city_name(_pick(g >> 24, "city", n), seed)
        text = (
            f"{name} is an organisation headquartered in {hq}. It was founded in {year} by "
            f"{founder}. It employs about {(h >> 20) % 40_000 + 40:,} people. {filler}"
        )
    elif kind == "city":
        pop = (h >> 16) % 2_000_000 + 5_000
        text = (
            f"{name} is a city in {_COUNTRIES[(h >> 8) % 8]}. It was founded in {600 + h % 1200} and "
            f"has a population of {pop:,}. It lies at an elevation of {(h >> 40) % 1900} metres. {filler}"
        )
    elif kind == "work":
        author = person_name(_pick(g, "person", n), seed)
        publisher = org_name(_pick(g >> 24, "org", n), seed)
        genre, verb = _GENRES[(h >> 8) % len(_GENRES)]
        text = (
            f"{name} is a {year + 20} {genre} by {author}. It was {verb} by {publisher}. "
            f"Critics praised its structure and its ending. {filler}"
        )
    else:
        host = org_name(_pick(g, "org", n), seed)
        speaker = person_name(_pick(g >> 24, "person", n), seed)
        city = city_name(_pick(h >> 24, "city", n), seed)
        text = (
            f"The {name} of {year + 60} was hosted by {host} in {city}. Speakers included "
            f"{speaker}. The proceedings were published the following year. {filler}"
        )
    return {"id": str(i), "contents": f"{name}\n{text}"}


def iter_corpus(num_passages: int, seed: int = 0) -> Iterator[dict[str, str]]:
    """Stream ``num_passages`` passages ``{"id", "contents"}`` (Search-R1 corpus lines).

    Memory stays flat at any size; ids are unique (``"0"`` .. ``str(num_passages - 1)``).
    """
    if num_passages < 0:
        raise ValueError("num_passages must be >= 0")
    for i in range(num_passages):
        yield corpus_passage(i, num_passages, seed)


_QUERY_TEMPLATES = {
    "person": [
        "where was {name} born",
        "When was {name} born?",
        "{name} occupation",
        "Which university did {name} attend?",
    ],
    "org": [
        "who founded {name}",
        "Where is {name} headquartered?",
        "{name} founding year",
        "When was {name} founded?",
    ],
    "city": [
        "population of {name}",
        "In which country is {name}?",
        "When was {name} founded?",
        "{name} elevation",
    ],
    "work": [
        "who wrote {name}",
        "Who published {name}?",
        "{name} author",
        "When was {name} published?",
    ],
    "event": [
        "who hosted the {name}",
        "Where was the {name} held?",
        "{name} speakers",
        "{name} proceedings",
    ],
}


def benchmark_qrels(num_queries: int, num_passages: int, seed: int = 0) -> list[tuple[str, str]]:
    """``(query, id of the passage that answers it)`` pairs for the ``iter_corpus`` corpus."""
    if num_passages <= 0:
        raise ValueError("num_passages must be > 0")
    out = []
    for q in range(num_queries):
        h = _mix((seed << 44) ^ (q * 0x9E3779B1) ^ 0xBE4C)
        i = h % num_passages
        templates = _QUERY_TEMPLATES[_kind(i)]
        out.append((templates[(h >> 32) % len(templates)].format(name=_name(i, seed)), str(i)))
    return out


def benchmark_queries(num_queries: int, num_passages: int, seed: int = 0) -> list[str]:
    """Realistic search queries about passages of ``iter_corpus(num_passages, seed)``."""
    return [query for query, _ in benchmark_qrels(num_queries, num_passages, seed)]


sample_queries = benchmark_queries
