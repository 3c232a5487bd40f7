"""hb_eval_preprocess: evaluation images -> one input_type_rt binary per image, ready for the board.

Each model name is an entry of data: the geometry (``ImageTransforms``: resize
mode, crop, pad, filter, size) and the board input it feeds (input_type_rt,
input_layout_rt, input_space_and_range). ``MODELS`` holds the common evaluation
pipelines; a user yaml of the same shape adds entries or replaces them::

    my_classifier:
      size: 224x224            # H x W of the model input
      resize: short_side       # stretch | short_side | fit | height (PaddleOCR's text-line resize)
      resize_to: 256           # short_side: the short side before the crop
      crop: center             # none | center
      pad: none                # fit: none | center (letterbox) | bottom_right; height pads on the right
      pad_value: 0
      interpolation: bilinear  # bilinear | nearest | bicubic | lanczos | box | hamming
      input_type_rt: nv12      # nv12 | yuv444 | rgb | bgr | gray
      input_layout_rt: NHWC    # NHWC | NCHW (not for nv12)
      input_space_and_range: regular

The pixels go through bpuemu.host.convert.transforms and caldata.train_to_rt,
the code makertbin's calibration uses with preprocess_on, so an entry
configured like a calibration (stretch, bilinear) gives the same bytes. A
file is written as ``<image name>.bin`` (the image's sub-folder kept) for
``hrt_model_exec infer --input_file``.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.common.proto import model_pb2
from bpuemu.host.convert.caldata import IMAGE_SUFFIXES, train_to_rt
from bpuemu.host.convert.transforms import ImageTransforms, load_rgb, rgb_to_train, transform_array, transform_image

log = logging.getLogger("bpuemu.host.tools")

RT_TYPES = ("nv12", "yuv444", "rgb", "bgr", "gray")
ENTRY_KEYS = ("size", "resize", "resize_to", "crop", "pad", "pad_value", "interpolation", "input_type_rt",
              "input_layout_rt", "input_space_and_range", "description")

_IMAGENET = {"resize": "short_side", "crop": "center", "input_type_rt": "nv12"}
_LETTERBOX = {"resize": "fit", "pad": "center", "input_type_rt": "nv12"}
_OCR = {"resize": "fit", "pad": "bottom_right", "pad_value": 0, "input_type_rt": "nv12"}
#: PaddleOCR's rec/cls resize: height to the model's, width by the aspect ratio, padded on the right with
#: mid-grey (PaddleOCR pads with 0 after (x/255-0.5)/0.5, i.e. pixel 127.5).
_OCR_LINE = {"resize": "height", "pad_value": 127, "input_type_rt": "nv12"}

#: The built-in evaluation pipelines (the same shape as a user yaml).
MODELS: Dict[str, dict] = {
    "mobilenetv1": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "mobilenetv2": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "resnet18": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "resnet50": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "googlenet": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "vargconvnet": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "efficientnet_lite0": {**_IMAGENET, "size": "224x224", "resize_to": 256, "description": "ImageNet classifier"},
    "efficientnet_lite1": {**_IMAGENET, "size": "240x240", "resize_to": 274, "description": "ImageNet classifier"},
    "efficientnet_lite2": {**_IMAGENET, "size": "260x260", "resize_to": 298, "description": "ImageNet classifier"},
    "efficientnet_lite3": {**_IMAGENET, "size": "280x280", "resize_to": 320, "description": "ImageNet classifier"},
    "efficientnet_lite4": {**_IMAGENET, "size": "300x300", "resize_to": 342, "description": "ImageNet classifier"},
    "open_nsfw": {"resize": "stretch", "resize_to": 256, "crop": "center", "size": "224x224", "input_type_rt": "nv12",
                  "description": "Yahoo open_nsfw (Caffe): 256x256, centre 224"},
    "yolov2_darknet19": {**_LETTERBOX, "size": "608x608", "pad_value": 127, "description": "YOLOv2 letterbox"},
    "yolov3_darknet53": {**_LETTERBOX, "size": "416x416", "pad_value": 127, "description": "YOLOv3 letterbox"},
    "yolov5s": {**_LETTERBOX, "size": "640x640", "pad_value": 114, "description": "YOLOv5 letterbox"},
    "ssd_mobilenetv1": {"resize": "stretch", "size": "300x300", "input_type_rt": "nv12", "description": "SSD (Caffe)"},
    "mtcnn_rnet": {"resize": "stretch", "size": "24x24", "input_type_rt": "bgr", "input_layout_rt": "NHWC",
                   "description": "MTCNN RNet face crops (Caffe)"},
    "mtcnn_onet": {"resize": "stretch", "size": "48x48", "input_type_rt": "bgr", "input_layout_rt": "NHWC",
                   "description": "MTCNN ONet face crops (Caffe)"},
    "retinaface_mobilenet": {**_OCR, "size": "640x640", "description": "face detector, top-left placed"},
    "ppocr_det": {**_OCR, "size": "640x640", "description": "PP-OCR text detector"},
    "ppocr_cls": {**_OCR_LINE, "size": "48x192", "description": "PP-OCR text direction classifier"},
    "ppocr_rec": {**_OCR_LINE, "size": "48x320", "description": "PP-OCR text recogniser"},
}


@dataclass(frozen=True)
class EvalModel:
    name: str
    transforms: ImageTransforms
    input_type_rt: str = "nv12"
    input_layout_rt: str = "NHWC"
    input_space_and_range: str = "regular"
    description: str = ""

    def spec(self) -> model_pb2.InputSpec:
        """The board input this entry feeds (what train_to_rt needs to know)."""
        return model_pb2.InputSpec(name=self.name, input_type_rt=self.input_type_rt,
                                   input_layout_rt="" if self.input_type_rt == "nv12" else self.input_layout_rt,
                                   input_space_and_range=self.input_space_and_range)


def _size(value, name: str) -> Tuple[int, int]:
    try:
        h, w = (int(v) for v in (value.lower().split("x") if isinstance(value, str) else value))
    except (ValueError, TypeError, AttributeError):
        raise InvalidInput(f"model '{name}': size {value!r} is not HxW (e.g. 224x224)") from None
    return h, w


def parse_entry(name: str, entry) -> EvalModel:
    """One table entry -> EvalModel, with one clear line for what is wrong."""
    if not isinstance(entry, dict):
        raise InvalidInput(f"model '{name}': expected a mapping of {', '.join(ENTRY_KEYS)}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise InvalidInput(f"model '{name}': unknown key(s) {', '.join(unknown)} (known: {', '.join(ENTRY_KEYS)})")
    if "size" not in entry:
        raise InvalidInput(f"model '{name}': size (HxW) is missing")
    h, w = _size(entry["size"], name)
    rt = entry.get("input_type_rt", "nv12")
    if rt not in RT_TYPES:
        raise InvalidInput(f"model '{name}': input_type_rt '{rt}' is not one of {', '.join(RT_TYPES)}")
    layout = entry.get("input_layout_rt", "NHWC")
    if layout not in ("NHWC", "NCHW"):
        raise InvalidInput(f"model '{name}': input_layout_rt '{layout}' is not NHWC or NCHW")
    if rt == "nv12" and (h % 2 or w % 2):
        raise InvalidInput(f"model '{name}': nv12 needs an even height and width, not {h}x{w}")
    for key in ("resize_to", "pad_value"):
        if key in entry and (isinstance(entry[key], bool) or not isinstance(entry[key], int)):
            raise InvalidInput(f"model '{name}': {key} {entry[key]!r} is not a whole number")
    try:
        t = ImageTransforms.from_dict({**entry, "height": h, "width": w})
    except (InvalidInput, TypeError) as exc:
        raise InvalidInput(f"model '{name}': {exc}") from None
    return EvalModel(name, t, rt, layout, entry.get("input_space_and_range", "regular"), entry.get("description", ""))


def load_table(user_yaml: Optional[str] = None) -> Dict[str, EvalModel]:
    """The built-in entries, plus (overriding) those of ``user_yaml``."""
    entries = dict(MODELS)
    if user_yaml:
        import yaml

        try:
            with open(user_yaml, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except FileNotFoundError:
            raise NotFound(f"model table {user_yaml} does not exist") from None
        except (OSError, yaml.YAMLError) as exc:
            raise InvalidInput(f"model table {user_yaml} is not readable YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(doc, dict):
            raise InvalidInput(f"model table {user_yaml} must map model names to entries")
        entries.update({str(k): v for k, v in doc.items()})
    return {name: parse_entry(name, entry) for name, entry in entries.items()}


def pixels(image, model: EvalModel):
    """An image file (or an HxWx3 uint8 RGB array) -> the model's H x W x 3 uint8 RGB pixels."""
    if isinstance(image, str):
        return transform_image(load_rgb(image), model.transforms)
    return transform_array(np.asarray(image, dtype=np.uint8), model.transforms)


def rt_data(rgb, model: EvalModel):
    """The model's H x W x 3 uint8 RGB pixels -> the input_type_rt data the board reads."""
    colour = "gray" if model.input_type_rt == "gray" else "rgb"
    return train_to_rt(rgb_to_train(rgb, colour)[None], colour, "NHWC", model.spec())


def preprocess(path: str, model: EvalModel) -> bytes:
    """One image -> the input_type_rt bytes the board reads."""
    return rt_data(pixels(path, model), model).tobytes()


def list_images(image_dir: str, val_txt: Optional[str] = None) -> Tuple[List[str], List[str]]:
    """(image names relative to image_dir, error lines). ``val_txt`` chooses and orders them (first word per line)."""
    if not os.path.isdir(image_dir):
        raise NotFound(f"image directory {image_dir} does not exist")
    if not val_txt:
        names = sorted(os.path.relpath(os.path.join(root, f), image_dir) for root, _, files in os.walk(image_dir)
                       for f in files if f.lower().endswith(IMAGE_SUFFIXES) and not f.startswith("."))
        if not names:
            raise NotFound(f"image directory {image_dir} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        return names, []
    try:
        with open(val_txt, encoding="utf-8") as f:
            listed = [line.split()[0] for line in f if line.strip() and not line.lstrip().startswith("#")]
    except FileNotFoundError:
        raise NotFound(f"val_txt {val_txt} does not exist") from None
    names, errors = [], []
    for name in listed:
        if os.path.isfile(os.path.join(image_dir, name)):
            names.append(name)
        else:
            errors.append(f"{name}: listed in {os.path.basename(val_txt)} but not found in {image_dir}")
    return names, errors


@dataclass
class Report:
    written: List[str] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)


def run(model_name: str, image_dir: str, output_dir: str, val_txt: Optional[str] = None,
        table: Optional[Dict[str, EvalModel]] = None) -> Report:
    """Preprocess every image; an image that fails is one error line, the others are still written."""
    table = load_table() if table is None else table
    if model_name not in table:
        raise InvalidInput(f"unknown model name '{model_name}'",
                           hint=f"supported: {', '.join(sorted(table))} (or add it with a model table yaml)")
    model = table[model_name]
    names, errors = list_images(image_dir, val_txt)
    report = Report(errors=list(errors))
    for line in errors:
        log.error(line)
    os.makedirs(output_dir, exist_ok=True)
    for name in names:
        try:
            data = preprocess(os.path.join(image_dir, name), model)
        except InvalidInput as exc:
            report.errors.append(str(exc))
            log.error("%s", exc)
            continue
        out = os.path.join(output_dir, os.path.splitext(name)[0] + ".bin")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write_file_atomic(out, data)
        report.written.append(out)
    return report


__all__ = ["EvalModel", "MODELS", "Report", "load_table", "list_images", "pixels", "preprocess", "rt_data", "run"]
