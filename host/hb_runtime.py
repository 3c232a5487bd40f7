"""HBRuntime (the J6 flow's host inference, ptq_faq_j6): run a `.onnx`, a `.bc` or an `.hbm` on the host.

    from horizon_tc_ui.hb_runtime import HBRuntime
    sess = HBRuntime("model_output/tiny.hbm")       # or tiny_quantized_model.bc, tiny_ptq_model.onnx
    sess.input_names, sess.output_names, sess.input_shapes
    outputs = sess.run(None, {"data": x})            # a list, in output_names order (or the names asked for)

What each kind runs, so that the host gives the board's bits:

* ``.hbm``: the board runtime itself, in this process (the x86 simulator), on the march the model was
  compiled for; inputs in the form the board takes (input_type_rt: nv12 bytes at the model's row stride,
  featuremap arrays as the tensor properties give them). ``hbm_infer`` on a board gives the same bits.
* ``.bc``: its quantized ONNX model (the fixed-point model before compile) with the board runtime's
  session options (QDQ fusion off), inputs as HB_ONNXRuntime takes them (uint8 image data shifted by 128).
* ``.onnx``: any of the conversion's ONNX models, as HB_ONNXRuntime runs them.

Which kind a file is comes from its magic bytes (bpuemu.common.container), so a renamed file still loads.
"""
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from bpuemu.common.container import BC_MAGIC, HBM_MAGIC, MAGIC, read_bc
from bpuemu.common.errors import InvalidInput, NotFound


class _OnnxKind:
    """A `.onnx` or a `.bc`'s quantized ONNX model, through HB_ONNXRuntime (the board's session options)."""

    def __init__(self, path: str, onnx_bytes: Optional[bytes] = None):
        import onnx

        from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

        model = onnx.load_from_string(onnx_bytes) if onnx_bytes is not None else None
        self.session = HB_ONNXRuntime(model_file=path if model is None else None, onnx_model=model)
        self.input_names = self.session.input_names
        self.output_names = self.session.output_names
        self.input_shapes = {i.name: list(i.shape) for i in self.session.get_inputs()}
        self.input_types = {i.name: i.type for i in self.session.get_inputs()}

    def run(self, names: List[str], feed: Dict[str, np.ndarray]) -> List[np.ndarray]:
        return self.session.run(names, feed)


class _HbmKind:
    """An `.hbm` (or `.bin`) in the board runtime, in this process, on the model's own march."""

    def __init__(self, path: str, model_name: Optional[str]):
        from bpuemu.board.runtime import FOLLOW_MODEL, Runtime

        self.runtime = Runtime(march=FOLLOW_MODEL)
        self.runtime.load([path])
        self.model = self.runtime.model(model_name)
        self.input_names = list(self.model.input_names)
        self.output_names = list(self.model.output_names)
        self.input_shapes = {p.name: list(p.valid_shape) for p in self.model.input_properties}
        self.input_types = {s.name: s.input_type_rt for s in self.model.model.input_specs}

    def run(self, names: List[str], feed: Dict[str, np.ndarray]) -> List[np.ndarray]:
        outputs = self.model.output_by_name(self.model.run(feed))
        return [outputs[n] for n in names]


def _magic(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except FileNotFoundError:
        raise NotFound(f"model file not found: {path}") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None


class HBRuntime:
    """One model file on the host: ``.onnx``, ``.bc`` or ``.hbm`` (``model_name``: which model of a packed file)."""

    def __init__(self, model_file: str, model_name: Optional[str] = None):
        path = os.fspath(model_file)
        magic = _magic(path)
        if magic in (HBM_MAGIC, MAGIC):
            self.kind = "hbm" if magic == HBM_MAGIC else "bin"
            self._impl = _HbmKind(path, model_name)
        elif magic == BC_MAGIC:
            self.kind = "bc"
            self._impl = _OnnxKind(path, read_bc(path).onnx_bytes)
        else:
            self.kind = "onnx"
            self._impl = _OnnxKind(path)
        self.model_file = path

    @property
    def input_names(self) -> List[str]:
        return list(self._impl.input_names)

    @property
    def output_names(self) -> List[str]:
        return list(self._impl.output_names)

    @property
    def input_shapes(self) -> Dict[str, List]:
        """Each input's shape (an `.hbm`'s validShape, the ONNX model's input shape otherwise)."""
        return dict(self._impl.input_shapes)

    @property
    def input_types(self) -> Dict[str, str]:
        """Each input's type: an `.hbm`'s input_type_rt (nv12, featuremap, ...), the ONNX type otherwise."""
        return dict(self._impl.input_types)

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, np.ndarray]) -> List[np.ndarray]:
        """The outputs named (all, in output_names order, for None or []) for the inputs by name."""
        names = checked_request(self.input_names, self.output_names, output_names, input_feed)
        return self._impl.run(names, input_feed)


def checked_request(input_names: Sequence[str], outputs: Sequence[str], output_names: Optional[Sequence[str]],
                    input_feed) -> List[str]:
    """The output names a ``run(output_names, input_feed)`` asks for (all for None or []), once the feed names
    exactly the model's inputs and every name asked for is an output; one clear line otherwise."""
    if not isinstance(input_feed, dict):
        raise InvalidInput(f"input_feed is a {type(input_feed).__name__}; give a dict of input name -> array",
                           hint=f"the inputs: {', '.join(input_names)}")
    unknown = [n for n in input_feed if n not in input_names]
    missing = [n for n in input_names if n not in input_feed]
    if unknown or missing:
        raise InvalidInput(f"the model takes inputs {list(input_names)}; "
                           + (f"missing {missing}" if missing else f"unknown {unknown}"))
    names = list(output_names) if output_names else list(outputs)
    bad = [n for n in names if n not in outputs]
    if bad:
        raise InvalidInput(f"{', '.join(bad)}: not an output of the model (outputs: {', '.join(outputs)})")
    return names


__all__ = ["HBRuntime", "checked_request"]
