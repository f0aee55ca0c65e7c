"""The synthetic research world: determinism, answerability, bridge rules, image caches, CLI."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml
from PIL import Image

from mia.cli import main as mia_main
from mia.data.image_cache import ImageSearchCache
from mia.data.world import (
    PRESETS,
    World,
    WorldConfig,
    benchmark_qrels,
    benchmark_queries,
    corpus_passage,
    iter_corpus,
)
from mia.data.world_questions import CONVENTIONS, HELD_OUT_TEMPLATES
from mia.errors import MiaError

REPO = Path(__file__).resolve().parents[1]
TYPES = {"single_hop", "bridge", "comparison", "image", "convention"}


def _files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _whole(phrase: str) -> re.Pattern[str]:
    # Independent of the generator's own matcher: a regex with word guards.
    return re.compile(rf"(?<![\w]){re.escape(phrase)}(?![\w])")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, Path]:
    world = World.generate(0, "small")
    out = tmp_path_factory.mktemp("world") / "w0"
    world.write(out)
    return world, out


# -- determinism --------------------------------------------------------------------------------


def test_same_seed_gives_identical_bytes_and_other_seed_differs(small, tmp_path):
    _, out = small
    again = tmp_path / "again"
    World.generate(0, "small").write(again)
    first, second = _files(out), _files(again)
    assert sorted(first) == sorted(second)
    assert {
        "corpus.jsonl",
        "train.parquet",
        "test.parquet",
        "train.jsonl",
        "test.jsonl",
        "world.json",
    } <= set(first)
    for name in first:
        assert first[name] == second[name], name

    other = tmp_path / "seed1"
    World.generate(1, "small").write(other)
    third = _files(other)
    for name in ("corpus.jsonl", "train.parquet", "test.parquet", "train.jsonl", "test.jsonl"):
        assert third[name] != first[name], name


def test_manifest_hashes_and_counts(small):
    world, out = small
    manifest = json.loads((out / "world.json").read_text())
    assert (
        manifest["format"] == "mia-world" and manifest["seed"] == 0 and manifest["size"] == "small"
    )
    assert manifest["config"] == asdict(PRESETS["small"])
    files = {k: v for k, v in _files(out).items() if k != "world.json"}
    assert manifest["files"] == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    assert manifest["counts"]["passages"] == len(world.passages)
    for split in ("train", "test"):
        assert sum(manifest["counts"]["questions"][split].values()) == len(world.split(split))


def test_config_yaml_files_mirror_presets():
    for name, cfg in PRESETS.items():
        data = yaml.safe_load((REPO / "configs" / "world" / f"{name}.yaml").read_text())
        assert WorldConfig.from_mapping(data) == cfg, name


def test_config_validation_errors():
    with pytest.raises(MiaError, match="unknown key"):
        WorldConfig.from_mapping({"peeple": 3})
    with pytest.raises(MiaError, match="people must be >= 10"):
        World.generate(0, replace(PRESETS["small"], people=2))
    with pytest.raises(MiaError, match="test_fraction must be in"):
        WorldConfig.from_mapping({"test_fraction": 1.5})
    with pytest.raises(MiaError, match="unknown world size"):
        World.generate(0, "huge")
    with pytest.raises(MiaError, match="seed must be"):
        World.generate(-1, "small")


# -- content ------------------------------------------------------------------------------------


def test_passages_are_titled_and_ids_unique(small):
    world, out = small
    lines = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert [set(r) for r in lines] == [{"id", "contents"}] * len(world.passages)
    assert len({r["id"] for r in lines}) == len(lines) == len(world.passages)
    for row, passage in zip(lines, world.passages, strict=True):
        title, text = row["contents"].split("\n", 1)
        assert (title, text) == (passage.title, passage.text) and len(text.split()) >= 15
    kinds = {p.kind for p in world.passages}
    assert kinds == {"entity", "event"}
    # One passage per entity, and near-miss twins exist as distractors.
    assert sum(p.kind == "entity" for p in world.passages) == len(world.entities)
    twins = [e for e in world.entities.values() if e.twin_of]
    assert twins
    for twin in twins:
        original = world.entities[twin.twin_of]
        assert twin.name != original.name and len(twin.name) == len(original.name)
        assert sum(a != b for a, b in zip(twin.name, original.name, strict=True)) == 1


def test_every_question_follows_the_rules(small):
    world, _ = small
    texts = [p.contents for p in world.passages]
    by_id = {p.id: p.contents for p in world.passages}
    assert {q.type for q in world.questions} == TYPES
    assert len({q.id for q in world.questions}) == len(world.questions)
    for q in world.questions:
        assert world.problems(q) == [], (q.id, q.question)
        support = [by_id[pid] for pid in q.supporting_ids]
        # Answerable: the canonical answer string is in a supporting passage.
        assert any(_whole(q.answer).search(t) for t in support), q
        names = [world.entities[e].name for e in q.entity_ids]
        if q.type == "bridge":
            subject, bridge = names
            first, second = support
            assert len(set(q.supporting_ids)) == 2
            assert subject in q.question and bridge not in q.question
            assert bridge in first
            assert not any(_whole(a).search(first) for a in q.answers)
            assert _whole(q.answer).search(second)
            # No passage in the whole corpus holds both the named entity and the answer.
            both = [
                t
                for t in texts
                if _whole(subject).search(t) and any(_whole(a).search(t) for a in q.answers)
            ]
            assert both == [], (q.question, both[:1])
        elif q.type == "comparison":
            assert q.answer in names and all(n in q.question for n in names)
        elif q.type == "image":
            assert names[0] not in q.question and names[0] not in q.image_caption
            assert q.modality == "text-image"
        elif q.type == "convention":
            conv = {c.id: c for c in CONVENTIONS}[q.template]
            assert q.question == conv.wording.format(x=names[0])
            assert q.relation.endswith("." + conv.relation) and q.held_out == conv.held_out
        else:
            assert q.type == "single_hop" and names[0] in q.question
        if q.type != "image":
            assert q.image_png is None and q.image_caption == "" and q.modality == "text-only"


def test_splits_are_stratified(small):
    world, _ = small
    for split in ("train", "test"):
        qs = world.split(split)
        assert {q.type for q in qs} == TYPES
        assert all(q.id.startswith(f"w0_{split}_") for q in qs)
    assert len(world.split("test")) < len(world.split("train"))


def test_held_out_wordings_are_in_test_splits_only():
    """No train split of any world holds a held-out convention wording (so no gold, SFT or
    GRPO data built from train splits can), and every test split holds them."""
    for seed in (0, 1, 2):
        world = World.generate(seed, "small")
        train = world.split("train")
        assert not [q for q in train if q.held_out or q.template in HELD_OUT_TEMPLATES]
        test_templates = {q.template for q in world.split("test") if q.held_out}
        assert test_templates == HELD_OUT_TEMPLATES
        seen = {q.template for q in train if q.template}
        assert seen and not seen & HELD_OUT_TEMPLATES


def test_answer_formats_have_aliases():
    world = World.generate(0, "small")
    dated = [
        q for q in world.questions if q.relation.endswith("birth_date") and q.type != "comparison"
    ]
    assert dated
    for q in dated:
        day, month, year = q.answer.split()
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", q.aliases[1]) and q.aliases[1].startswith(year)
        assert q.aliases[0] == f"{month} {day}, {year}"
    for q in (
        q for q in world.questions if q.relation.endswith("population") and q.type != "comparison"
    ):
        assert q.aliases == [q.answer.replace(",", "")]


def test_bridge_question_reads_as_two_hops():
    world = World.generate(0, "small")
    q = next(q for q in world.questions if q.relation == "org.founder>person.birth_city")
    org, person = (world.entities[e] for e in q.entity_ids)
    assert q.question == f"In which city was the founder of {org.name} born?"
    assert q.answer == world.entities[person.attrs["birth_city"]].name
    assert world.passage(q.supporting_ids[0]).entity_id == org.id
    assert world.passage(q.supporting_ids[1]).entity_id == person.id


def test_default_world_meets_its_quotas():
    t0 = time.perf_counter()
    world = World.generate(0)
    elapsed = time.perf_counter() - t0
    cfg = PRESETS["default"]
    counts = {t: sum(q.type == t for q in world.questions) for t in TYPES}
    assert counts == {t: getattr(cfg, t) for t in TYPES}
    assert 700 <= len(world.entities) <= 1000 and len(world.passages) >= 2000
    assert elapsed < 60  # generous: catches accidental quadratic blow-ups only


# -- images ------------------------------------------------------------------------------------


def test_image_questions_have_pictures_and_a_cache_naming_the_entity(small):
    world, out = small
    cache = ImageSearchCache([out / "image_cache"])
    image_qs = [q for q in world.questions if q.type == "image"]
    assert len(image_qs) == PRESETS["small"].image
    captions = set()
    for q in image_qs:
        subject = world.entities[q.entity_ids[0]]
        img = q.image
        assert img is not None and img.format == "PNG" and img.width == PRESETS["small"].image_size
        captions.add(q.image_caption)
        hits = cache.search(q.id)
        assert len(hits) == 1 + PRESETS["small"].image_distractors
        assert hits[0].title == subject.name
        assert all(h.title != subject.name for h in hits[1:])
        assert list(hits[0].image.getdata()) == list(img.convert("RGB").getdata())
        meta = json.loads((out / "image_cache" / q.id / "meta.json").read_text())
        assert [r["title"] for r in meta["search_results"]] == [h.title for h in hits]
        assert all(r["image_url"].startswith("https://") for r in meta["search_results"])
    # Pictures are unique per entity, so captions of different subjects differ.
    assert len(captions) == len({q.entity_ids[0] for q in image_qs})


def test_emblem_render_is_deterministic_and_caption_exact():
    from mia.data.world_emblem import Emblem

    e = Emblem("emblem", "blue", "star", "gold", "border", "white")
    assert e.caption() == "An emblem showing a gold star on a blue field, with a white border."
    assert e.png(64) == e.png(64)
    img = Image.open(io.BytesIO(e.png(64))).convert("RGB")
    assert img.getpixel((32, 32)) == (232, 182, 32)  # gold star centre
    assert img.getpixel((0, 0)) == (246, 246, 246)  # white border
    assert img.getpixel((12, 50)) == (28, 62, 170)  # blue field
    flag = Emblem(
        "flag", "red", "circle", "white", stripes=("red", "green", "black"), orientation="vertical"
    )
    assert flag.caption() == (
        "A flag with three vertical stripes of red, green and black, with a white circle in the centre."
    )
    assert flag.render(96).size == (96, 64)


# -- streaming corpus ----------------------------------------------------------------------------


def test_iter_corpus_streams_unique_ids_quickly():
    n = 20_000
    t0 = time.perf_counter()
    ids, titles = set(), 0
    gen = iter_corpus(n, seed=0)
    assert iter(gen) is gen  # a generator: nothing materialised up front
    for row in gen:
        ids.add(row["id"])
        title, text = row["contents"].split("\n", 1)
        titles += bool(title) and len(text) > 50
    assert len(ids) == n == titles
    assert time.perf_counter() - t0 < 30
    assert next(iter_corpus(5, 0)) == next(iter_corpus(5, 0)) == corpus_passage(0, 5, 0)
    assert next(iter_corpus(5, 1)) != next(iter_corpus(5, 0))
    people = [r["contents"].split("\n")[0] for r in iter_corpus(n) if "(born" in r["contents"]]
    assert len(set(people)) == len(people)


def test_benchmark_queries_point_at_their_passages():
    n = 1_000_000  # never materialised: qrels address passages directly
    pairs = benchmark_qrels(50, n, seed=3)
    assert benchmark_queries(50, n, seed=3) == [q for q, _ in pairs]
    assert len({q for q, _ in pairs}) > 40
    for query, pid in pairs:
        assert 0 <= int(pid) < n
        title = corpus_passage(int(pid), n, 3)["contents"].split("\n")[0]
        assert title in query


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_writes_a_world(tmp_path, capsys):
    out = tmp_path / "cli"
    mia_main(
        [
            "world",
            "--seed",
            "2",
            "--size",
            "small",
            "--out",
            str(out),
            "--set",
            "image=4",
            "--quiet",
        ]
    )
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out} (")
    manifest = json.loads((out / "world.json").read_text())
    assert (
        manifest["seed"] == 2 and manifest["config"]["image"] == 4 and manifest["size"] == "custom"
    )
    assert sum(c.get("image", 0) for c in manifest["counts"]["questions"].values()) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "huge"], "invalid choice: 'huge'"),
        (["--seed", "-1"], "--seed must be >= 0"),
        (["--set", "peeple=3"], "unknown key(s) ['peeple']"),
        (["--set", "people"], "expected KEY=VALUE"),
        (["--config", "/nonexistent.yaml"], "no such file"),
    ],
)
def test_cli_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        mia_main(["world", "--out", str(tmp_path / "x"), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mia world: error:") and message in err
    assert not (tmp_path / "x").exists()


def test_cli_refuses_to_replace_a_foreign_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    proc = subprocess.run(
        [sys.executable, "-m", "mia.cli", "world", "--size", "small", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("mia world: error: refusing to overwrite")
    )
    assert (tmp_path / "keep.txt").read_text() == "mine"
