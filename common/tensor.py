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
#: The wire name of each dtype (np.dtype.name is computed anew on each read: ~1 us, more on a busy machine).
WIRE_NAMES = {d: n for n, d in WIRE_DTYPES.items()}
_ORT_NAMES = {"float32": "float", "float64": "double"}  # where onnxruntime's name differs from numpy's
ORT_DTYPES = {f"tensor({_ORT_NAMES.get(n, n)})": d for n, d in WIRE_DTYPES.items()}



def to_wire(name: str, array: np.ndarray) -> board_pb2.Tensor:
    # asarray, not ascontiguousarray: that one turns a 0-d array into shape (1,).
    # tobytes() writes C order whatever the strides.
    array = np.asarray(array)
    return board_pb2.Tensor(name=name, dtype=WIRE_NAMES.get(array.dtype) or array.dtype.name, shape=array.shape,
                            data=array.tobytes())


def from_wire(t: board_pb2.Tensor, data=None) -> np.ndarray:
    """The numpy view of a wire tensor (no copy). ``data``: the tensor's bytes when they were kept
    out of ``t`` (a buffer of a received frame, see tensor_layout); else ``t.data`` (read-only)."""
    # A name from the closed list, never np.dtype(<wire text>): numpy parses
    # arbitrary strings as record formats and raises whatever its parser raises.
    dtype = WIRE_DTYPES.get(t.dtype)
    if dtype is None:
        raise InvalidInput(f"tensor '{t.name[:80]}': unknown dtype '{t.dtype[:80]}' "
                           f"(a wire tensor is one of {', '.join(sorted(WIRE_DTYPES))})")
    shape = tuple(t.shape)
    if any(d < 0 for d in shape):
        raise InvalidInput(f"tensor '{t.name[:80]}': negative dimension in shape {list(shape)}")
    count = 1
    for d in shape:  # Python ints: a huge shape cannot wrap around to a small byte count
        count *= int(d)
    if data is None:
        data = t.data  # each read of a bytes field is a copy: read it once
    if count * dtype.itemsize != len(data):
        raise InvalidInput(
            f"tensor '{t.name}': shape {list(shape)} of {dtype.name} needs "
            f"{count * dtype.itemsize} bytes, got {len(data)}"
        )
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:  # e.g. an empty tensor with dimensions numpy cannot index
        raise InvalidInput(f"tensor '{t.name[:80]}': shape {list(shape)[:8]} is not usable: {exc}") from None


# --- messages with tensors, without copying their data ----------------------
#
# The data channel (bpuemu.common.wire) carries InferRequest / InferReply in their
# protobuf encoding. Built by SerializeToString, a 150 KB input is copied four
# times on its way to the socket (tobytes, into the message, serialising, framing)
# and three more on the board (parsing, and each read of Tensor.data); on a busy
# machine each copy of cold memory costs tens of microseconds. So the sender writes
# the same bytes as a list of buffers (the message's other fields, then each tensor's
# header and the array's own memory) for one sendmsg, and the receiver finds each
# tensor's data in the received buffer and views it there. Both ends stay plain
# protobuf: either side may be the ordinary encoder or parser.

_PB_VARINT, _PB_FIXED64, _PB_LEN, _PB_FIXED32 = 0, 1, 2, 5
_TENSOR_DATA = board_pb2.Tensor.DESCRIPTOR.fields_by_name["data"].number


def varint(n: int) -> bytes:
    """``n`` as a protobuf base-128 varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def tensor_head(field: int, name: str, array: np.ndarray) -> bytes:
    """The bytes before the data of tensor ``name`` (``array``'s dtype and shape) as field ``field`` of its
    message: the field's key and length, the Tensor's name, dtype and shape, the data field's key and length."""
    dtype = WIRE_NAMES.get(array.dtype)  # none for a non-native byte order
    if dtype is None:
        raise InvalidInput(f"tensor '{name[:80]}': dtype {array.dtype.str} cannot be sent "
                           f"(a wire tensor is one of {', '.join(sorted(WIRE_DTYPES))}, native byte order)")
    meta = board_pb2.Tensor(name=name, dtype=dtype, shape=array.shape).SerializeToString()
    data = _key(_TENSOR_DATA, _PB_LEN) + varint(array.nbytes)
    return _key(field, _PB_LEN) + varint(len(meta) + len(data) + array.nbytes) + meta + data


def tensor_data(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` in C order, as a view of its own memory when it has them so (else of a copy)."""
    if not array.flags.c_contiguous:
        array = array.copy()  # C order, as tobytes() would write it (a 0-d array stays 0-d)
    return memoryview(array.reshape(-1)).cast("B")


def _read_varint(buf, pos: int, end: int) -> tuple:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


def message_fields(buf, pos: int, end: int):
    """(field number, wire type, start of the field's key, start of its value, end of its value) of each field."""
    while pos < end:
        start = pos
        key = buf[pos]
        if key < 0x80:  # every field of the board protocol has a one-byte key
            pos += 1
        else:
            key, pos = _read_varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        if wire_type == _PB_LEN:
            length, pos = _read_varint(buf, pos, end)
            stop = pos + length
        elif wire_type == _PB_VARINT:
            _, stop = _read_varint(buf, pos, end)
        elif wire_type == _PB_FIXED64:
            stop = pos + 8
        elif wire_type == _PB_FIXED32:
            stop = pos + 4
        else:
            raise ValueError(f"wire type {wire_type} is not used by the board protocol")
        if stop > end or field == 0:
            raise ValueError("field runs past the end of its message")
        yield field, wire_type, start, pos, stop
        pos = stop


def byte_view(buf) -> memoryview:
    """A flat unsigned-byte view of ``buf``."""
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def tensor_layout(view: memoryview, message_class, tensor_fields: Sequence[int]) -> tuple:
    """Parse ``view`` (the protobuf encoding of a ``message_class``) without copying its tensors' data:
    (the message without the ``tensor_fields``, {field: [(Tensor without data, start, stop)]}), each
    tensor's data being ``view[start:stop]``.

    Raises ValueError on a malformed encoding (protobuf's parser raises DecodeError on the rest).
    """
    rest = bytearray()
    tensors = {f: [] for f in tensor_fields}
    for field, wire_type, start, pos, stop in message_fields(view, 0, len(view)):
        if field not in tensors or wire_type != _PB_LEN:
            rest += view[start:stop]
            continue
        meta = bytearray()
        data = (pos, pos)
        for f, wt, s, p, e in message_fields(view, pos, stop):
            if f == _TENSOR_DATA and wt == _PB_LEN:
                data = (p, e)  # the last one wins, as in protobuf
            else:
                meta += view[s:e]
        tensors[field].append((board_pb2.Tensor.FromString(bytes(meta)), *data))
    return message_class.FromString(bytes(rest)), tensors
