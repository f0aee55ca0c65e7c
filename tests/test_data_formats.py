"""QA loaders/writers for the reference parquet and JSONL formats."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mia.data.formats import (
    DataFormatError,
    QAItem,
    decode_image,
    image_to_data_url,
    load_jsonl_qa,
    load_parquet_qa,
    load_qa,
    write_jsonl_qa,
    write_parquet_qa,
)
from mia.data.world import World
from mia.data.world_io import question_to_item


def _png(colour: str = "red", size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buf, format="PNG")
    return buf.getvalue()


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), "blue").save(buf, format="JPEG")
    return buf.getvalue()


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[World, Path]:
    world = World.generate(5, "small")
    out = tmp_path_factory.mktemp("fmt") / "world"
    world.write(out)
    return world, out


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_world_files_round_trip_through_the_loaders(world_dir, suffix):
    world, out = world_dir
    for split in ("train", "test"):
        loaded = load_qa(out / f"{split}.{suffix}")
        expected = [question_to_item(q, world.seed) for q in world.split(split)]
        assert [it.id for it in loaded] == [it.id for it in expected]
        for got, want in zip(loaded, expected, strict=True):
            assert got.question == want.question
            assert got.answers == want.answers
            assert got.modality == want.modality
            assert got.images == want.images
            assert got.image_caption == want.image_caption
            assert (got.data_source, got.category, got.level) == (
                "mia_world",
                want.category,
                want.level,
            )
            assert got.extra_info == want.extra_info
            assert got.extra == {}
        image_items = [it for it in loaded if it.modality == "text-image"]
        assert image_items and all(len(it.images) == 1 for it in image_items)
        assert image_items[0].pil_images()[0].format == "PNG"


def test_reference_parquet_columns(world_dir):
    _, out = world_dir
    table = pq.read_table(out / "test.parquet")
    assert table.column_names == [
        "data_source",
        "prompt",
        "modality",
        "data_id",
        "image_caption",
        "images",
        "reward_model",
        "category",
        "level",
        "extra_info",
    ]
    row = table.slice(0, 1).to_pylist()[0]
    assert row["prompt"] == [{"role": "user", "content": row["prompt"][0]["content"]}]
    assert row["reward_model"]["style"] == "rule" and isinstance(
        row["reward_model"]["ground_truth"], str
    )
    assert set(row["extra_info"]) == {
        "question_type",
        "relation",
        "supporting_ids",
        "entity_ids",
        "split",
        "seed",
        "aliases",
        "template",
        "held_out",
    }
    line = json.loads((out / "test.jsonl").read_text().splitlines()[0])
    assert {"question", "answer", "id", "images", "image_caption"} <= set(line)
    assert isinstance(line["images"], list) and isinstance(line["image_caption"], list)


def test_custom_items_round_trip_with_extra_columns(tmp_path):
    items = [
        QAItem(
            "a",
            "Q one?",
            ["Alpha", "alpha team"],
            images=[_png()],
            image_caption="red square",
            modality="text-image",
            extra={"plan": "1. search"},
        ),  # fmt: skip
        QAItem("b", "Q two?", ["Beta"], level=3, category="time", extra={"plan": "2. think"}),
    ]
    for writer, name in ((write_parquet_qa, "x.parquet"), (write_jsonl_qa, "x.jsonl")):
        writer(items, tmp_path / name)
        back = load_qa(tmp_path / name)
        assert [
            (b.id, b.question, b.answers, b.images, b.image_caption, b.modality) for b in back
        ] == [(i.id, i.question, i.answers, i.images, i.image_caption, i.modality) for i in items]
        assert [b.extra for b in back] == [{"plan": "1. search"}, {"plan": "2. think"}]
        assert back[1].level == 3 and back[1].category == "time"


def test_jsonl_reference_variants(tmp_path):
    png, jpeg = _png(), _jpeg()
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "p.png").write_bytes(png)
    path = _jsonl(
        tmp_path / "ref.jsonl",
        [
            {
                "question": "q0",
                "answer": ["x", "y"],
                "ids": 7,
                "images": [base64.b64encode(png).decode()],
                "image_caption": ["a caption"],
            },  # fmt: skip
            {
                "question": "q1",
                "answer": "z",
                "id": "k",
                "images": [image_to_data_url(jpeg)],
                "image_caption": "c",
            },
            {"question": "q2", "answer": "w", "data_id": "d", "images": ["pics/p.png"]},
            {"question": "q3", "answer": 1999},
        ],
    )
    items = load_jsonl_qa(path)
    assert [it.id for it in items] == ["7", "k", "d", "ref_3"]
    assert items[0].answers == ["x", "y"] and items[0].image_caption == "a caption"
    assert items[0].images == [png] and items[0].modality == "text-image"
    assert items[1].images == [jpeg] and items[1].image_caption == "c"
    assert items[2].images == [png]
    assert (
        items[3].answers == ["1999"] and items[3].modality == "text-only" and items[3].images == []
    )


def test_jsonl_rows_with_mixed_types_still_load(tmp_path):
    # datasets refuses a column that is a string in one row and a list in another; we do not.
    path = _jsonl(
        tmp_path / "mixed.jsonl",
        [{"question": "a", "answer": "1"}, {"question": "b", "answer": ["2", "3"]}],
    )
    assert [it.answers for it in load_qa(path)] == [["1"], ["2", "3"]]


def test_json_array_file(tmp_path):
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"question": "a", "answer": "1", "id": "x"}]))
    assert [(it.id, it.answer) for it in load_qa(path)] == [("x", "1")]


def test_parquet_reference_variants(tmp_path):
    png = _png("green")
    table = pa.table(
        {
            "prompt": ["plain string prompt", None],
            "question": [None, "from question column"],
            "data_id": ["p0", "p1"],
            "images": pa.array([[png], []], pa.list_(pa.binary())),
            "reward_model": [{"ground_truth": ["g1", "g2"]}, {"ground_truth": ["h"]}],
            "image_caption": [["cap a", "cap b"], None],
        }
    )
    pq.write_table(table, tmp_path / "ref.parquet")
    items = load_parquet_qa(tmp_path / "ref.parquet")
    assert items[0].question == "plain string prompt" and items[0].answers == ["g1", "g2"]
    assert (
        items[0].images == [png] and items[0].image_caption == "cap a"
    )  # the first caption (mia.caption)
    assert items[1].question == "from question column" and items[1].answers == ["h"]


def test_parquet_written_by_datasets_with_image_features(tmp_path):
    import datasets

    png = _png("purple", 12)
    ds = datasets.Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": "Which flag?"}]],
            "images": [[{"bytes": png, "path": None}]],
            "reward_model": [{"ground_truth": "Velmora"}],
            "data_id": ["hf0"],
        },
        features=datasets.Features(
            {
                "prompt": datasets.List(
                    {"role": datasets.Value("string"), "content": datasets.Value("string")}
                ),
                "images": datasets.List(datasets.Image()),
                "reward_model": {"ground_truth": datasets.Value("string")},
                "data_id": datasets.Value("string"),
            }
        ),
    )
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    (item,) = load_qa(tmp_path / "hf.parquet")
    assert (item.id, item.question, item.answers) == ("hf0", "Which flag?", ["Velmora"])
    assert Image.open(io.BytesIO(item.images[0])).size == (12, 12)


def test_unlabelled_rows_allowed_only_on_request(tmp_path):
    path = _jsonl(tmp_path / "nogt.jsonl", [{"question": "a"}])
    with pytest.raises(DataFormatError, match=r"^nogt.jsonl row 0: field 'answer' missing"):
        load_qa(path)
    assert load_qa(path, require_answer=False)[0].answers == []


# -- errors name file, row and field ------------------------------------------------------------


def _rows_with(bad_index: int, bad_row: dict, n: int = 20) -> list[dict]:
    rows = [{"question": f"q{i}", "answer": "a", "id": f"i{i}"} for i in range(n)]
    rows[bad_index] = bad_row
    return rows


@pytest.mark.parametrize(
    ("bad_index", "bad_row", "message"),
    [
        (17, {"answer": "a", "id": "i17"}, "test.jsonl row 17: field 'question' missing"),
        (
            3,
            {"question": "q", "answer": "a", "images": ["%%%not-base64%%%"]},
            "test.jsonl row 3: 'images[0]' is not valid base64",
        ),  # fmt: skip
        (
            4,
            {"question": "q", "answer": "a", "images": [base64.b64encode(b"plain text").decode()]},
            "test.jsonl row 4: 'images[0]' is not a readable image",
        ),  # fmt: skip
        (
            5,
            {"question": "q", "answer": "a", "images": ["data:image/png,abc"]},
            "test.jsonl row 5: 'images[0]' is a data URL without base64 content",
        ),  # fmt: skip
        (
            6,
            {"question": "q", "answer": "a", "modality": "video"},
            "test.jsonl row 6: field 'modality' must be one of",
        ),
        (
            7,
            {"question": "q", "answer": "a", "id": "i2"},
            "test.jsonl row 7: duplicate id 'i2' (first at row 2)",
        ),
        (
            8,
            {"question": "q", "answer": "a", "image_caption": [1]},
            "test.jsonl row 8: 'image_caption[0]' must be a string",
        ),
        (
            9,
            {"question": "q", "answer": "a", "level": "high"},
            "test.jsonl row 9: field 'level' must be an integer",
        ),
        (10, {"question": "", "answer": "a"}, "test.jsonl row 10: field 'question' missing"),
    ],
)
def test_jsonl_errors_name_row_and_field(tmp_path, bad_index, bad_row, message):
    path = _jsonl(tmp_path / "test.jsonl", _rows_with(bad_index, bad_row))
    with pytest.raises(DataFormatError) as exc:
        load_qa(path)
    assert str(exc.value).startswith(message)


def test_invalid_json_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a", "answer": "b"}\n{"question": oops}\n')
    with pytest.raises(DataFormatError, match=r"^bad.jsonl line 2: invalid JSON"):
        load_qa(path)


def test_parquet_errors_name_row_and_field(tmp_path):
    table = pa.table({"prompt": [[{"role": "user", "content": "q"}]] * 3, "data_id": ["a", "b", "c"],
                      "reward_model": [{"ground_truth": "x"}, {"ground_truth": None}, {"ground_truth": "y"}]})  # fmt: skip
    pq.write_table(table, tmp_path / "train.parquet")
    with pytest.raises(DataFormatError, match=r"^train.parquet row 1: field 'answer' missing"):
        load_qa(tmp_path / "train.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataFormatError, match=r"^junk.parquet: not a readable parquet file"):
        load_qa(tmp_path / "junk.parquet")


def test_path_and_format_errors(tmp_path):
    with pytest.raises(DataFormatError, match="no such file"):
        load_qa(tmp_path / "missing.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataFormatError, match="unknown data format"):
        load_qa(tmp_path / "data.csv")


def test_decode_image_forms():
    png = _png()
    assert decode_image(png, "x") == png
    assert decode_image({"bytes": png, "path": None}, "x") == png
    assert decode_image(image_to_data_url(png), "x") == png
    assert image_to_data_url(png).startswith("data:image/png;base64,iVBORw0KG")
    assert image_to_data_url(_jpeg()).startswith("data:image/jpeg;base64,/9j/")
    with pytest.raises(DataFormatError, match=r"^x has neither 'bytes' nor 'path'"):
        decode_image({"bytes": None}, "x")
    with pytest.raises(DataFormatError, match=r"^x has unsupported type int"):
        decode_image(5, "x")
