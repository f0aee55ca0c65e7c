"""Qwen2-VL / Qwen2.5-VL image preprocessing with PIL and numpy only.

torchvision cannot be imported next to the CPU torch here, which rules out transformers'
default (torchvision) Qwen2-VL image processor, ``AutoProcessor`` and qwen-vl-utils. This module
reproduces the processor's numerics (smart resize on a 28-pixel grid, bicubic PIL resize,
rescale, CLIP normalisation, patch layout) so the model sees exactly what the reference
pipeline would feed it, and expands ``<|image_pad|>`` placeholders to one token per merged patch.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from mia.errors import MiaError

if TYPE_CHECKING:
    import torch

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PATCH_SIZE = 14
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
IMAGE_PAD = "<|image_pad|>"

_DATA_URL = re.compile(
    r"^data:(?P<mime>[\w/+.-]*)(?P<params>(;[\w=.-]+)*?);base64,(?P<data>.*)$", re.S
)


class ImageError(MiaError, ValueError):
    """An image that cannot be loaded or processed (bad bytes, missing file, absurd shape)."""


ImageSource = bytes | bytearray | memoryview | str | Path | Image.Image | dict


def load_image(src: ImageSource) -> Image.Image:
    """Open an image from bytes, a base64 string or data URL, a file path, a PIL image, or a
    ``datasets`` image dict (``{"bytes": ..., "path": ...}``). Returns it decoded, in RGB.

    Transparent images are composited on white, as Qwen's own loader does.
    """
    if isinstance(src, Image.Image):
        return _to_rgb(src)
    if isinstance(src, dict):
        if src.get("bytes"):
            return load_image(bytes(src["bytes"]))
        if src.get("path"):
            return load_image(Path(src["path"]))
        raise ImageError("image dict needs a non-empty 'bytes' or 'path' entry")
    if isinstance(src, bytes | bytearray | memoryview):
        return _decode(bytes(src), "image bytes")
    if isinstance(src, Path):
        return _open_file(src)
    if isinstance(src, str):
        return _load_str(src)
    raise ImageError(f"cannot load an image from a {type(src).__name__}")


def is_data_url(text: str) -> bool:
    """True iff ``text`` is a base64 ``data:`` URL (what :func:`load_image` decodes without
    touching the filesystem)."""
    return bool(_DATA_URL.match(text.strip()))


def _load_str(src: str) -> Image.Image:
    text = src.strip()
    if match := _DATA_URL.match(text):
        return _decode(_b64(match["data"], "data URL"), "data URL")
    if text.startswith(("http://", "https://")):
        raise ImageError(f"image URLs are not fetched here, download it first: {text[:80]}")
    if text.startswith("file://"):
        return _open_file(Path(text[len("file://") :]))
    path = Path(text) if len(text) < 4096 else None
    try:
        if path is not None and path.is_file():
            return _open_file(path)
    except (OSError, ValueError):  # names too long or with NUL bytes: not a path
        pass
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        if path is not None and (path.suffix or "/" in text or "\\" in text):
            raise ImageError(f"image file not found: {text}") from None
        raise ImageError(
            f"image string is not a file path, a data URL or base64: {text[:60]!r}"
        ) from None
    return _decode(data, "base64 string")


def _b64(data: str, what: str) -> bytes:
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"{what} is not valid base64") from None


def _open_file(path: Path) -> Image.Image:
    if not path.is_file():
        raise ImageError(f"image file not found: {path}")
    return _decode(path.read_bytes(), str(path))


def data_url_bytes(text: str) -> bytes:
    """The bytes a base64 ``data:`` URL holds; ImageError when ``text`` is not one."""
    match = _DATA_URL.match(text.strip())
    if match is None:
        raise ImageError("not a base64 data URL")
    return _b64(match["data"], "data URL")


def image_size(data: bytes, what: str = "image bytes") -> tuple[int, int]:
    """``(width, height)`` that the header of encoded image ``data`` declares, read without
    decoding the pixels. ImageError for bytes that are not an image and for a size over the
    per-image limit (PIL's ``MAX_IMAGE_PIXELS``); ``what`` names the image in the message."""
    with _open(data, what) as img:
        return img.size


def decode_image(data: bytes, what: str = "image bytes") -> Image.Image:
    """Encoded image ``data`` decoded, in RGB, after the checks of :func:`image_size`."""
    return _decode(data, what)


def _open(data: bytes, what: str) -> Image.Image:
    """The image with only its header read, its declared size within the per-image limit."""
    try:
        img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as err:  # declared far over PIL's own limit
        raise ImageError(f"{what} is too large to decode: {err}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"cannot decode {what} as an image ({len(data)} bytes): {err}") from None
    _check_pixels(img.width, img.height, what)
    return img


def _decode(data: bytes, what: str) -> Image.Image:
    img = _open(data, what)
    try:
        img.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageError(f"cannot decode {what} as an image ({len(data)} bytes): {err}") from None
    return _to_rgb(img)


def _check_pixels(width: int, height: int, what: str) -> None:
    """Refuse an image whose header declares more pixels than PIL's bomb limit before decoding
    it: a few KB of PNG can declare gigabytes of pixels (PIL only warns up to twice its limit)."""
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise ImageError(
            f"{what} declares {width}x{height} pixels, over the limit of {limit} pixels"
        )


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGB", rgba.size, (255, 255, 255))
        white.paste(rgba, mask=rgba.split()[3])
        return white
    return img.convert("RGB")


def smart_resize(
    height: int,
    width: int,
    factor: int = PATCH_SIZE * MERGE_SIZE,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> tuple[int, int]:
    """Qwen2-VL's target size: both sides multiples of ``factor``, area within
    [``min_pixels``, ``max_pixels``], aspect ratio kept as closely as possible."""
    if height <= 0 or width <= 0:
        raise ImageError(f"image has an empty side: {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise ImageError(
            f"image aspect ratio must be below 200, got {max(height, width) / min(height, width):.0f}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _patchify(
    chw: np.ndarray, patch_size: int, temporal_patch_size: int, merge_size: int
) -> tuple[np.ndarray, int, int]:
    """(C, H, W) -> (grid_h * grid_w, C * T * P * P) in the vision tower's order: merge windows
    of ``merge_size`` x ``merge_size`` patches are contiguous, the frame repeated T times."""
    channels, height, width = chw.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    patches = chw.reshape(
        channels,
        grid_h // merge_size,
        merge_size,
        patch_size,
        grid_w // merge_size,
        merge_size,
        patch_size,
    )
    patches = patches.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh, gw, mh, mw, C, ph, pw)
    patches = np.broadcast_to(
        patches[:, :, :, :, :, None], (*patches.shape[:5], temporal_patch_size, *patches.shape[5:])
    )
    flat = patches.reshape(grid_h * grid_w, channels * temporal_patch_size * patch_size**2)
    return flat, grid_h, grid_w


def preprocess_images(
    images: Sequence[ImageSource] | ImageSource,
    patch_size: int = PATCH_SIZE,
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> dict[str, torch.Tensor]:
    """Images -> ``{"pixel_values": float32[num_patches, 3*T*P*P], "image_grid_thw": int64[n, 3]}``,
    numerically the same as transformers' Qwen2-VL image processor (PIL backend)."""
    import torch

    if isinstance(images, str | bytes | bytearray | memoryview | Path | Image.Image | dict):
        images = [images]
    if not images:
        raise ImageError("no images to preprocess")
    mean = np.asarray(CLIP_MEAN, dtype=np.float32)[:, None, None]
    std = np.asarray(CLIP_STD, dtype=np.float32)[:, None, None]
    all_patches, grids = [], []
    for src in images:
        img = load_image(src)
        height, width = smart_resize(
            img.height, img.width, patch_size * merge_size, min_pixels, max_pixels
        )
        if (img.height, img.width) != (height, width):
            img = img.resize((width, height), resample=Image.Resampling.BICUBIC)
        # Same arithmetic as transformers: rescale in float64, cast, then normalise in float32.
        chw = (np.asarray(img, dtype=np.float64) * (1 / 255)).astype(np.float32).transpose(2, 0, 1)
        chw = (chw - mean) / std
        patches, grid_h, grid_w = _patchify(chw, patch_size, temporal_patch_size, merge_size)
        all_patches.append(patches)
        grids.append([1, grid_h, grid_w])
    return {
        "pixel_values": torch.from_numpy(np.ascontiguousarray(np.concatenate(all_patches))),
        "image_grid_thw": torch.tensor(grids, dtype=torch.int64),
    }


def num_image_tokens(grid_thw: Sequence[int], merge_size: int = MERGE_SIZE) -> int:
    """How many ``<|image_pad|>`` tokens one image with this (t, h, w) grid occupies."""
    t, h, w = (int(x) for x in grid_thw)
    return t * h * w // (merge_size * merge_size)


def expand_image_pads(
    input_ids_or_text: Any,
    image_grid_thw: Any,
    merge_size: int = MERGE_SIZE,
    image_token: str = IMAGE_PAD,
    image_token_id: int | None = None,
) -> Any:
    """Repeat the i-th image placeholder once per merged patch of the i-th image.

    Accepts text (``image_token`` is expanded) or token ids as a list or a 1-D tensor
    (``image_token_id`` is expanded; required then); returns the same kind it was given. The
    number of placeholders must equal the number of images.
    """
    counts = [num_image_tokens(g, merge_size) for g in _as_rows(image_grid_thw)]
    if isinstance(input_ids_or_text, str):
        pieces = input_ids_or_text.split(image_token)
        _check_count(len(pieces) - 1, len(counts))
        out = [pieces[0]]
        for n, piece in zip(counts, pieces[1:], strict=True):
            out += [image_token * n, piece]
        return "".join(out)
    if image_token_id is None:
        raise ImageError("expanding token ids needs image_token_id")
    is_tensor = hasattr(input_ids_or_text, "tolist")
    ids = input_ids_or_text.tolist() if is_tensor else list(input_ids_or_text)
    if ids and isinstance(ids[0], list):
        raise ImageError("expand_image_pads takes one sequence, not a batch")
    positions = [i for i, tok in enumerate(ids) if tok == image_token_id]
    _check_count(len(positions), len(counts))
    expanded: list[int] = []
    start = 0
    for pos, n in zip(positions, counts, strict=True):
        expanded += ids[start:pos] + [image_token_id] * n
        start = pos + 1
    expanded += ids[start:]
    if is_tensor:
        import torch

        return torch.tensor(expanded, dtype=input_ids_or_text.dtype)
    return expanded


def _as_rows(grid: Any) -> list[list[int]]:
    rows = grid.tolist() if hasattr(grid, "tolist") else list(grid)
    if rows and not isinstance(rows[0], list | tuple):
        rows = [rows]
    return [list(r) for r in rows]


def _check_count(placeholders: int, images: int) -> None:
    if placeholders != images:
        raise ImageError(f"found {placeholders} image placeholder(s) for {images} image(s)")


def image_processor_config(
    patch_size: int = PATCH_SIZE,
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE,
    merge_size: int = MERGE_SIZE,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> dict[str, Any]:
    """The ``preprocessor_config.json`` a Qwen2.5-VL checkpoint ships (vLLM reads it)."""
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": list(CLIP_MEAN),
        "image_std": list(CLIP_STD),
        "resample": int(Image.Resampling.BICUBIC),
        "min_pixels": min_pixels,
        "max_pixels": max_pixels,
        "size": {"shortest_edge": min_pixels, "longest_edge": max_pixels},
        "patch_size": patch_size,
        "temporal_patch_size": temporal_patch_size,
        "merge_size": merge_size,
    }
