"""Worlds drawn per seed: the seed ranges, the drawn lexicons, and the rule that no test world's
convention (a wording and its meaning) occurs in any train or dev world."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from mia.data.world import World
from mia.data.world_lexicon import (
    FAMILIES,
    LEGACY,
    draw_lexicon,
    lexicon_for,
    pair_ranges,
    seed_ranges,
)
from mia.data.world_questions import CONVENTIONS
from mia.errors import MiaError


def test_seed_ranges_come_from_the_committed_config() -> None:
    ranges = seed_ranges()
    assert {name: ranges.of(first) for name, (first, _) in ranges.ranges.items()} == {
        "legacy": "legacy",
        "train": "train",
        "dev": "dev",
        "test": "test",
    }
    assert ranges.of(1) == "legacy" and ranges.of(20000) == "test"
    with pytest.raises(MiaError, match="world seed 15000 is in no range"):
        ranges.of(15000)
    assert ranges.seeds("test", 3) == [20000, 20001, 20002]


def test_every_family_has_pairs_in_every_range_and_they_are_disjoint() -> None:
    ranges = pair_ranges()
    for fam in FAMILIES:
        got = Counter(ranges[(w, r)] for w in fam.wordings for r in fam.readings)
        assert set(got) == {"train", "dev", "test"}, (fam.id, got)
    by_range: dict[str, set] = {}
    for pair, where in ranges.items():
        by_range.setdefault(where, set()).add(pair)
    assert not by_range["test"] & (by_range["train"] | by_range["dev"])


def test_no_test_world_convention_occurs_in_a_train_or_dev_world() -> None:
    """Every seed of every drawn range (drawing a lexicon is cheap): the test worlds' pairs and
    the train and dev worlds' pairs never meet."""
    ranges = seed_ranges()
    seen: dict[str, set] = {"train": set(), "dev": set(), "test": set()}
    for where in seen:
        first, last = ranges.ranges[where]
        for seed in range(first, last + 1):
            seen[where] |= draw_lexicon(seed, where).pairs()
    assert seen["test"] and not seen["test"] & (seen["train"] | seen["dev"])
    assert not seen["dev"] & seen["train"]
    # Test worlds vary among themselves too: more than one meaning per family is used.
    assert len(seen["test"]) >= len(FAMILIES) * 2


def test_legacy_seeds_keep_the_fixed_lexicon() -> None:
    assert lexicon_for(1) is LEGACY and lexicon_for(99) is LEGACY
    assert LEGACY.conventions == CONVENTIONS and LEGACY.style == "encyclopedia"


def test_drawn_lexicons_vary_by_seed() -> None:
    lexicons = [lexicon_for(seed) for seed in range(100, 160)]
    assert {lex.style for lex in lexicons} == {"encyclopedia", "narrative"}
    assert len({lex.nouns["region"] for lex in lexicons}) >= 3
    assert len({lex.templates["person"]["birth_city"] for lex in lexicons}) >= 3
    assert len({lex.work_verbs["novel"][0] for lex in lexicons}) >= 2
    assert len({c.relation for lex in lexicons for c in lex.conventions}) >= 8
    for lex in lexicons:
        conv = {c.wording for c in lex.conventions}
        standard = {w for rels in lex.templates.values() for w in rels.values()}
        assert not conv & standard  # a vague wording is never also a plain question
    assert lexicon_for(123) == lexicon_for(123)  # a function of the seed


@pytest.mark.parametrize("seed", [100, 20001])
def test_a_drawn_world_is_sound_and_says_how_it_words_things(seed: int, tmp_path: Path) -> None:
    world = World.generate(seed, "small")
    assert all(not world.problems(q) for q in world.questions)
    types = Counter(q.type for q in world.questions)
    assert set(types) == {"single_hop", "bridge", "comparison", "image", "convention"}
    lex = world.lexicon
    templates = {q.template for q in world.questions if q.type == "convention"}
    assert templates <= {c.id for c in lex.conventions} and len(templates) >= 5
    for q in world.questions:  # the questions are worded by the world's lexicon
        if q.type == "convention":
            conv = next(c for c in lex.conventions if c.id == q.template)
            assert q.relation.endswith("." + conv.relation)
    manifest = world.write(tmp_path / "w")
    again = json.loads((tmp_path / "w" / "world.json").read_text())
    assert manifest["range"] == again["range"] == seed_ranges().of(seed)
    assert again["lexicon"]["conventions"] == [
        {"id": c.id, "kind": c.kind, "wording": c.wording, "relation": c.relation}
        for c in lex.conventions
    ]
    corpus = (tmp_path / "w" / "corpus.jsonl").read_text()
    assert World.generate(seed, "small").write(tmp_path / "w2")["files"] == manifest["files"]
    noun = lex.nouns["region"]
    assert f" {noun} " in corpus or f" {noun}s" in corpus
