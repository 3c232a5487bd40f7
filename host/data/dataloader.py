"""The seed's data loaders (``horizon_tc_ui.data.dataloader``): images read as the toolchain reads them,
through a list of transformers (``bpuemu.host.data.transformer``), in batches.

``imread_mode`` is the toolchain's: ``'opencv'`` gives HxWx3 uint8 BGR (0..255),
``'skimage'`` HxWx3 float64 RGB (0..1, ``skimage.img_as_float``). Pillow decodes
the file either way (OpenCV and scikit-image are not needed), so a PNG reads the
same pixels in both modes, as it does with the libraries themselves.

* ``SingleImageDataLoader(transformers, image_file, imread_mode)`` -> the
  transformed image as a batch of one (``N x ...``);
* ``ImageNetDataLoader(transformers, image_path, label_path, imread_mode,
  batch_size, return_img_name)`` -> a generator over the images a label file
  lists (``name label`` per line, ImageNet's val.txt) or, without one, over the
  folder's images in name order (label -1): ``(image, label)`` per image, or
  with ``batch_size`` ``(images N x ..., labels, names)`` batches; with
  ``return_img_name`` the image names come as the third item.
"""
import os
from typing import Iterator, List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.convert.caldata import IMAGE_SUFFIXES
from bpuemu.host.convert.transforms import load_rgb

IMREAD_MODES = ("opencv", "skimage")


def imread(path: str, imread_mode: str = "opencv") -> np.ndarray:
    """An image file as the toolchain's reader gives it (see the module doc)."""
    if imread_mode not in IMREAD_MODES:
        raise InvalidInput(f"imread_mode '{imread_mode}' is not one of {', '.join(IMREAD_MODES)}")
    rgb = np.asarray(load_rgb(path))
    if imread_mode == "opencv":
        return np.ascontiguousarray(rgb[..., ::-1])
    return rgb / 255.0


def transform(image: np.ndarray, transformers: Sequence) -> np.ndarray:
    for trans in transformers:
        image = trans(image)
    return image


def SingleImageDataLoader(transformers: Sequence, image_file: str, imread_mode: str = "opencv") -> np.ndarray:
    """One image, transformed, as a batch of one."""
    return transform(imread(image_file, imread_mode), transformers)[np.newaxis]


def read_label_file(label_path: str) -> List[Tuple[str, int]]:
    """``name label`` lines (ImageNet's val.txt; ``#`` comments and blank lines skipped)."""
    entries = []
    try:
        with open(label_path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                words = line.split()
                if not words or words[0].startswith("#"):
                    continue
                try:
                    entries.append((words[0], int(words[1]) if len(words) > 1 else -1))
                except ValueError:
                    raise InvalidInput(f"{label_path}:{number}: label '{words[1]}' is not a whole number") from None
    except FileNotFoundError:
        raise NotFound(f"label file {label_path} does not exist") from None
    return entries


def _entries(image_path: str, label_path: Optional[str]) -> List[Tuple[str, int]]:
    if not os.path.isdir(image_path):
        raise NotFound(f"image directory {image_path} does not exist")
    if label_path:
        return read_label_file(label_path)
    names = sorted(f for f in os.listdir(image_path) if f.lower().endswith(IMAGE_SUFFIXES) and not f.startswith("."))
    if not names:
        raise NotFound(f"image directory {image_path} holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return [(name, -1) for name in names]


def ImageNetDataLoader(transformers: Sequence, image_path: str, label_path: Optional[str] = None,
                       imread_mode: str = "opencv", batch_size: Optional[int] = None,
                       return_img_name: bool = False) -> Iterator[tuple]:
    """A generator over a folder of images and its label file (see the module doc)."""
    entries = _entries(image_path, label_path)
    if batch_size is not None and batch_size < 1:
        raise InvalidInput(f"batch_size {batch_size} must be at least 1")

    def items():
        for name, label in entries:
            yield transform(imread(os.path.join(image_path, name), imread_mode), transformers), label, name

    def batches():
        it = items()
        while True:
            chunk = [item for _, item in zip(range(batch_size), it)]
            if not chunk:
                return
            images, labels, names = zip(*chunk)
            out = (np.stack(images), np.array(labels), list(names))
            yield out if return_img_name else out[:2]

    if batch_size:
        return batches()
    return (item if return_img_name else item[:2] for item in items())


__all__ = ["IMREAD_MODES", "ImageNetDataLoader", "SingleImageDataLoader", "imread", "read_label_file", "transform"]
