"""Emblems, flags and coats of arms: geometric pictures drawn with PIL, one per entity.

Each picture is a small record (colours, a shape, an accent) that renders deterministically and
describes itself in a caption that never names its owner. Records are unique per kind, so the
picture identifies the entity; distractors in the image-search cache share one attribute.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (200, 32, 44),
    "blue": (28, 62, 170),
    "green": (24, 128, 64),
    "gold": (232, 182, 32),
    "white": (246, 246, 246),
    "black": (22, 22, 22),
    "purple": (112, 42, 142),
    "orange": (236, 122, 24),
    "sky-blue": (104, 182, 232),
    "maroon": (122, 22, 44),
}
COLOURS = list(PALETTE)
SHAPES = ["circle", "ring", "square", "triangle", "star", "diamond", "cross", "crescent", "hexagon"]
ACCENTS = ["none", "border", "horizontal band", "vertical band", "diagonal stripe"]
KINDS = ("emblem", "flag", "shield")
_SHIELD_BACKDROP = (214, 214, 214)


@dataclass(frozen=True)
class Emblem:
    """A picture description: everything needed to render it and to caption it."""

    kind: str  # emblem (organisations) | flag (countries) | shield (cities)
    field: str  # background colour; for flags the first stripe
    shape: str
    shape_colour: str
    accent: str = "none"
    accent_colour: str = ""
    stripes: tuple[str, ...] = ()  # flags only
    orientation: str = "horizontal"  # flags only

    def caption(self) -> str:
        """One sentence describing the picture, without naming whose it is."""
        article = "an" if self.shape_colour[0] in "aeiou" else "a"
        charge = f"{article} {self.shape_colour} {self.shape}"
        if self.kind == "flag":
            words = {2: "two", 3: "three"}[len(self.stripes)]
            colours = ", ".join(self.stripes[:-1]) + " and " + self.stripes[-1]
            return (
                f"A flag with {words} {self.orientation} stripes of {colours}, "
                f"with {charge} in the centre."
            )
        accent = self._accent_phrase()
        if self.kind == "shield":
            return f"A {self.field} shield-shaped coat of arms bearing {charge}{accent}."
        return f"An emblem showing {charge} on a {self.field} field{accent}."

    def _accent_phrase(self) -> str:
        if self.accent == "none":
            return ""
        article = "an" if self.accent_colour[0] in "aeiou" else "a"
        if self.accent == "border":
            return f", with {article} {self.accent_colour} border"
        return f", crossed by {article} {self.accent_colour} {self.accent}"

    def render(self, size: int = 256) -> Image.Image:
        """Draw the picture (RGB). Same record and size -> identical pixels."""
        if self.kind == "flag":
            return self._render_flag(size)
        img = Image.new("RGB", (size, size), _SHIELD_BACKDROP if self.kind == "shield" else None)
        draw = ImageDraw.Draw(img)
        if self.kind == "shield":
            outline = _shield_polygon(size)
            draw.polygon(outline, fill=PALETTE[self.field])
        else:
            draw.rectangle([0, 0, size, size], fill=PALETTE[self.field])
        self._draw_accent(draw, size)
        if self.kind == "shield":
            # Re-cut the shield edge so accents stay inside the shield.
            mask = Image.new("L", (size, size), 0)
            ImageDraw.Draw(mask).polygon(_shield_polygon(size), fill=255)
            backdrop = Image.new("RGB", (size, size), _SHIELD_BACKDROP)
            img = Image.composite(img, backdrop, mask)
            draw = ImageDraw.Draw(img)
        _draw_shape(draw, self.shape, PALETTE[self.shape_colour], PALETTE[self.field], size)
        return img

    def _draw_accent(self, draw: ImageDraw.ImageDraw, size: int) -> None:
        if self.accent == "none":
            return
        colour = PALETTE[self.accent_colour]
        s = size
        if self.accent == "border":
            width = max(2, s // 14)
            if self.kind == "shield":
                draw.line(_shield_polygon(s) + [_shield_polygon(s)[0]], fill=colour, width=width)
            else:
                draw.rectangle([0, 0, s - 1, s - 1], outline=colour, width=width)
        elif self.accent == "horizontal band":
            top = 0.62 if self.kind == "shield" else 0.78  # keep clear of the shield's tip
            draw.rectangle([0, int(s * top), s, int(s * (top + 0.12))], fill=colour)
        elif self.accent == "vertical band":
            left = 0.18 if self.kind == "shield" else 0.08  # inside the shield's edge
            draw.rectangle([int(s * left), 0, int(s * (left + 0.12)), s], fill=colour)
        elif self.accent == "diagonal stripe":
            w = s * 0.09
            draw.polygon([(0, s - w), (s - w, 0), (s, 0), (s, w), (w, s), (0, s)], fill=colour)

    def _render_flag(self, size: int) -> Image.Image:
        width, height = size, size * 2 // 3
        img = Image.new("RGB", (width, height))
        draw = ImageDraw.Draw(img)
        n = len(self.stripes)
        for i, colour in enumerate(self.stripes):
            if self.orientation == "horizontal":
                box = [0, height * i // n, width, height * (i + 1) // n]
            else:
                box = [width * i // n, 0, width * (i + 1) // n, height]
            draw.rectangle(box, fill=PALETTE[colour])
        middle = self.stripes[n // 2]
        _draw_shape(
            draw,
            self.shape,
            PALETTE[self.shape_colour],
            PALETTE[middle],
            height,
            x0=(width - height) // 2,
        )
        return img

    def png(self, size: int = 256) -> bytes:
        """PNG bytes of :meth:`render` (deterministic for a given Pillow/zlib build)."""
        buf = io.BytesIO()
        self.render(size).save(buf, format="PNG", optimize=False, compress_level=6)
        return buf.getvalue()

    def shared_attributes(self, other: Emblem) -> int:
        """How many visible attributes two pictures share (distractor similarity)."""
        same = [
            self.field == other.field,
            self.shape == other.shape,
            self.shape_colour == other.shape_colour,
            self.accent == other.accent and self.accent != "none",
            bool(self.stripes) and self.stripes == other.stripes,
        ]
        return sum(same)


def _shield_polygon(s: int) -> list[tuple[float, float]]:
    top, side, tip = s * 0.08, s * 0.12, s * 0.94
    pts = [(side, top), (s - side, top), (s - side, s * 0.55)]
    # Rounded lower half of a heater shield, approximated by an arc of points.
    for k in range(1, 8):
        t = k / 8
        pts.append(
            (s - side - (s / 2 - side) * t, s * 0.55 + (tip - s * 0.55) * math.sin(t * math.pi / 2))
        )
    pts.append((s / 2, tip))
    for k in range(7, 0, -1):
        t = k / 8
        pts.append(
            (side + (s / 2 - side) * t, s * 0.55 + (tip - s * 0.55) * math.sin(t * math.pi / 2))
        )
    pts.append((side, s * 0.55))
    return pts


def _regular(cx: float, cy: float, r: float, n: int, phase: float) -> list[tuple[float, float]]:
    return [
        (
            cx + r * math.cos(phase + 2 * math.pi * k / n),
            cy + r * math.sin(phase + 2 * math.pi * k / n),
        )
        for k in range(n)
    ]


def _draw_shape(
    draw: ImageDraw.ImageDraw,
    shape: str,
    colour: tuple[int, int, int],
    ground: tuple[int, int, int],
    size: int,
    x0: int = 0,
) -> None:
    cx, cy, r = x0 + size / 2, size / 2, size * 0.26
    box = [cx - r, cy - r, cx + r, cy + r]
    if shape == "circle":
        draw.ellipse(box, fill=colour)
    elif shape == "ring":
        draw.ellipse(box, outline=colour, width=max(3, int(r / 3.5)))
    elif shape == "square":
        q = r * 0.85
        draw.rectangle([cx - q, cy - q, cx + q, cy + q], fill=colour)
    elif shape == "triangle":
        draw.polygon(_regular(cx, cy + r * 0.15, r * 1.1, 3, -math.pi / 2), fill=colour)
    elif shape == "diamond":
        draw.polygon(_regular(cx, cy, r * 1.1, 4, -math.pi / 2), fill=colour)
    elif shape == "hexagon":
        draw.polygon(_regular(cx, cy, r, 6, 0), fill=colour)
    elif shape == "star":
        outer = _regular(cx, cy, r * 1.1, 5, -math.pi / 2)
        inner = _regular(cx, cy, r * 0.45, 5, -math.pi / 2 + math.pi / 5)
        draw.polygon([p for pair in zip(outer, inner, strict=True) for p in pair], fill=colour)
    elif shape == "cross":
        w = r * 0.32
        draw.rectangle([cx - w, cy - r, cx + w, cy + r], fill=colour)
        draw.rectangle([cx - r, cy - w, cx + r, cy + w], fill=colour)
    elif shape == "crescent":
        draw.ellipse(box, fill=colour)
        off = r * 0.45
        draw.ellipse(
            [cx - r + off, cy - r - off * 0.3, cx + r + off, cy + r - off * 0.3], fill=ground
        )
    else:  # pragma: no cover - SHAPES is closed
        raise ValueError(f"unknown shape {shape!r}")


class EmblemBook:
    """Draws unique emblem records per kind from one seeded stream."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[Emblem] = set()

    def new(self, kind: str) -> Emblem:
        rng = self.rng
        for _ in range(10_000):
            if kind == "flag":
                stripes = tuple(rng.sample(COLOURS, rng.choice([2, 3])))
                mid = stripes[len(stripes) // 2]
                emblem = Emblem(
                    kind="flag",
                    field=stripes[0],
                    shape=rng.choice(SHAPES),
                    shape_colour=rng.choice([c for c in COLOURS if c != mid]),
                    stripes=stripes,
                    orientation=rng.choice(["horizontal", "vertical"]),
                )
            else:
                field, shape_colour, accent_colour = rng.sample(COLOURS, 3)
                accent = rng.choice(ACCENTS)
                emblem = Emblem(
                    kind=kind,
                    field=field,
                    shape=rng.choice(SHAPES),
                    shape_colour=shape_colour,
                    accent=accent,
                    accent_colour="" if accent == "none" else accent_colour,
                )
            if emblem not in self.used:
                self.used.add(emblem)
                return emblem
        raise RuntimeError(f"ran out of distinct {kind} designs")  # pragma: no cover
