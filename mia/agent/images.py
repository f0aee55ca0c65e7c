"""Images in Executor conversations: loading, resizing, data URLs, content parts.

Question images arrive as bytes, base64 strings, data URLs, paths or PIL images (anything
:func:`mia.vision.load_image` opens). They are resized like the reference's training
pipeline (a fixed square, 448 by default) so training, serving and evaluation feed the model the
same pixels, and stored in messages as OpenAI ``image_url`` parts holding PNG data URLs, which any
OpenAI-compatible server (vLLM) accepts and which survive a JSON round trip through the service.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

from PIL import Image

from mia.llm.base import Message
from mia.prompts.executor import IMAGE_TOKEN
from mia.trace import content_parts
from mia.vision import ImageError, ImageSource, load_image

IMAGE_FORMATS = ("PNG", "JPEG")


def prepare_image(src: ImageSource, size: int | None = 448) -> Image.Image:
    """Open ``src`` as RGB and resize it to ``size`` x ``size`` (None keeps its size)."""
    img = load_image(src)
    if size is not None and img.size != (size, size):
        if size < 1:
            raise ImageError(f"image size must be >= 1, got {size}")
        img = img.resize((size, size), resample=Image.Resampling.BICUBIC)
    return img


def to_data_url(img: Image.Image, fmt: str = "PNG") -> str:
    """A ``data:image/...;base64,`` URL of ``img`` (PNG is lossless and deterministic)."""
    fmt = fmt.upper()
    if fmt not in IMAGE_FORMATS:
        raise ImageError(f"image format must be one of {IMAGE_FORMATS}, got {fmt!r}")
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    mime = "png" if fmt == "PNG" else "jpeg"
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def image_part(img: Image.Image, fmt: str = "PNG") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": to_data_url(img, fmt)}}


def content_with_images(
    text: str, images: Sequence[Image.Image], fmt: str = "PNG"
) -> str | list[dict[str, Any]]:
    """Message content for ``text`` whose ``<image>`` placeholders stand for ``images``: the text
    itself when there are none, else text and image parts in order."""
    pieces = text.split(IMAGE_TOKEN) if images else [text]
    if len(pieces) - 1 != len(images):
        raise ImageError(
            f"{len(pieces) - 1} {IMAGE_TOKEN} placeholder(s) for {len(images)} image(s)"
        )
    if not images:
        return text
    parts: list[dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        if piece:
            parts.append({"type": "text", "text": piece})
        if i < len(images):
            parts.append(image_part(images[i], fmt))
    return parts


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and (
        part.get("type") in ("image", "image_url", "input_image") or "image_url" in part
    )


def part_url(part: dict[str, Any]) -> str | None:
    """The URL/data of an image part, or None for a bare placeholder ``{"type": "image"}``."""
    ref = part.get("image_url")
    if isinstance(ref, dict):
        ref = ref.get("url")
    if ref is None:
        ref = part.get("image")
    return ref if isinstance(ref, str) and ref else None


def message_images(messages: Sequence[Message]) -> list[Image.Image]:
    """The images of a conversation in order (parts with data URLs or base64; placeholders
    without data raise)."""
    out = []
    for part in content_parts(messages):
        if is_image_part(part):
            url = part_url(part)
            if url is None:
                raise ImageError("an image part has no data (fill it from 'images' first)")
            out.append(load_image(url))
    return out


def fill_image_placeholders(
    messages: Sequence[Message], images: Sequence[Image.Image], fmt: str = "PNG"
) -> tuple[list[Message], int]:
    """Copies of ``messages`` where bare image placeholders take ``images`` in order; returns the
    messages and how many placeholders were filled. More placeholders than images raise."""
    out: list[Message] = []
    used = 0
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(dict(m))
            continue
        parts = []
        for part in content:
            if is_image_part(part) and part_url(part) is None:
                if used >= len(images):
                    raise ImageError(
                        f"the messages hold more image placeholders than the {len(images)} "
                        "image(s) given"
                    )
                parts.append(image_part(images[used], fmt))
                used += 1
            else:
                parts.append(part)
        out.append({**m, "content": parts})
    return out, used
