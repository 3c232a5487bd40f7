#!/usr/bin/env python3
"""04_inference.sh's work: each converted model on one evaluation sample, three ways.

* float: the original ONNX model (onnxruntime) on the float input;
* quantized: ``model_output/ppocr_*_quantized_model.onnx`` on this host (HB_ONNXRuntime);
* board: ``model_output/ppocr_*.bin`` on a board with ``hrt_model_exec infer --board``: a local hrt_boardd
  on loopback started and stopped here, or ``--board HOST:PORT``.

The quantized model and the board take the input_type_rt data (nv12 for det, BGR for cls and rec); the
board gets it as a file, as from ``hb_eval_preprocess``. Printed per model: what each side found, and how
far the board's output is from the quantized model's (postprocess.py: DB boxes, direction, CTC text).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

from horizon_tc_ui import HB_ONNXRuntime
from horizon_tc_ui.data.transformer import NV12ToYUV444Transformer

from bpuemu.common.errors import BpuEmuError, InvalidInput
from bpuemu.host.onnxgraph import open_session
from bpuemu.host.samples.daemon import console_script, running_daemon
from bpuemu.host.samples.ocr import dataset, models, postprocess, preprocess as ocr_inputs
from bpuemu.host.samples.ocr.metrics import match_boxes

OUTPUT = "model_output"
INFER_TIMEOUT_S = 300


def converted(name):
    """(quantized model, .bin) of one model, or one error line saying which step makes them."""
    quantized = os.path.join(OUTPUT, f"ppocr_{name}_quantized_model.onnx")
    bin_file = os.path.join(OUTPUT, f"ppocr_{name}.bin")
    for path in (quantized, bin_file):
        if not os.path.isfile(path):
            raise InvalidInput(f"{path} does not exist", hint="run 03_build.sh first")
    return quantized, bin_file


def board_infer(board, bin_file, rt, workdir, name):
    """The .bin's outputs for one input, from the board (hrt_model_exec infer --json)."""
    data_file = os.path.join(workdir, f"{name}_input.bin")
    rt.tofile(data_file)
    dump = os.path.join(workdir, f"{name}_out")
    args = ["hrt_model_exec", "infer", "--model_file", bin_file, "--input_file", data_file, "--board", board,
            "--enable_dump", "true", "--dump_format", "bin", "--dump_path", dump, "--json"]
    print("   $ " + shlex.join(args))
    proc = subprocess.run([console_script(args[0])] + args[1:], capture_output=True, text=True,
                          timeout=INFER_TIMEOUT_S)
    if proc.returncode != 0:
        raise InvalidInput(f"hrt_model_exec infer failed: {proc.stderr.strip().splitlines()[-1:]}")
    doc = json.loads(proc.stdout)
    return [np.fromfile(os.path.join(dump, o["files"][0]), o["dtype"]).reshape(o["shape"]) for o in doc["outputs"]]


def quantized_infer(path, rt, model):
    """The quantized model's outputs for the input_type_rt data (nv12 goes in as YUV444, as the board makes it)."""
    sess = HB_ONNXRuntime(model_file=path)
    channels_first = sess.get_inputs()[0].shape[1] == 3
    if model.input_type_rt == "nv12":
        data = NV12ToYUV444Transformer((model.height, model.width), yuv444_output_layout="HWC")(rt)[None]
    else:
        data = rt.reshape(1, model.height, model.width, 3)
    if channels_first:  # the quantized model keeps the training layout (NCHW)
        data = np.ascontiguousarray(data.transpose(0, 3, 1, 2))
    return sess.run(sess.output_names, {sess.input_names[0]: data})


def float_infer(path, x):
    """The float model as PaddleOCR runs it: stock onnxruntime."""
    with open(path, "rb") as f:
        sess = open_session(f.read(), board_options=False, what=path)
    return sess.run(None, {sess.get_inputs()[0].name: x})


def gap(board, quantized):
    return max(float(np.abs(b.astype(np.float64) - q.astype(np.float64)).max()) for b, q in zip(board, quantized))


def inputs_ready(data_dir):
    """Everything 04 reads, checked before a board is started: the float models (01), the data (02), the
    converted models (03). Returns (float models, page, line, character list, model inputs)."""
    floats = {name: os.path.join("model", file) for name, file in models.FILES.items()}
    for path in floats.values():
        if not os.path.isfile(path):
            raise InvalidInput(f"{path} does not exist", hint="run 01_check.sh first")
    split = os.path.join(data_dir, "evaluation")
    page, line = dataset.load_pages(split)[0], dataset.load_lines(split)[0]
    for name in floats:
        converted(name)
    shape = HB_ONNXRuntime(model_file=converted("det")[0]).get_inputs()[0].shape
    det_size = tuple(shape[2:4]) if shape[1] == 3 else tuple(shape[1:3])  # NCHW or NHWC
    return floats, page, line, models.charset(floats["rec"]), ocr_inputs.model_inputs(det_size)


def run(board, ready, workdir):
    floats, page, line, chars, inputs = ready
    for name, sample, label in (("det", page.file, page.boxes), ("cls", line.file, line.angle),
                                ("rec", line.file, line.text)):
        model = inputs[name]
        quantized, bin_file = converted(name)
        image = sample
        if name == "rec" and line.angle == 180:  # rec reads upright lines (cls turns them)
            from PIL import Image

            with Image.open(sample) as img:
                image = np.ascontiguousarray(np.asarray(img.convert("RGB"))[::-1, ::-1])
        print(f"== {name}: {os.path.relpath(sample)} ({model.height}x{model.width}, board input {model.input_type_rt})")
        rt = model.rt_input(image)
        sides = {"float": float_infer(floats[name], model.float_input(image)),
                 "quantized": quantized_infer(quantized, rt, model),
                 "board": board_infer(board, bin_file, rt, workdir, name)}
        if name == "det":
            from PIL import Image

            with Image.open(sample) as img:
                hw = (img.height, img.width)

            def found(out):
                boxes = [b.xyxy for b in postprocess.det_boxes(out[0], hw, model.ratio(*hw))]
                return f"{len(boxes)} boxes, {len(match_boxes(boxes, label))} of the {len(label)} labelled (IoU >= 0.5)"
            said = {side: found(out) for side, out in sides.items()}
        elif name == "cls":
            said = {side: "%d (%.3f)" % postprocess.cls_direction(out[0]) for side, out in sides.items()}
            print(f"   label: {label} degrees")
        else:
            said = {side: repr(postprocess.ctc_greedy(out[0], chars)[0]) for side, out in sides.items()}
            print(f"   label: {label!r}")
        for side, what in said.items():
            print(f"   {side:9s} {what}")
        print(f"   board vs quantized: max |difference| {gap(sides['board'], sides['quantized']):.6g}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--board", default="", help="HOST:PORT of a board's hrt_boardd (default: start one on loopback)")
    p.add_argument("--data_dir", default="data")
    args = p.parse_args(argv)
    try:
        ready = inputs_ready(args.data_dir)
        with tempfile.TemporaryDirectory(prefix="ocr-inference-") as workdir:
            if args.board:
                run(args.board, ready, workdir)
                return 0
            with running_daemon(os.path.join(workdir, "board"), os.path.join(workdir, "hrt_boardd.log"),
                                echo=print) as board:
                print(f"started a local board: hrt_boardd on {board}")
                run(board, ready, workdir)
            print(f"stopped the local board ({board})")
    except BpuEmuError as exc:
        print(f"ERROR {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
