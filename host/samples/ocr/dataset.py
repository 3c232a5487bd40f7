"""Labelled OCR data made offline: text rendered into pages and lines with known strings, boxes and orientation.

``make(out_dir, seed, n_pages, n_lines, split)`` writes, deterministically by
(seed, split, item number)::

    out_dir/<split>/pages/NNNN.png + out_dir/<split>/pages.json
        [{"file": "pages/0000.png", "boxes": [[x0, y0, x1, y1], ...], "texts": ["...", ...]}]
    out_dir/<split>/lines/NNNN.png + out_dir/<split>/lines.json
        [{"file": "lines/0000.png", "text": "...", "angle": 0 | 180}]

Item i depends only on (seed, split, i): a larger set begins with a smaller
one, and the calibration and evaluation splits never share an item. A page
is a real photo (``photos/``, public domain and CC0) or a light sheet with
photos pasted on it as pictures without text (distractors); its text lines
are dark strings on the sheet or on light plates over the photo, axis-aligned,
never overlapping; ``boxes`` are each line's ink box in pixels. A line image
is one string on a light background with a photo's texture blended in, with a
margin, rotated by 180 degrees when ``angle`` is 180 (``text`` is what it
reads upright). Strings are English words, numbers, codes, dates and prices
in Latin letters, digits and punctuation, all in the PP-OCRv4 recogniser's
character list; lines hold no double spaces (drawn, words are half a font size apart:
Pillow's narrow space makes PP-OCRv4 join words). The font is the one Pillow ships
(``ImageFont.load_default(size=...)``).
"""
import functools
import json
import os
import shutil
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from bpuemu.common.errors import InvalidInput

SPLITS = ("calibration", "evaluation")
PHOTOS = os.path.join(os.path.dirname(__file__), "photos")
PAGE_SIZES = ((480, 640), (640, 480), (600, 800), (640, 640))  # (height, width)

WORDS = (
    "open", "close", "exit", "entry", "push", "pull", "stop", "slow", "left", "right", "north", "south", "east",
    "west", "street", "road", "avenue", "station", "platform", "gate", "terminal", "floor", "room", "office",
    "hotel", "cafe", "coffee", "tea", "bread", "milk", "water", "fresh", "daily", "special", "menu", "price",
    "total", "cash", "card", "sale", "new", "free", "parking", "service", "only", "staff", "private", "public",
    "library", "museum", "garden", "market", "bank", "post", "police", "hospital", "school", "music", "table",
    "window", "door", "light", "power", "level", "safety", "first", "second", "third", "break", "lunch",
    "dinner", "breakfast", "monday", "friday", "sunday", "morning", "evening", "welcome", "thank", "you",
    "please", "keep", "clear", "danger", "caution", "warning", "notice", "board", "model", "system", "test",
    "data", "image", "camera", "sensor", "robot", "engine", "motor", "battery", "cable", "signal", "network",
    "Main", "Park", "River", "Hill", "Lake", "Bridge", "Central", "Union", "Harbor", "Valley", "Green", "Oak",
)
UPPER = "ABCDEFGHJKLMNPQRSTUVWXYZ"


@dataclass(frozen=True)
class Page:
    file: str                                   # absolute path of the PNG
    boxes: List[Tuple[int, int, int, int]]      # (x0, y0, x1, y1) of each text line, pixels
    texts: List[str]


@dataclass(frozen=True)
class Line:
    file: str                                   # absolute path of the PNG
    text: str
    angle: int                                  # 0 or 180


def _word(rng) -> str:
    w = str(rng.choice(WORDS))
    style = rng.random()
    return w.upper() if style < 0.25 else w.capitalize() if style < 0.6 else w


def line_text(rng: np.random.Generator) -> str:
    """One line's string: words, a number, a code, a date, a price or a time."""
    kind = rng.random()
    if kind < 0.5:
        return " ".join(_word(rng) for _ in range(int(rng.integers(1, 4))))
    if kind < 0.6:
        return f"{_word(rng)} {int(rng.integers(1, 1000))}"
    if kind < 0.7:
        return "".join(rng.choice(list(UPPER), 2)) + "-" + str(int(rng.integers(1000, 10000)))
    if kind < 0.8:
        return f"{int(rng.integers(2000, 2031))}-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}"
    if kind < 0.9:
        return f"${int(rng.integers(1, 500))}.{int(rng.integers(0, 100)):02d}"
    return f"{int(rng.integers(0, 24)):02d}:{int(rng.integers(0, 60)):02d} {_word(rng)}"


def _photos():
    from PIL import Image

    names = sorted(f for f in os.listdir(PHOTOS) if f.endswith(".jpg"))
    out = []
    for name in names:
        with Image.open(os.path.join(PHOTOS, name)) as img:
            out.append(img.convert("RGB"))
    return out


def _photo_crop(photos, rng, h: int, w: int):
    """A random crop of a random photo, resized to w x h, maybe mirrored."""
    from PIL import Image

    photo = photos[int(rng.integers(len(photos)))]
    pw, ph = photo.size
    frac = float(rng.uniform(0.5, 1.0))
    cw, ch = max(8, int(pw * frac)), max(8, int(ph * frac))
    x, y = int(rng.integers(0, pw - cw + 1)), int(rng.integers(0, ph - ch + 1))
    crop = photo.crop((x, y, x + cw, y + ch)).resize((w, h), Image.Resampling.BILINEAR)
    return crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop


def _sheet(rng, h: int, w: int):
    """A light sheet: a base tone with a soft gradient and a little noise."""
    from PIL import Image

    base = rng.uniform(205, 250, 3)
    ramp = np.linspace(0, float(rng.uniform(-20, 10)), w)[None, :, None]
    noise = rng.normal(0, 2.5, (h, w, 1))
    return Image.fromarray(np.clip(base + ramp + noise, 0, 255).astype(np.uint8))


def _ink(rng) -> tuple:
    v = rng.integers(0, 70, 3)
    return tuple(int(c) for c in v)


@functools.lru_cache(maxsize=None)
def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


#: The gap between words, in font sizes. Pillow's own space (about 0.25) is narrower than printed text's
#: usually is, and PP-OCRv4 then reads two words as one; the labels keep one space.
WORD_GAP = 0.5


def _layout(text: str, font):
    """((x offset, word) per word, ink box (x0, y0, x1, y1)) of a line drawn at (0, 0) with WORD_GAP spacing."""
    from PIL import Image, ImageDraw

    probe = ImageDraw.Draw(Image.new("L", (1, 1)))
    placed, x, box = [], 0, None
    for word in text.split(" "):
        x0, y0, x1, y1 = probe.textbbox((x, 0), word, font=font)
        box = (x0, y0, x1, y1) if box is None else (min(box[0], x0), min(box[1], y0), max(box[2], x1), max(box[3], y1))
        placed.append((x, word))
        x = x1 + int(round(WORD_GAP * font.size))
    return placed, box


def _draw_line(draw, origin, placed, font, fill):
    for dx, word in placed:
        draw.text((origin[0] + dx, origin[1]), word, font=font, fill=fill)


def render_page(rng: np.random.Generator, photos) -> Tuple[np.ndarray, List[List[int]], List[str]]:
    """One page: (HxWx3 uint8 RGB, boxes, texts)."""
    from PIL import ImageDraw

    h, w = PAGE_SIZES[int(rng.integers(len(PAGE_SIZES)))]
    on_photo = rng.random() < 0.5
    img = _photo_crop(photos, rng, h, w) if on_photo else _sheet(rng, h, w)
    draw = ImageDraw.Draw(img)
    taken = []  # rectangles (with margin) already used: text and pictures
    if not on_photo:
        for _ in range(int(rng.integers(1, 3))):  # pictures without text (distractors)
            ph, pw = int(rng.integers(h // 6, h // 3)), int(rng.integers(w // 6, w // 3))
            y, x = int(rng.integers(0, h - ph)), int(rng.integers(0, w - pw))
            img.paste(_photo_crop(photos, rng, ph, pw), (x, y))
            taken.append((x - 8, y - 8, x + pw + 8, y + ph + 8))
        for _ in range(int(rng.integers(0, 3))):  # rules
            y = int(rng.integers(0, h))
            draw.line((int(rng.integers(0, w // 2)), y, int(rng.integers(w // 2, w)), y),
                      fill=_ink(rng), width=int(rng.integers(1, 3)))
    boxes, texts = [], []
    for _ in range(int(rng.integers(3, 9))):
        text, size = line_text(rng), int(rng.integers(18, 42))
        font = _font(size)
        placed, (x0, y0, x1, y1) = _layout(text, font)
        tw, th = x1 - x0, y1 - y0
        if tw + 16 >= w:
            continue
        for _attempt in range(20):
            x, y = int(rng.integers(8, w - tw - 8)), int(rng.integers(8, h - th - 8))
            box = (x, y, x + tw, y + th)
            pad = max(6, size // 3)
            zone = (box[0] - pad, box[1] - pad, box[2] + pad, box[3] + pad)
            if all(zone[2] <= t[0] or zone[0] >= t[2] or zone[3] <= t[1] or zone[1] >= t[3] for t in taken):
                break
        else:
            continue
        if on_photo:
            plate = tuple(int(c) for c in rng.integers(215, 256, 3))
            draw.rectangle((zone[0] + pad // 2, zone[1] + pad // 2, zone[2] - pad // 2, zone[3] - pad // 2), fill=plate)
        _draw_line(draw, (x - x0, y - y0), placed, font, _ink(rng))
        taken.append(zone)
        boxes.append(list(box))
        texts.append(text)
    return np.asarray(img), boxes, texts


def render_line(rng: np.random.Generator, photos) -> Tuple[np.ndarray, str, int]:
    """One line image: (HxWx3 uint8 RGB, text, angle)."""
    from PIL import Image, ImageDraw

    text, size = line_text(rng), int(rng.integers(26, 44))
    font = _font(size)
    placed, (x0, y0, x1, y1) = _layout(text, font)
    mx, my = int(rng.integers(4, 16)), int(rng.integers(3, 12))
    w, h = x1 - x0 + 2 * mx, y1 - y0 + 2 * my
    img = _sheet(rng, h, w)
    if rng.random() < 0.6:  # a photo's texture under the text
        img = Image.blend(img, _photo_crop(photos, rng, h, w), float(rng.uniform(0.15, 0.4)))
    _draw_line(ImageDraw.Draw(img), (mx - x0, my - y0), placed, font, _ink(rng))
    angle = 180 if rng.random() < 0.5 else 0
    if angle:
        img = img.transpose(Image.Transpose.ROTATE_180)
    return np.asarray(img), text, angle


def _rng(seed: int, split: str, kind: int, i: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), SPLITS.index(split), kind, i])


def make(out_dir: str, seed: int = 0, n_pages: int = 100, n_lines: int = 100, split: str = "calibration") -> str:
    """Write ``n_pages`` pages and ``n_lines`` lines of ``split`` under ``out_dir/<split>``; returns that folder."""
    from PIL import Image

    if split not in SPLITS:
        raise InvalidInput(f"split '{split}' is not one of {', '.join(SPLITS)}")
    if n_pages < 0 or n_lines < 0:
        raise InvalidInput(f"n_pages {n_pages} and n_lines {n_lines} must not be negative")
    photos = _photos()
    split_dir = os.path.join(out_dir, split)
    for kind, name, count in ((0, "pages", n_pages), (1, "lines", n_lines)):
        folder = os.path.join(split_dir, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        entries = []
        for i in range(count):
            file = f"{name}/{i:04d}.png"
            if kind == 0:
                img, boxes, texts = render_page(_rng(seed, split, kind, i), photos)
                entries.append({"file": file, "boxes": boxes, "texts": texts})
            else:
                img, text, angle = render_line(_rng(seed, split, kind, i), photos)
                entries.append({"file": file, "text": text, "angle": angle})
            Image.fromarray(img).save(os.path.join(split_dir, file), compress_level=1)  # fast; noise compresses badly
        with open(os.path.join(split_dir, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(entries, f, indent=1, ensure_ascii=False)
    return split_dir


def _load(split_dir: str, name: str) -> list:
    path = os.path.join(split_dir, f"{name}.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist", hint="make the data first (dataset.make, 02_preprocess.sh)") from None
    except ValueError as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc}") from None


def load_pages(split_dir: str) -> List[Page]:
    return [Page(os.path.abspath(os.path.join(split_dir, e["file"])), [tuple(b) for b in e["boxes"]], list(e["texts"]))
            for e in _load(split_dir, "pages")]


def load_lines(split_dir: str) -> List[Line]:
    return [Line(os.path.abspath(os.path.join(split_dir, e["file"])), e["text"], int(e["angle"]))
            for e in _load(split_dir, "lines")]


__all__ = ["Line", "Page", "SPLITS", "line_text", "load_lines", "load_pages", "make"]
