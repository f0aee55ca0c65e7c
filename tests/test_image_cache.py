"""Image-search cache in the reference layout: <root>/<data_id>/meta.json + img_XXX.*"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from mia.data.image_cache import ImageCacheError, ImageSearchCache, validate_cache_id


def _entry(root: Path, data_id: str, meta: dict, images: dict[str, str]) -> Path:
    folder = root / data_id
    folder.mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps(meta))
    for name, colour in images.items():
        fmt = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP", "gif": "GIF"}[name.rsplit(".", 1)[1]]
        Image.new("RGB", (10, 6), colour).save(folder / name, format=fmt)
    return folder


def _results(*titles: str) -> dict:
    return {
        "search_results": [{"title": t, "image_url": f"https://x.example/{t}.jpg"} for t in titles]
    }


def test_search_results_layout_mixed_extensions_capped_at_three(tmp_path):
    _entry(
        tmp_path,
        "q1",
        _results("A", "B", "C", "D"),
        {
            "img_000.jpg": "red",
            "img_001.png": "green",
            "img_002.webp": "blue",
            "img_003.gif": "white",
        },
    )
    hits = ImageSearchCache([tmp_path]).search("q1")
    assert [h.title for h in hits] == ["A", "B", "C"]
    assert [h.image_url for h in hits] == [f"https://x.example/{t}.jpg" for t in "ABC"]
    assert [h.path.name for h in hits] == ["img_000.jpg", "img_001.png", "img_002.webp"]
    assert all(h.image.size == (10, 6) and h.image.mode == "RGB" for h in hits)
    assert hits[1].image.getpixel((5, 3)) == (0, 128, 0)
    assert [h.title for h in ImageSearchCache([tmp_path], max_results=1).search("q1")] == ["A"]


def test_title_list_layout_html_skip_and_missing_image(tmp_path):
    folder = _entry(
        tmp_path,
        "q2",
        {"title_list": ["page", "second", "third", "fourth"], "image_urls": ["u0", "u1"]},
        {"img_001.png": "red", "img_003.jpg": "blue"},
    )
    (folder / "img_000.html").write_text("<html>a saved page, not an image</html>")
    hits = ImageSearchCache([tmp_path]).search("q2")
    assert [(h.title, h.image_url) for h in hits] == [
        ("second", "u1"),
        ("third", ""),
        ("fourth", ""),
    ]
    assert hits[0].image is not None and hits[1].image is None and hits[1].path is None
    assert hits[2].image.getpixel((0, 0))[2] > 200


def test_unreadable_image_gives_none(tmp_path):
    folder = _entry(tmp_path, "q3", _results("A"), {})
    (folder / "img_000.png").write_bytes(b"not an image")
    (hit,) = ImageSearchCache([tmp_path]).search("q3")
    assert hit.title == "A" and hit.image is None and hit.path.name == "img_000.png"


def test_several_roots_first_holding_the_id_wins(tmp_path):
    train, test = tmp_path / "train", tmp_path / "test"
    _entry(train, "shared", _results("from-train"), {"img_000.png": "red"})
    _entry(test, "shared", _results("from-test"), {"img_000.png": "red"})
    _entry(test, "only-test", _results("T"), {"img_000.png": "red"})
    cache = ImageSearchCache([train, test])
    assert cache.search("shared")[0].title == "from-train"
    assert cache.search("only-test")[0].title == "T"
    assert cache.search("absent") == []
    assert "only-test" in cache and "absent" not in cache
    assert ImageSearchCache([tmp_path / "nowhere"]).search("shared") == []


@pytest.mark.parametrize(
    ("bad_id", "message"),
    [
        ("..", "not a folder name"),
        (".", "not a folder name"),
        ("../secret", "path separator"),
        ("a/../../secret", "path separator"),
        ("/etc", "path separator"),
        ("a\\b", "path separator"),
        ("ok\x00id", "NUL byte"),
        ("", "non-empty string"),
        ("C:secret", "absolute path"),
    ],
)
def test_ids_that_could_leave_the_root_are_refused(tmp_path, bad_id, message):
    root = tmp_path / "cache"
    root.mkdir()
    _entry(tmp_path, "secret", _results("SECRET"), {"img_000.png": "red"})  # beside the root
    with pytest.raises(ImageCacheError, match=message):
        ImageSearchCache([root]).search(bad_id)
    with pytest.raises(ImageCacheError):
        validate_cache_id(bad_id)


def test_ids_with_dots_inside_are_fine(tmp_path):
    _entry(tmp_path, "fvqa_test_1.5", _results("dotted"), {"img_000.png": "red"})
    assert ImageSearchCache([tmp_path]).search("fvqa_test_1.5")[0].title == "dotted"


def test_bad_meta_json_names_the_file(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "meta.json").write_text("{not json")
    with pytest.raises(ImageCacheError, match=r"broken/meta.json: invalid JSON"):
        ImageSearchCache([tmp_path]).search("broken")
    (folder / "meta.json").write_text(json.dumps({"results": []}))
    with pytest.raises(ImageCacheError, match="neither 'search_results' nor 'title_list'"):
        ImageSearchCache([tmp_path]).search("broken")
    (folder / "meta.json").write_text(json.dumps({"search_results": ["x"]}))
    with pytest.raises(ImageCacheError, match=r"'search_results\[0\]' must be an object"):
        ImageSearchCache([tmp_path]).search("broken")
