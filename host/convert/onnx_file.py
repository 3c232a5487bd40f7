"""Reading an ONNX file the tools were given, or failing with one user-facing line.

Every host tool that takes an ``.onnx`` path (hb_mapper checker / makertbin /
infer, HB_ONNXRuntime, hb_verifier) reads it here, so a missing, unreadable or
non-ONNX file gives the same NotFound / InvalidInput everywhere instead of a
traceback.
"""
import os

import onnx

from bpuemu.common.errors import InvalidInput, NotFound


def load_onnx(path: str, what: str = "model file", load_external_data: bool = True) -> onnx.ModelProto:
    """The model in ``path``; ``what`` names the file in errors (e.g. "onnx_model", "quantized model")."""
    if not os.path.exists(path):
        raise NotFound(f"{what} not found: {path}")
    if os.path.isdir(path):
        raise InvalidInput(f"{what} {path} is a directory, not an ONNX model")
    try:
        model = onnx.load(path, load_external_data=load_external_data)
    except Exception as exc:  # onnx raises DecodeError, OSError and others
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise InvalidInput(f"{path} is not a readable ONNX model: {type(exc).__name__}"
                           + (f": {detail}" if detail else "")) from None
    if not model.opset_import and not model.graph.node:
        # Another protobuf (a Caffe caffemodel, a .bin's manifest) can parse as an empty ModelProto.
        raise InvalidInput(f"{path} is not an ONNX model: it has no operator set and no graph",
                           hint="a Caffe model is converted with --model-type caffe (--proto NET.prototxt)")
    return model
