"""The synthetic research world: fictional entities, a passage corpus, and questions over it.

``World.generate(seed, size)`` builds, deterministically from ``seed``:

* entities with syllable-made names (countries, regions, cities, people, organisations, works),
  each with several facts, plus near-miss "twin" entities as distractors;
* a Wikipedia-style corpus: one passage per entity and event passages that mention entities
  without stating the facts asked about;
* questions of four types - ``single_hop``, ``bridge`` (two passages needed, see
  :mod:`mia.data.world_questions` for the exact rules), ``comparison`` and ``image`` (an emblem,
  flag or coat of arms drawn with PIL; a precomputed image-search cache identifies its owner).

``world.write(out_dir)`` writes the corpus, both QA formats per split, the image-search cache and
a manifest (see ``docs/world.md``). ``iter_corpus`` / ``benchmark_queries`` stream a procedurally
generated corpus of any size for retrieval benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mia.data.world_corpus import (
    benchmark_qrels,
    benchmark_queries,
    corpus_passage,
    iter_corpus,
    sample_queries,
)
from mia.data.world_entities import Entity, EntityBuilder
from mia.data.world_io import DATA_SOURCE, write_world
from mia.data.world_lexicon import LEGACY, Lexicon, lexicon_for
from mia.data.world_questions import QUESTION_TYPES, QuestionMaker, TextIndex, question_problems
from mia.data.world_questions import Question as Question
from mia.data.world_styles import DrawnPassageWriter
from mia.data.world_text import Passage, build_passages
from mia.errors import MiaError


@dataclass(frozen=True)
class WorldConfig:
    """Sizes of one world. Mirrored by ``configs/world/default.yaml`` (and small/large)."""

    countries: int = field(default=8, metadata={"help": "number of countries"})
    regions_per_country: int = field(default=3, metadata={"help": "regions in each country"})
    cities_per_region: int = field(default=4, metadata={"help": "cities in each region"})
    people: int = field(default=300, metadata={"help": "people (before twins)"})
    organisations: int = field(default=120, metadata={"help": "organisations (before twins)"})
    works: int = field(default=240, metadata={"help": "novels, films and albums"})
    twin_fraction: float = field(
        default=0.1,
        metadata={"help": "share of people / organisations given a near-miss twin (a distractor)"},
    )
    events: int = field(
        default=1500,
        metadata={"help": "event passages: mention entities without the asked facts (distractors)"},
    )
    single_hop: int = field(
        default=160,
        metadata={
            "help": "single-hop questions (both splits together; fewer if the world is too small)"
        },
    )
    bridge: int = field(
        default=160, metadata={"help": "bridge questions (two hops through an entity)"}
    )
    comparison: int = field(
        default=80, metadata={"help": "comparison questions (two entities, one attribute)"}
    )
    image: int = field(
        default=80,
        metadata={"help": "image questions (an emblem / flag / coat of arms to identify)"},
    )
    convention: int = field(
        default=120,
        metadata={
            "help": "vague wordings with a fixed meaning (held-out wordings: test split only)"
        },
    )
    test_fraction: float = field(
        default=0.2, metadata={"help": "share of each question type that goes to the test split"}
    )
    image_size: int = field(
        default=256, metadata={"help": "emblem / flag / coat-of-arms picture size in pixels"}
    )
    image_distractors: int = field(
        default=2,
        metadata={"help": "wrong results after the right one in each image-search cache entry"},
    )

    def validate(self) -> WorldConfig:
        counts = {f.name: getattr(self, f.name) for f in fields(self) if f.type in ("int", int)}
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise MiaError(
                    f"world config: {name} must be a non-negative integer, got {value!r}"
                )
        minimum = {"countries": 2, "regions_per_country": 1, "cities_per_region": 2, "people": 10}
        minimum |= {"organisations": 8, "works": 3, "image_size": 32}
        for name, low in minimum.items():
            if counts[name] < low:
                raise MiaError(f"world config: {name} must be >= {low}, got {counts[name]}")
        for name in ("twin_fraction", "test_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise MiaError(f"world config: {name} must be in [0, 1), got {value!r}")
        return self

    @classmethod
    def from_mapping(cls, data: dict[str, Any], base: WorldConfig | None = None) -> WorldConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MiaError(f"world config: unknown key(s) {unknown} (known: {sorted(known)})")
        return replace(base or cls(), **data).validate()


PRESETS: dict[str, WorldConfig] = {
    "small": WorldConfig(
        countries=3,
        regions_per_country=2,
        cities_per_region=3,
        people=60,
        organisations=24,
        works=40,
        events=150,
        single_hop=24,
        bridge=24,
        comparison=12,
        image=12,
        convention=24,
        image_size=128,
    ),
    "default": WorldConfig(),
    "large": WorldConfig(
        countries=20,
        regions_per_country=5,
        cities_per_region=6,
        people=4000,
        organisations=1500,
        works=4000,
        events=20000,
        single_hop=1500,
        bridge=1500,
        comparison=600,
        image=600,
        convention=600,
    ),
}


def resolve_config(size: str | WorldConfig) -> tuple[str, WorldConfig]:
    """``(size name, config)`` for a preset name or an explicit config."""
    if isinstance(size, WorldConfig):
        return "custom", size.validate()
    if size not in PRESETS:
        raise MiaError(f"unknown world size {size!r} (choose from {', '.join(PRESETS)})")
    return size, PRESETS[size]


@dataclass(frozen=True)
class CacheResult:
    """One entry of an image-search cache: a page title, a (fictional) URL and the image."""

    title: str
    image_url: str
    png: bytes
    entity_id: str


class World:
    """A generated world. Build with :meth:`generate`; write with :meth:`write`."""

    def __init__(
        self,
        seed: int,
        size: str,
        config: WorldConfig,
        entities: dict[str, Entity],
        passages: list[Passage],
        questions: list[Question],
        image_search: dict[str, list[CacheResult]],
        lexicon: Lexicon = LEGACY,
    ) -> None:
        self.seed = seed
        self.lexicon = lexicon  # how this world words things (mia.data.world_lexicon)
        self.size = size
        self.config = config
        self.entities = entities
        self.passages = passages
        self.questions = questions
        self.image_search = image_search  # question id -> ranked results (right entity first)
        self._by_id = {p.id: p for p in passages}

    # -- lookups ----------------------------------------------------------------------------------
    def passage(self, passage_id: str) -> Passage:
        return self._by_id[passage_id]

    def split(self, name: str) -> list[Question]:
        return [q for q in self.questions if q.split == name]

    def problems(self, question: Question) -> list[str]:
        """Validity problems of one question (``[]`` for every generated question)."""
        return question_problems(question, self.entities, self.passages, self._index())

    def _index(self) -> TextIndex:
        if not hasattr(self, "_text_index"):
            self._text_index = TextIndex(self.passages)
        return self._text_index

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)

    # -- building ---------------------------------------------------------------------------------
    @classmethod
    def generate(
        cls,
        seed: int = 0,
        size: str | WorldConfig = "default",
        log: Callable[[str], None] | None = None,
    ) -> World:
        """Build the world for ``seed``; same seed and size -> identical world and files."""
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise MiaError(f"seed must be a non-negative integer, got {seed!r}")
        size_name, cfg = resolve_config(size)
        say = log or (lambda _msg: None)

        # Separate streams per stage: changing question counts never changes the entities.
        def stream(stage: str) -> random.Random:
            return random.Random(f"mia-world:{seed}:{stage}")

        lexicon = lexicon_for(seed)
        say("entities")
        builder = EntityBuilder(stream("entities"), cfg)
        entities = builder.build()
        say(f"passages ({len(entities)} entities, {lexicon.style})")
        rng = stream("passages")
        writer = (
            None if lexicon.legacy else DrawnPassageWriter(rng, entities, builder.names, lexicon)
        )
        passages = build_passages(rng, entities, builder.names, cfg.events, writer)
        say(f"questions ({len(passages)} passages)")
        index = TextIndex(passages)
        captions = {e.id: e.emblem.caption() for e in entities.values() if e.emblem}
        maker = QuestionMaker(
            stream("questions"), entities, passages, index, captions,
            None if lexicon.legacy else lexicon,
        )  # fmt: skip
        quotas = {t: getattr(cfg, t) for t in QUESTION_TYPES}
        by_type = {t: maker.select(t, quotas[t]) for t in QUESTION_TYPES}
        questions = _assign_splits(stream("splits"), by_type, cfg.test_fraction, seed)
        say(f"images ({sum(q.type == 'image' for q in questions)} image questions)")
        image_search = _draw_images(stream("images"), entities, questions, cfg)
        world = cls(seed, size_name, cfg, entities, passages, questions, image_search, lexicon)
        world._text_index = index
        return world

    def write(
        self, out_dir: str | Path, log: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """Write all files into ``out_dir`` (replaced atomically); returns the manifest."""
        return write_world(self, Path(out_dir), log=log)


def _assign_splits(
    rng: random.Random, by_type: dict[str, list[Question]], test_fraction: float, seed: int
) -> list[Question]:
    """Stratified split (every type in both splits when it can be), then ids per split."""
    splits: dict[str, list[Question]] = {"train": [], "test": []}
    for qtype in QUESTION_TYPES:
        held_out = [q for q in by_type[qtype] if q.held_out]  # never in a train split
        qs = [q for q in by_type[qtype] if not q.held_out]
        rng.shuffle(qs)
        n_test = round(len(qs) * test_fraction)
        if test_fraction > 0 and len(qs) >= 2:
            n_test = max(1, n_test)
        for k, q in enumerate(qs):
            q.split = "test" if k < n_test else "train"
            splits[q.split].append(q)
        for q in held_out:
            q.split = "test"
            splits["test"].append(q)
    out = []
    for split, qs in splits.items():
        rng.shuffle(qs)
        for k, q in enumerate(qs):
            q.id = f"w{seed}_{split}_{k:05d}"
            out.append(q)
    return out


def _draw_images(
    rng: random.Random, entities: dict[str, Entity], questions: list[Question], cfg: WorldConfig
) -> dict[str, list[CacheResult]]:
    """Render question pictures and build each image question's search results."""
    pngs: dict[str, bytes] = {}

    def png(entity: Entity) -> bytes:
        if entity.id not in pngs:
            assert entity.emblem is not None
            pngs[entity.id] = entity.emblem.png(cfg.image_size)
        return pngs[entity.id]

    def result(entity: Entity) -> CacheResult:
        slug = entity.name.lower().replace(" ", "-")
        url = f"https://emblems.mia-world.example/{entity.kind}/{slug}.png"
        return CacheResult(entity.name, url, png(entity), entity.id)

    same_kind: dict[str, list[Entity]] = {}
    for e in entities.values():
        if e.emblem:
            same_kind.setdefault(e.kind, []).append(e)
    cache: dict[str, list[CacheResult]] = {}
    for q in questions:
        if q.type != "image":
            continue
        subject = entities[q.entity_ids[0]]
        q.image_png = png(subject)
        assert subject.emblem is not None
        others = [e for e in same_kind[subject.kind] if e.id != subject.id]
        # Most similar pictures first (shared colours/shape), random among equals.
        keyed = sorted(
            others,
            key=lambda e: (-subject.emblem.shared_attributes(e.emblem), rng.random()),  # type: ignore[union-attr]
        )
        cache[q.id] = [result(subject)] + [result(e) for e in keyed[: cfg.image_distractors]]
    return cache


__all__ = [
    "CacheResult",
    "DATA_SOURCE",
    "PRESETS",
    "Passage",
    "Question",
    "World",
    "WorldConfig",
    "benchmark_qrels",
    "benchmark_queries",
    "corpus_passage",
    "iter_corpus",
    "resolve_config",
    "sample_queries",
]
