"""Each OCR model's input from an image: its float input and the ``.bin``'s input_type_rt data.

All three PaddleOCR models take BGR planes normalised as ``(x / 255 - 0.5) / 0.5``
(rapidocr's settings), i.e. ``mean_value 127.5``, ``scale_value 1/127.5`` in the
yaml (HzPreprocess). The geometry is the one transforms module's
(``bpuemu.host.convert.transforms``, through hb_eval_preprocess's entries):

* det: the page fitted inside the conversion size (a multiple of 32) keeping its
  aspect ratio, padded at the bottom and right with 0, so a box maps back to the
  page by one ratio (``ModelInput.ratio``); the board gets nv12, as from a camera;
* cls and rec: PaddleOCR's text-line resize to 48x192 / 48x320 (height 48, the
  width by the aspect ratio, capped), padded on the right with 127 (PaddleOCR pads
  with 0 after normalising, pixel 127.5); the board gets BGR, as a crop made on
  the CPU.

The float input is computed from the very uint8 pixels the ``.bin`` is given, so
float vs quantized measures the conversion (nv12's chroma subsampling included
for det), not two resizes.
"""
from dataclasses import dataclass
from typing import Tuple, Union

import numpy as np

from bpuemu.host.tools.eval_preprocess import EvalModel, parse_entry, pixels, rt_data

MEAN = 127.5
SCALE = 1 / 127.5
DET_SIZE = (640, 640)
CLS_SIZE = (48, 192)
REC_SIZE = (48, 320)

Image = Union[str, np.ndarray]  # an image file, or an HxWx3 uint8 RGB array


@dataclass(frozen=True)
class ModelInput:
    """How one model's input is made: size, geometry, the board's input type."""

    name: str
    height: int
    width: int
    resize: str             # "fit" (det) or "height" (cls, rec)
    pad_value: int
    input_type_rt: str      # "nv12" or "bgr"

    def entry(self) -> EvalModel:
        """The hb_eval_preprocess entry this input is."""
        entry = {"size": f"{self.height}x{self.width}", "resize": self.resize, "pad_value": self.pad_value,
                 "input_type_rt": self.input_type_rt}
        if self.resize == "fit":
            entry["pad"] = "bottom_right"
        return parse_entry(f"ppocr_{self.name}", entry)

    def pixels(self, image: Image) -> np.ndarray:
        """H x W x 3 uint8 RGB at the model's size."""
        return pixels(image, self.entry())

    def float_input(self, image: Image) -> np.ndarray:
        """1 x 3 x H x W float32: BGR planes, ``(x / 255 - 0.5) / 0.5``, what the float ONNX model takes."""
        return normalise(self.pixels(image))

    def rt_input(self, image: Image) -> np.ndarray:
        """The input_type_rt data the ``.bin`` takes (uint8: nv12 bytes, or 1 x H x W x 3 BGR)."""
        return rt_data(self.pixels(image), self.entry())

    def ratio(self, image_height: int, image_width: int) -> Tuple[float, float]:
        """(ry, rx): a page pixel (y, x) is at (y * ry, x * rx) in a det input (fit); 1:1 elsewhere."""
        if self.resize != "fit":
            return self.height / image_height, self.width / image_width
        scale = min(self.width / image_width, self.height / image_height)
        nh = max(1, min(self.height, int(scale * image_height)))
        nw = max(1, min(self.width, int(scale * image_width)))
        return nh / image_height, nw / image_width


def normalise(rgb: np.ndarray) -> np.ndarray:
    """H x W x 3 uint8 RGB -> 1 x 3 x H x W float32 BGR, ``(x - 127.5) / 127.5``."""
    bgr = rgb[..., ::-1].astype(np.float32)
    return np.ascontiguousarray(((bgr - np.float32(MEAN)) * np.float32(SCALE)).transpose(2, 0, 1)[None])


def det(size: Tuple[int, int] = DET_SIZE) -> ModelInput:
    h, w = size
    if h % 32 or w % 32:
        from bpuemu.common.errors import InvalidInput

        raise InvalidInput(f"the detector's input size {h}x{w} must be multiples of 32")
    return ModelInput("det", h, w, "fit", 0, "nv12")


def cls() -> ModelInput:
    return ModelInput("cls", *CLS_SIZE, "height", 127, "bgr")


def rec() -> ModelInput:
    return ModelInput("rec", *REC_SIZE, "height", 127, "bgr")


def model_inputs(det_size: Tuple[int, int] = DET_SIZE) -> dict:
    """{"det", "cls", "rec"} -> ModelInput."""
    return {"det": det(det_size), "cls": cls(), "rec": rec()}


__all__ = ["CLS_SIZE", "DET_SIZE", "MEAN", "REC_SIZE", "SCALE", "ModelInput", "cls", "det", "model_inputs",
           "normalise", "rec"]
