#!/usr/bin/env python3
"""The three models' postprocessing, as 04_inference.sh and 05_evaluate.sh apply it.

The functions are bpuemu.host.samples.ocr.postprocess (PaddleOCR's, on
axis-aligned boxes): ``det_boxes`` (DB decoding of the probability map),
``cls_direction`` (0 or 180 degrees, and PaddleOCR's turn-over rule
``turn_over``), ``ctc_greedy`` (CTC greedy decoding with the recogniser's
character list). Run as a script, it decodes one output that
``hrt_model_exec infer --enable_dump true`` wrote (float32, ``--dump_format bin``):

    python3 postprocess.py det ppocr_det_output_0_sigmoid_0.tmp_0.bin --page data/evaluation/pages/0000.png
    python3 postprocess.py cls ppocr_cls_output_0_save_infer_model_scale_0.tmp_1.bin
    python3 postprocess.py rec ppocr_rec_output_0_softmax_11.tmp_0.bin
"""
import argparse
import os
import sys

import numpy as np

from bpuemu.common.errors import BpuEmuError, InvalidInput
from bpuemu.host.samples.ocr import models, preprocess
from bpuemu.host.samples.ocr.postprocess import cls_direction, ctc_dictionary, ctc_greedy, det_boxes, turn_over

REC_MODEL = os.path.join("model", models.FILES["rec"])


def decode(kind, output, page=None, det_size=(640, 640), rec_model=REC_MODEL):
    """What one model's output says, as a line of text."""
    data = np.fromfile(output, dtype=np.float32)
    if kind == "det":
        if not page:
            raise InvalidInput("det needs --page: the page the output was computed from (for its size)")
        from PIL import Image

        with Image.open(page) as img:
            hw = (img.height, img.width)
        h, w = det_size
        if data.size != h * w:
            raise InvalidInput(f"{output} holds {data.size} values, a {h}x{w} probability map has {h * w}",
                               hint="give the detector's input size with --det_size HxW")
        boxes = det_boxes(data.reshape(h, w), hw, preprocess.det(det_size).ratio(*hw))
        return "\n".join(f"box {b.x0},{b.y0},{b.x1},{b.y1} score {b.score:.3f}" for b in boxes) or "no text found"
    if kind == "cls":
        angle, score = cls_direction(data)
        return f"{angle} degrees (score {score:.3f}){'; turn it over' if turn_over(angle, score) else ''}"
    chars = models.charset(rec_model)
    classes = len(ctc_dictionary(chars))
    if data.size % classes:
        raise InvalidInput(f"{output} holds {data.size} values, not a multiple of the recogniser's {classes} classes")
    text, conf = ctc_greedy(data.reshape(-1, classes), chars)
    return f"{text!r} (confidence {conf:.3f})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=("det", "cls", "rec"))
    p.add_argument("output", help="a float32 output file from hrt_model_exec infer --enable_dump true")
    p.add_argument("--page", help="det: the page image the output was computed from")
    p.add_argument("--det_size", default=os.environ.get("OCR_DET_SIZE", "640x640"), help="det: input size HxW")
    p.add_argument("--rec_model", default=REC_MODEL, help="rec: the recogniser's ONNX (its character list)")
    args = p.parse_args(argv)
    try:
        h, w = (int(v) for v in args.det_size.lower().split("x"))
        print(decode(args.kind, args.output, args.page, (h, w), args.rec_model))
    except BpuEmuError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
