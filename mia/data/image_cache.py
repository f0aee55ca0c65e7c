"""Image-to-image search over precomputed result caches (the reference's image-search tool).

The reference never searches images live: for each question id it reads
``<cache>/<data_id>/meta.json`` — ``{"search_results": [{"title", "image_url"}, ...]}`` or the
older ``{"title_list": [...], "image_urls": [...]}`` — and the result images
``img_000.{jpg,png,webp,gif}``, ``img_001.*``, ... beside it. Results whose ``img_XXX.html`` file
exists (a web page saved instead of an image) are skipped, as in the reference's training tool.

Several cache roots may be given (e.g. a train and a test cache); the first root holding the id
wins. Ids are folder names, so anything that could leave the root (``..``, separators, absolute
paths, NUL) is refused with :class:`ImageCacheError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from mia.errors import MiaError

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp", "gif")


class ImageCacheError(MiaError, ValueError):
    """A bad cache id or an unreadable ``meta.json``."""


@dataclass
class ImageHit:
    """One image-search result. ``image`` is None when the cached file is missing or unreadable."""

    title: str
    image: Image.Image | None
    image_url: str = ""
    path: Path | None = None  # the image file, when there is one


def validate_cache_id(data_id: str) -> str:
    """Return ``data_id`` if it is a safe single folder name, else raise :class:`ImageCacheError`."""
    if not isinstance(data_id, str) or not data_id:
        raise ImageCacheError("image cache id must be a non-empty string")
    if "\x00" in data_id:
        raise ImageCacheError(f"image cache id {data_id!r} contains a NUL byte")
    if "/" in data_id or "\\" in data_id:
        raise ImageCacheError(f"image cache id {data_id!r} contains a path separator")
    if data_id in (".", ".."):
        raise ImageCacheError(f"image cache id {data_id!r} is not a folder name ('.' or '..')")
    if Path(data_id).is_absolute() or (len(data_id) > 1 and data_id[1] == ":"):
        raise ImageCacheError(f"image cache id {data_id!r} is an absolute path")
    return data_id


def _results(meta: Any, meta_path: Path) -> list[tuple[str, str]]:
    """``(title, image_url)`` pairs from either meta.json layout."""
    if not isinstance(meta, dict):
        raise ImageCacheError(f"{meta_path}: expected a JSON object")
    if "search_results" in meta:
        results = meta["search_results"]
        if not isinstance(results, list):
            raise ImageCacheError(f"{meta_path}: 'search_results' must be a list")
        out = []
        for k, r in enumerate(results):
            if not isinstance(r, dict):
                raise ImageCacheError(f"{meta_path}: 'search_results[{k}]' must be an object")
            out.append((str(r.get("title") or ""), str(r.get("image_url") or r.get("url") or "")))
        return out
    if "title_list" in meta:
        titles = meta["title_list"]
        urls = meta.get("image_urls") or []
        if not isinstance(titles, list) or not isinstance(urls, list):
            raise ImageCacheError(f"{meta_path}: 'title_list' and 'image_urls' must be lists")
        urls = urls + [""] * (len(titles) - len(urls))
        return [(str(t or ""), str(u or "")) for t, u in zip(titles, urls, strict=False)]
    raise ImageCacheError(f"{meta_path}: neither 'search_results' nor 'title_list' present")


def _load_image(path: Path) -> Image.Image | None:
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError):
        return None


class ImageSearchCache:
    """Reads image-search results for a question id from one or more cache roots."""

    def __init__(self, roots: Iterable[str | Path], max_results: int = 3) -> None:
        self.roots = [Path(r) for r in roots]
        if max_results < 1:
            raise ValueError("max_results must be >= 1")
        self.max_results = max_results

    def folder(self, data_id: str) -> Path | None:
        """The cache folder of ``data_id`` (first root that has a meta.json), or None."""
        validate_cache_id(data_id)
        for root in self.roots:
            candidate = root / data_id
            if (candidate / "meta.json").is_file():
                return candidate
        return None

    def __contains__(self, data_id: str) -> bool:
        return self.folder(data_id) is not None

    def search(self, data_id: str) -> list[ImageHit]:
        """Up to ``max_results`` hits for ``data_id``; ``[]`` when no root has the id."""
        folder = self.folder(data_id)
        if folder is None:
            return []
        meta_path = folder / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ImageCacheError(f"{meta_path}: invalid JSON ({err})") from None
        hits: list[ImageHit] = []
        for k, (title, url) in enumerate(_results(meta, meta_path)):
            if len(hits) >= self.max_results:
                break
            stem = f"img_{k:03d}"
            if (folder / f"{stem}.html").exists():
                continue
            path = next(
                (
                    folder / f"{stem}.{ext}"
                    for ext in IMAGE_EXTENSIONS
                    if (folder / f"{stem}.{ext}").is_file()
                ),
                None,
            )
            hits.append(ImageHit(title, _load_image(path) if path else None, url, path))
        return hits


__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageCacheError",
    "ImageHit",
    "ImageSearchCache",
    "validate_cache_id",
]
