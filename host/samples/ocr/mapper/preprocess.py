#!/usr/bin/env python3
"""02_preprocess.sh's work: the labelled OCR data, then each model's calibration files.

1. ``data/calibration`` and ``data/evaluation``: pages and text lines with known
   strings, boxes and orientation (bpuemu.host.samples.ocr.dataset), disjoint;
2. ``calibration_data_bgr_{det,cls,rec}``: the calibration split through each
   model's transformers (horizon_tc_ui.data.transformer), saved as BGR NCHW
   uint8 with ``tofile`` (the yaml's cal_data_type: uint8): det the pages fitted
   into the detector's input, cls the lines as they come (both orientations),
   rec the lines upright (it reads what cls has turned).

``--read_mode``: ``opencv`` reads BGR uint8 0..255, ``skimage`` RGB float 0..1
(the transformers then add RGB2BGR and Scale(255)); both write the same bytes.
"""
import argparse
import os
import sys

import numpy as np

from horizon_tc_ui.data.dataloader import imread
from horizon_tc_ui.data.transformer import (HWC2CHWTransformer, PadResizeTransformer, RGB2BGRTransformer,
                                            ScaleTransformer, TextLineResizeTransformer)

from bpuemu.common.errors import BpuEmuError
from bpuemu.host.samples.ocr import dataset, preprocess as ocr_inputs

imread_mode = "opencv"  # or "skimage": see --read_mode


def calibration_transformers(model, read_mode):
    """The transformers making one model's calibration sample (BGR NCHW, 0..255) from an image read in read_mode."""
    size = (model.height, model.width)
    pad = model.pad_value / 255.0 if read_mode == "skimage" else model.pad_value  # in the read's own range
    if model.resize == "fit":
        transformers = [PadResizeTransformer(size, pad_value=pad, pad_position="bottom_right")]
    else:
        transformers = [TextLineResizeTransformer(size, pad_value=pad)]
    transformers.append(HWC2CHWTransformer())
    if read_mode == "skimage":
        transformers += [RGB2BGRTransformer(), ScaleTransformer(scale_value=255)]
    return transformers


def write_calibration(model, images, dst_dir, read_mode):
    os.makedirs(dst_dir, exist_ok=True)
    for old in os.listdir(dst_dir):
        os.unlink(os.path.join(dst_dir, old))
    transformers = calibration_transformers(model, read_mode)
    for i, (path, upright) in enumerate(images):
        image = imread(path, read_mode)
        if upright:
            image = np.ascontiguousarray(image[::-1, ::-1])
        for trans in transformers:
            image = trans(image)
        image.astype(np.uint8).tofile(os.path.join(dst_dir, f"{i:04d}.bgr"))
    print(f"wrote {len(images)} {model.name} calibration samples ({model.height}x{model.width}, BGR NCHW uint8) "
          f"to {dst_dir}/")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--read_mode", choices=("opencv", "skimage"), default=imread_mode,
                   help="how images are read: opencv (BGR uint8 0..255) or skimage (RGB float 0..1)")
    p.add_argument("--data_dir", default="data", help="where the labelled pages and lines go")
    p.add_argument("--seed", type=int, default=os.environ.get("OCR_SEED", "0"))
    p.add_argument("--cal_pages", type=int, default=os.environ.get("OCR_CAL_PAGES", "50"))
    p.add_argument("--cal_lines", type=int, default=os.environ.get("OCR_CAL_LINES", "100"))
    p.add_argument("--eval_pages", type=int, default=os.environ.get("OCR_EVAL_PAGES", "100"))
    p.add_argument("--eval_lines", type=int, default=os.environ.get("OCR_EVAL_LINES", "1000"))
    p.add_argument("--det_size", default=os.environ.get("OCR_DET_SIZE", "640x640"),
                   help="the detector's input HxW (multiples of 32), as in ppocr_det_config.yaml's input_shape")
    args = p.parse_args(argv)
    try:
        h, w = (int(v) for v in args.det_size.lower().split("x"))
    except ValueError:
        p.error(f"--det_size {args.det_size!r} is not HxW")
    try:
        inputs = ocr_inputs.model_inputs((h, w))  # refuses a size the detector cannot take before any work
        for split, pages, lines in (("calibration", args.cal_pages, args.cal_lines),
                                    ("evaluation", args.eval_pages, args.eval_lines)):
            out = dataset.make(args.data_dir, args.seed, pages, lines, split)
            print(f"wrote {pages} pages and {lines} lines with their labels to {out}/ (seed {args.seed})")
        cal = os.path.join(args.data_dir, "calibration")
        pages = [(p.file, False) for p in dataset.load_pages(cal)]
        lines = dataset.load_lines(cal)
        write_calibration(inputs["det"], pages, "calibration_data_bgr_det", args.read_mode)
        write_calibration(inputs["cls"], [(ln.file, False) for ln in lines], "calibration_data_bgr_cls", args.read_mode)
        write_calibration(inputs["rec"], [(ln.file, ln.angle == 180) for ln in lines], "calibration_data_bgr_rec",
                          args.read_mode)
    except BpuEmuError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
