"""HB_ONNXRuntime: run the conversion's ONNX artifacts the way the toolchain does.

    from bpuemu.host import HB_ONNXRuntime
    sess = HB_ONNXRuntime(model_file="mobilenet_quantized_model.onnx")
    out = sess.run(sess.output_names, {sess.input_names[0]: image_uint8})

Any of the five conversion stages' ONNX files loads: the calibrated model's
HzCalibration nodes run as QuantizeLinear/DequantizeLinear pairs. Sessions use
the board runtime's options (QDQ fusion off), so results match the `.bin`.

Input conversions are the seeds' non-lossy ones. Image inputs of these models
hold the X_128 intermediate type (int8 in quantized models, float32 values in
the float ones):
* uint8 data (an image as the camera gives it) is shifted by ``input_offset``
  (default 128): x - 128;
* int8 data is taken as X_128 as is;
* float32 data is taken as is for float inputs, and for int8 inputs only when
  every value is an integer in [-128, 127] (anything else would be lossy and is
  refused).
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import onnx

from bpuemu.common.errors import InvalidInput
from bpuemu.host.onnxgraph import load_onnx, open_session


def _has_calibration_nodes(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "HzCalibration" for n in model.graph.node)


class HB_ONNXRuntime:  # noqa: N801 - the toolchain's public name
    def __init__(self, model_file: Optional[str] = None, onnx_model: Optional[onnx.ModelProto] = None,
                 intra_op_threads: int = 1):
        if onnx_model is None:
            if not model_file:
                raise InvalidInput("HB_ONNXRuntime needs model_file or onnx_model")
            onnx_model = load_onnx(model_file)
        if _has_calibration_nodes(onnx_model):
            from bpuemu.host.quant import calibrated_to_fakequant

            onnx_model = calibrated_to_fakequant(onnx_model)
        self.model = onnx_model
        self.session = open_session(onnx_model, intra_op_threads=intra_op_threads, what=model_file or "the model")
        self._inputs = {i.name: i for i in self.session.get_inputs()}

    @property
    def input_names(self) -> List[str]:
        return [i.name for i in self.session.get_inputs()]

    @property
    def output_names(self) -> List[str]:
        return [o.name for o in self.session.get_outputs()]

    def get_inputs(self):
        return self.session.get_inputs()

    def get_outputs(self):
        return self.session.get_outputs()

    @property
    def input_types(self) -> Dict[str, str]:
        return {i.name: i.type for i in self.session.get_inputs()}

    def convert_input(self, name: str, data, input_offset: int = 128) -> np.ndarray:
        """The non-lossy conversion of ``data`` to what input ``name`` takes."""
        if name not in self._inputs:
            raise InvalidInput(f"'{name}' is not an input of the model; inputs: {', '.join(self.input_names)}")
        want = self._inputs[name].type  # "tensor(int8)", "tensor(float)"
        x = np.asarray(data)
        if want == "tensor(int8)":
            if x.dtype == np.int8:
                return x
            if x.dtype == np.uint8:
                return (x.astype(np.int16) - input_offset).astype(np.int8)
            if np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer):
                if not (np.all(np.isfinite(x)) and np.all(x == np.round(x)) and x.min() >= -128 and x.max() <= 127):
                    raise InvalidInput(f"input '{name}' takes int8; {x.dtype.name} data outside [-128, 127] or not integral "
                                       f"cannot be converted without loss",
                                       hint="pass uint8 image data (shifted by 128) or int8 X_128 data")
                return x.astype(np.int8)
        if want == "tensor(float)":
            if x.dtype == np.uint8:
                return x.astype(np.float32) - np.float32(input_offset)
            return x.astype(np.float32)
        return x

    def run(self, output_names: Optional[Sequence[str]], input_info: Dict[str, np.ndarray], input_offset: int = 128,
            **_ignored) -> List[np.ndarray]:
        missing = [n for n in self.input_names if n not in input_info]
        if missing:
            raise InvalidInput(f"missing input(s) {missing}; the model takes {self.input_names}")
        feed = {n: self.convert_input(n, v, input_offset) for n, v in input_info.items()}
        for n, v in feed.items():
            shape = self._inputs[n].shape
            if len(shape) != v.ndim or any(isinstance(s, int) and s != d for s, d in zip(shape, v.shape)):
                raise InvalidInput(f"input '{n}' has shape {list(v.shape)}, the model takes {shape}")
        return self.session.run(list(output_names) if output_names else None, feed)
