"""Writing a world to disk: corpus, QA files per split, image-search cache, manifest.

Layout of ``out_dir``::

    corpus.jsonl                  {"id", "contents": "Title\\ntext"} per line (Search-R1)
    train.parquet / test.parquet  reference RL parquet (see mia.data.formats)
    train.jsonl / test.jsonl      reference inference JSONL
    image_cache/<data_id>/meta.json + img_000.png ...   image-search results, right one first
    world.json                    seed, config, counts, sha256 of every other file

Every file is a pure function of (seed, config): same inputs, same bytes (for one Pillow/zlib and
pyarrow build: PNG and parquet encoders are deterministic but versions may differ).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from mia.data.formats import QAItem, write_jsonl_qa, write_parquet_qa
from mia.data.world_lexicon import seed_ranges
from mia.errors import MiaError
from mia.paths import atomic_dir, file_sha256

if TYPE_CHECKING:
    from mia.data.world import Question, World

WORLD_FORMAT_VERSION = 2  # bump when the files a world writes change
DATA_SOURCE = "mia_world"
SPLITS = ("train", "test")
MANIFEST = "world.json"


def question_to_item(q: Question, seed: int) -> QAItem:
    return QAItem(
        id=q.id,
        question=q.question,
        answers=q.answers,
        modality=q.modality,
        images=[q.image_png] if q.image_png else [],
        image_caption=q.image_caption,
        data_source=DATA_SOURCE,
        category=q.category,
        level=q.level,
        extra_info={
            "question_type": q.type,
            "relation": q.relation,
            "supporting_ids": list(q.supporting_ids),
            "entity_ids": list(q.entity_ids),
            "split": q.split,
            "seed": seed,
            "template": q.template,  # convention wordings only ("" otherwise)
            "held_out": q.held_out,
        },
    )


def _write_cache(world: World, root: Path, show: bool) -> None:
    for qid, results in tqdm(
        sorted(world.image_search.items()), desc="image cache", unit="q", disable=not show
    ):
        folder = root / qid
        folder.mkdir(parents=True)
        meta = {"search_results": [{"title": r.title, "image_url": r.image_url} for r in results]}
        (folder / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
        for k, r in enumerate(results):
            (folder / f"img_{k:03d}.png").write_bytes(r.png)


def check_target(out_dir: Path) -> None:
    """Refuse to replace a folder that holds something other than a world."""
    if out_dir.exists() and not out_dir.is_dir():
        raise MiaError(f"{out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise MiaError(
            f"refusing to overwrite {out_dir}: not empty and not a world folder (no {MANIFEST})"
        )


def corpus_lines(world: World) -> list[str]:
    """The lines of the world's ``corpus.jsonl``: one ``{"id", "contents"}`` row per passage."""
    return [
        json.dumps({"id": p.id, "contents": p.contents}, ensure_ascii=False) + "\n"
        for p in world.passages
    ]


def write_corpus(world: World, path: Path) -> Path:
    """Write the world's ``corpus.jsonl`` (:func:`corpus_lines`) to ``path``; returns ``path``."""
    path.write_text("".join(corpus_lines(world)), encoding="utf-8")
    return path


def write_world(
    world: World, out_dir: Path, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    say = log or (lambda _msg: None)
    check_target(out_dir)
    with atomic_dir(out_dir) as tmp:
        tmp.chmod(0o755)  # mkdtemp makes it private; a dataset folder should be readable
        say(f"corpus.jsonl ({len(world.passages)} passages)")
        write_corpus(world, tmp / "corpus.jsonl")
        for split in SPLITS:
            items = [question_to_item(q, world.seed) for q in world.split(split)]
            say(f"{split}.parquet / {split}.jsonl ({len(items)} questions)")
            write_parquet_qa(items, tmp / f"{split}.parquet")
            write_jsonl_qa(items, tmp / f"{split}.jsonl")
        _write_cache(world, tmp / "image_cache", show=log is not None)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        manifest = {
            "format": "mia-world",
            "version": WORLD_FORMAT_VERSION,
            "seed": world.seed,
            "size": world.size,
            "config": world.config_dict(),
            "counts": {
                "entities": dict(sorted(Counter(e.kind for e in world.entities.values()).items())),
                "passages": len(world.passages),
                "questions": {
                    split: dict(sorted(Counter(q.type for q in world.split(split)).items()))
                    for split in SPLITS
                },
                "image_cache_entries": len(world.image_search),
            },
            "files": {p.relative_to(tmp).as_posix(): file_sha256(p) for p in files},
        }
        if not world.lexicon.legacy:
            # Drawn worlds say how they word things, conventions included (docs/world.md).
            manifest["range"] = seed_ranges().of(world.seed)
            manifest["lexicon"] = world.lexicon.to_dict()
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n")
    return manifest
