"""Insert the HzPreprocess node: *_original_float_model.onnx.

The board feeds the model the intermediate type of input_type_rt (yuv444_128,
RGB_128, BGR_128, GRAY_128: the uint8 image minus 128, as int8). HzPreprocess
turns that into what the float model was trained on, in one affine map per
pixel (a 1x1 conv on the BPU):

    train = scale * (M @ (x + 128) + c - mean)

where M, c convert the intermediate colour space to input_type_train's
(YUV->RGB by BT.601 in the input's input_space_and_range -- full range for
``regular``, the video-range equations for ``bt601_video``; video-range YUV
-> full-range YUV for a yuv444-trained model; RGB<->BGR by swapping; identity
otherwise; the equations live in bpuemu.common.input_types), and
mean/scale come from norm_type/mean_value/scale_value (ptq_guide:
"((input + 128) - mean) * scale"). The original float model's image inputs
carry X_128 values as float32, in input_layout_train -- except nv12, whose
model input is NHWC (ptq_guide: "If input_type_rt is nv12, the corresponding
input layout of quanti.onnx is NHWC"). Featuremap inputs are left alone.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import check_space, yuv_range_affine, yuv_to_rgb_affine

#: input_type_rt -> colour space of its intermediate type
INTERMEDIATE_COLOUR = {"nv12": "yuv", "yuv444": "yuv", "rgb": "rgb", "bgr": "bgr", "gray": "gray"}

#: (input_type_train rows) x (input_type_rt columns) allowed pairs (ptq_guide table)
ALLOWED = {
    "yuv444": {"nv12", "yuv444"},
    "rgb": {"nv12", "yuv444", "rgb", "bgr"},
    "bgr": {"nv12", "yuv444", "rgb", "bgr"},
    "gray": {"gray"},
    "featuremap": {"featuremap"},
}

#: input_type_rt values whose data is YUV, so that input_space_and_range applies.
YUV_RT_TYPES = ("nv12", "yuv444")
_SWAP = np.array([[0, 0, 1], [0, 1, 0], [1, 0, 0]], dtype=np.float64)


@dataclass(frozen=True)
class InputPreprocess:
    """What HzPreprocess needs to know about one input."""

    name: str
    input_type_rt: str
    input_type_train: str
    input_layout_train: str            # NCHW | NHWC
    mean: Optional[Tuple[float, ...]] = None
    scale: Optional[Tuple[float, ...]] = None
    #: regular | bt601_video: the BT.601 range of nv12/yuv444 data.
    input_space_and_range: str = "regular"

    @property
    def is_image(self) -> bool:
        return self.input_type_rt != "featuremap"

    @property
    def model_layout(self) -> str:
        """Layout of this input in original/optimized/calibrated/quantized models."""
        return "NHWC" if self.input_type_rt == "nv12" else self.input_layout_train


def colour_matrix(input_type_rt: str, input_type_train: str,
                  space: str = "regular") -> Tuple[np.ndarray, np.ndarray]:
    """(M, c): train_colour = M @ intermediate_colour + c, on 0..255 values.

    ``space`` is input_space_and_range, the BT.601 range of YUV input data
    (full-range training data is assumed: a yuv444-trained model gets its YUV
    expanded to the full range).
    """
    if input_type_train not in ALLOWED or input_type_rt not in ALLOWED[input_type_train]:
        allowed = ", ".join(sorted(ALLOWED.get(input_type_train, ())))
        raise InvalidInput(f"input_type_rt '{input_type_rt}' cannot feed input_type_train '{input_type_train}'"
                           + (f" (allowed: {allowed})" if allowed else ""))
    space = check_space(space)
    if space != "regular" and input_type_rt not in YUV_RT_TYPES:
        raise InvalidInput(f"input_space_and_range {space} applies to {'/'.join(YUV_RT_TYPES)} input, "
                           f"not {input_type_rt}")
    src, dst = INTERMEDIATE_COLOUR[input_type_rt], INTERMEDIATE_COLOUR.get(input_type_train, input_type_train)
    if src == "yuv" and dst == "yuv":
        return yuv_range_affine(space, "regular")
    if src == "gray" or src == dst:
        n = 1 if src == "gray" else 3
        return np.eye(n), np.zeros(n)
    if src == "yuv":
        m, c = yuv_to_rgb_affine(space)
        return (m, c) if dst == "rgb" else (_SWAP @ m, _SWAP @ c)
    return _SWAP, np.zeros(3)  # rgb <-> bgr


def affine(p: InputPreprocess, channels: int) -> Tuple[np.ndarray, np.ndarray]:
    """(A, b) with train = A @ x_128 + b, per pixel."""
    m, c = colour_matrix(p.input_type_rt, p.input_type_train, p.input_space_and_range)
    if m.shape[0] != channels:
        raise InvalidInput(f"input '{p.name}': {p.input_type_train} needs {m.shape[0]} channel(s), the model input has {channels}")
    mean = np.zeros(channels) if p.mean is None else np.broadcast_to(np.asarray(p.mean, np.float64), (channels,))
    scale = np.ones(channels) if p.scale is None else np.broadcast_to(np.asarray(p.scale, np.float64), (channels,))
    a = scale[:, None] * m
    b = scale * (m @ np.full(channels, 128.0) + c - mean)
    return a.astype(np.float32), b.astype(np.float32)


def _channels(shape: Sequence[int], layout: str) -> int:
    return int(shape[1] if layout == "NCHW" else shape[3])


def insert_preprocess(model: onnx.ModelProto, inputs: Sequence[InputPreprocess]) -> onnx.ModelProto:
    """Return a copy of ``model`` with HzPreprocess in front of each image input."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    images = [p for p in inputs if p.is_image]
    new_nodes, new_inits = [], []
    for p in images:
        vi = next((i for i in g.input if i.name == p.name), None)
        if vi is None:
            raise InvalidInput(f"input_name '{p.name}' is not an input of the model")
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if len(shape) != 4:
            raise InvalidInput(f"input '{p.name}' is {len(shape)}-D; image inputs must be 4-D")
        ch = _channels(shape, p.input_layout_train)
        a, b = affine(p, ch)
        node_name = "HzPreprocess" if len(images) == 1 else f"HzPreprocess_{p.name}"
        raw = f"{p.name}__x128"
        x = raw
        if p.model_layout != p.input_layout_train:  # nv12: NHWC model input, NCHW train
            new_nodes.append(helper.make_node("Transpose", [raw], [f"{p.name}__nchw"], name=f"{node_name}_transpose", perm=[0, 3, 1, 2]))
            x = f"{p.name}__nchw"
        out = f"{node_name}_out"
        if p.input_layout_train == "NCHW":
            new_inits += [numpy_helper.from_array(a[:, :, None, None], f"{node_name}_w"), numpy_helper.from_array(b, f"{node_name}_b")]
            new_nodes.append(helper.make_node("Conv", [x, f"{node_name}_w", f"{node_name}_b"], [out], name=node_name, kernel_shape=[1, 1]))
        else:
            new_inits += [numpy_helper.from_array(np.ascontiguousarray(a.T), f"{node_name}_w"), numpy_helper.from_array(b, f"{node_name}_b")]
            new_nodes += [
                helper.make_node("MatMul", [x, f"{node_name}_w"], [f"{node_name}_mm"], name=node_name),
                helper.make_node("Add", [f"{node_name}_mm", f"{node_name}_b"], [out], name=f"{node_name}_bias"),
            ]
        for n in g.node:
            for i, name in enumerate(n.input):
                if name == p.name:
                    n.input[i] = out
        for o in g.output:
            if o.name == p.name:
                raise InvalidInput(f"input '{p.name}' is also a model output; HzPreprocess cannot be inserted")
        # Rename: the graph input keeps its name, so raw -> name after rewiring.
        for n in new_nodes:
            for i, name in enumerate(n.input):
                if name == raw:
                    n.input[i] = p.name
        if p.model_layout != p.input_layout_train:
            n_, c_, h_, w_ = shape
            dims = [n_, h_, w_, c_]
            vi.type.tensor_type.ClearField("shape")
            for d in dims:
                vi.type.tensor_type.shape.dim.add().dim_value = d
        vi.type.tensor_type.elem_type = TensorProto.FLOAT
    nodes = new_nodes + list(g.node)
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(new_inits)
    onnx.checker.check_model(model)
    return model
