"""Tensor properties (hbDNNTensorProperties) and tensor (de)serialization.

The enums themselves are defined once, in proto/ (TensorLayout, TensorType,
QuantiType, InputSource); this module maps them to numpy and to the text the
tools print.
"""
from typing import Dict, Optional, Sequence

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.proto import board_pb2, model_pb2

TT = model_pb2.TensorType
LAYOUT = model_pb2.TensorLayout

#: numpy dtype of each plain tensor type (image types are uint8 bytes).
NUMPY_DTYPE: Dict[int, np.dtype] = {
    TT.HB_DNN_TENSOR_TYPE_S8: np.dtype("int8"),
    TT.HB_DNN_TENSOR_TYPE_U8: np.dtype("uint8"),
    TT.HB_DNN_TENSOR_TYPE_F16: np.dtype("float16"),
    TT.HB_DNN_TENSOR_TYPE_S16: np.dtype("int16"),
    TT.HB_DNN_TENSOR_TYPE_U16: np.dtype("uint16"),
    TT.HB_DNN_TENSOR_TYPE_F32: np.dtype("float32"),
    TT.HB_DNN_TENSOR_TYPE_S32: np.dtype("int32"),
    TT.HB_DNN_TENSOR_TYPE_U32: np.dtype("uint32"),
    TT.HB_DNN_TENSOR_TYPE_F64: np.dtype("float64"),
    TT.HB_DNN_TENSOR_TYPE_S64: np.dtype("int64"),
    TT.HB_DNN_TENSOR_TYPE_U64: np.dtype("uint64"),
}
for _img in (
    TT.HB_DNN_IMG_TYPE_Y,
    TT.HB_DNN_IMG_TYPE_NV12,
    TT.HB_DNN_IMG_TYPE_NV12_SEPARATE,
    TT.HB_DNN_IMG_TYPE_YUV444,
    TT.HB_DNN_IMG_TYPE_RGB,
    TT.HB_DNN_IMG_TYPE_BGR,
):
    NUMPY_DTYPE[_img] = np.dtype("uint8")

TENSOR_TYPE_OF_DTYPE = {
    np.dtype(d): t
    for t, d in NUMPY_DTYPE.items()
    if t >= TT.HB_DNN_TENSOR_TYPE_S4
}

#: input_type_rt -> tensor type of the model input.
TENSOR_TYPE_OF_INPUT_TYPE = {
    "gray": TT.HB_DNN_IMG_TYPE_Y,
    "nv12": TT.HB_DNN_IMG_TYPE_NV12,
    "yuv444": TT.HB_DNN_IMG_TYPE_YUV444,
    "rgb": TT.HB_DNN_IMG_TYPE_RGB,
    "bgr": TT.HB_DNN_IMG_TYPE_BGR,
    "featuremap": TT.HB_DNN_TENSOR_TYPE_F32,
}

LAYOUT_OF_NAME = {"NHWC": LAYOUT.HB_DNN_LAYOUT_NHWC, "NCHW": LAYOUT.HB_DNN_LAYOUT_NCHW, "": LAYOUT.HB_DNN_LAYOUT_NONE}


def tensor_type_name(t: int) -> str:
    return model_pb2.TensorType.Name(t)


def layout_name(layout: int) -> str:
    return model_pb2.TensorLayout.Name(layout)


def quanti_type_name(q: int) -> str:
    return model_pb2.QuantiType.Name(q)


def strides_of(shape: Sequence[int], itemsize: int) -> list:
    """Byte strides of a C-contiguous tensor of ``shape``."""
    strides, acc = [], itemsize
    for dim in reversed(list(shape)):
        strides.append(acc)
        acc *= int(dim)
    return list(reversed(strides))


def make_properties(
    name: str,
    shape: Sequence[int],
    tensor_type: int,
    layout: int,
    *,
    scale: Optional[Sequence[float]] = None,
    zero_point: Optional[Sequence[int]] = None,
    axis: int = -1,
    byte_size: Optional[int] = None,
    input_source: int = model_pb2.HB_DNN_INPUT_FROM_DDR,
) -> model_pb2.TensorProperties:
    """TensorProperties of a dense tensor (aligned shape = valid shape).

    The emulated BPU has no padding requirement, so alignedShape equals
    validShape; ``byte_size`` overrides the computed alignedByteSize for
    formats whose bytes are not shape x itemsize (nv12 is H*W*3/2).
    """
    itemsize = NUMPY_DTYPE[tensor_type].itemsize
    size = int(np.prod(shape, dtype=np.int64)) * itemsize if byte_size is None else byte_size
    scaled = scale is not None and len(scale) > 0
    props = model_pb2.TensorProperties(
        name=name,
        valid_shape=list(shape),
        aligned_shape=list(shape),
        tensor_layout=layout,
        tensor_type=tensor_type,
        quanti_type=model_pb2.SCALE if scaled else model_pb2.NONE,
        quantize_axis=axis,
        aligned_byte_size=size,
        stride=strides_of(shape, itemsize) if tensor_type != TT.HB_DNN_IMG_TYPE_NV12 else [0] * len(shape),
        input_source=input_source,
    )
    if scaled:
        props.scale_data.extend(float(s) for s in scale)
        props.zero_point_data.extend(int(z) for z in (zero_point if zero_point is not None else [0] * len(scale)))
    return props


# --- wire format ---------------------------------------------------------

#: The dtype names a wire tensor may carry: numbers only (no objects, strings, records).
WIRE_DTYPES = {d.name: d for d in map(np.dtype, ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                                                 "int64", "uint64", "float16", "float32", "float64"))}
#: onnxruntime's type strings (NodeArg.type) for the same dtypes: "tensor(float)" -> float32, ...
_ORT_NAMES = {"float32": "float", "float64": "double"}  # where onnxruntime's name differs from numpy's
ORT_DTYPES = {f"tensor({_ORT_NAMES.get(n, n)})": d for n, d in WIRE_DTYPES.items()}



def to_wire(name: str, array: np.ndarray) -> board_pb2.Tensor:
    # asarray, not ascontiguousarray: that one turns a 0-d array into shape (1,).
    # tobytes() writes C order whatever the strides.
    array = np.asarray(array)
    return board_pb2.Tensor(name=name, dtype=array.dtype.name, shape=array.shape, data=array.tobytes())


def from_wire(t: board_pb2.Tensor) -> np.ndarray:
    """The numpy view of a wire tensor (no copy; read-only)."""
    # A name from the closed list, never np.dtype(<wire text>): numpy parses
    # arbitrary strings as record formats and raises whatever its parser raises.
    dtype = WIRE_DTYPES.get(t.dtype)
    if dtype is None:
        raise InvalidInput(f"tensor '{t.name[:80]}': unknown dtype '{t.dtype[:80]}' "
                           f"(a wire tensor is one of {', '.join(sorted(WIRE_DTYPES))})")
    if any(d < 0 for d in t.shape):
        raise InvalidInput(f"tensor '{t.name[:80]}': negative dimension in shape {list(t.shape)}")
    count = 1
    for d in t.shape:  # Python ints: a huge shape cannot wrap around to a small byte count
        count *= int(d)
    if count * dtype.itemsize != len(t.data):
        raise InvalidInput(
            f"tensor '{t.name}': shape {list(t.shape)} of {dtype.name} needs "
            f"{count * dtype.itemsize} bytes, got {len(t.data)}"
        )
    try:
        return np.frombuffer(t.data, dtype=dtype).reshape(tuple(t.shape))
    except ValueError as exc:  # e.g. an empty tensor with dimensions numpy cannot index
        raise InvalidInput(f"tensor '{t.name[:80]}': shape {list(t.shape)[:8]} is not usable: {exc}") from None
