"""A minimal stand-in for the OCR sample's labelled data (OCR_CONTRACT.md's dataset.make format).

Dark text on a light page, rendered with Pillow's own font: pages with known
line boxes and strings, and single lines at 0 or 180 degrees.
"""
import json
import os

import numpy as np
from PIL import Image, ImageDraw, ImageFont

WORDS = ["bpuemu", "board", "HELLO", "12345", "quant", "model", "Horizon", "text", "OCR", "farm", "2026"]


def _line_text(rng) -> str:
    return " ".join(str(rng.choice(WORDS)) for _ in range(int(rng.integers(1, 3))))


def make(out_dir: str, seed: int, n_pages: int, n_lines: int, split: str = "evaluation", size: int = 320) -> str:
    rng = np.random.default_rng(seed)
    font = ImageFont.load_default(size=26)
    d = os.path.join(out_dir, split)
    os.makedirs(os.path.join(d, "pages"), exist_ok=True)
    os.makedirs(os.path.join(d, "lines"), exist_ok=True)
    pages, lines = [], []
    for i in range(n_pages):
        img = Image.new("RGB", (size, size), (235, 235, 230))
        draw = ImageDraw.Draw(img)
        boxes, texts = [], []
        for k in range(3):
            text = _line_text(rng)
            x, y = int(rng.integers(10, 60)), 20 + k * 100 + int(rng.integers(0, 30))
            draw.text((x, y), text, font=font, fill=(20, 20, 20))
            x0, y0, x1, y1 = draw.textbbox((x, y), text, font=font)
            boxes.append([x0, y0, x1, y1])
            texts.append(text)
        name = f"pages/{i:04d}.png"
        img.save(os.path.join(d, name))
        pages.append({"file": name, "boxes": boxes, "texts": texts})
    for i in range(n_lines):
        text = _line_text(rng)
        probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        x0, y0, x1, y1 = probe.textbbox((0, 0), text, font=font)
        img = Image.new("RGB", (x1 - x0 + 16, y1 - y0 + 12), (235, 235, 230))
        ImageDraw.Draw(img).text((8 - x0, 6 - y0), text, font=font, fill=(20, 20, 20))
        angle = int(rng.choice([0, 180]))
        if angle:
            img = img.rotate(180)
        name = f"lines/{i:04d}.png"
        img.save(os.path.join(d, name))
        lines.append({"file": name, "text": text, "angle": angle})
    with open(os.path.join(d, "pages.json"), "w") as f:
        json.dump(pages, f)
    with open(os.path.join(d, "lines.json"), "w") as f:
        json.dump(lines, f)
    return d
