"""Board API messages <-> runtime objects: the marshalling both ends share.

The host's BoardClient builds requests and reads replies with these; the
daemon's servicer and its data channel read requests and build replies with
the same functions, so the two ends cannot drift apart.
"""
import os
import platform
import socket
import struct
from typing import List, Optional, Sequence

import numpy as np

from bpuemu.common.proto import board_pb2
from bpuemu.common.version import API_VERSION, FORMAT_MAJOR, FORMAT_MINOR, RUNTIME_VERSION, __version__
from bpuemu.common.tensor import (
    WIRE_NAMES, byte_view, from_wire, message_fields, tensor_data, tensor_head, tensor_layout, to_wire, varint,
)
from bpuemu.common.wire import DATA_HEADER, DATA_MAGIC, INFER, REPLY, check_parse_bound
from bpuemu.board.runtime.infer import InferResult
from bpuemu.board.runtime.model import timing as runtime_timing
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport

_PERF_FIELDS = PerfReport.SUMMARY_FIELDS + ("profiler_log", "profiler_csv")


def perf_report_to_proto(r: PerfReport) -> board_pb2.PerfResult:
    return board_pb2.PerfResult(**{f: getattr(r, f) for f in _PERF_FIELDS})


def perf_report_from_proto(p: board_pb2.PerfResult) -> PerfReport:
    return PerfReport(**{f: getattr(p, f) for f in _PERF_FIELDS})


def perf_config_from_request(req: board_pb2.PerfRequest) -> PerfConfig:
    return PerfConfig(
        frame_count=int(req.frame_count),
        perf_time_minutes=float(req.perf_time_minutes),
        thread_num=int(req.thread_num),
        core_id=int(req.core_id),
        profile=bool(req.profile),
    )


def onnxruntime_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


def local_board_info() -> board_pb2.BoardInfo:
    """What this machine reports about itself in the handshake."""
    return board_pb2.BoardInfo(
        api_version=API_VERSION,
        daemon_version=__version__,
        runtime_version=RUNTIME_VERSION,
        format_major=FORMAT_MAJOR,
        format_minor=FORMAT_MINOR,
        onnxruntime_version=onnxruntime_version(),
        arch=platform.machine(),
        hostname=socket.gethostname(),
        python_version=platform.python_version(),
        numpy_version=np.__version__,
        cpu_count=os.cpu_count() or 1,
        timing=runtime_timing(),
    )


def infer_request(sha: str, model_name: str, inputs: Sequence[np.ndarray], input_names: Sequence[str] = (),
                  dump_intermediate: bool = False, frame_count: int = 1, core_id: int = 0) -> board_pb2.InferRequest:
    req, named = _request_fields(sha, model_name, inputs, input_names, dump_intermediate, frame_count, core_id)
    for n, a in named:
        a = np.asarray(a)
        req.inputs.add(name=n, dtype=WIRE_NAMES.get(a.dtype) or a.dtype.name, shape=a.shape,
                       data=a.tobytes())  # one copy, not two
    return req


def _request_fields(sha: str, model_name: str, inputs: Sequence[np.ndarray], input_names: Sequence[str],
                    dump_intermediate: bool, frame_count: int, core_id: int):
    names = list(input_names) or [f"input_{i}" for i in range(len(inputs))]
    req = board_pb2.InferRequest(sha256=sha, model_name=model_name, dump_intermediate=dump_intermediate,
                                 frame_count=frame_count, core_id=core_id)
    return req, zip(names, inputs)


#: Replies under this many bytes are read into the buffer a data channel connection keeps and their
#: tensors copied out (copying small tensors costs less than a buffer per reply); larger ones are read
#: into a buffer of their own, which the outputs view.
ZERO_COPY_BYTES = 64 << 10

_INPUTS = board_pb2.InferRequest.DESCRIPTOR.fields_by_name["inputs"].number
_OUTPUTS = board_pb2.InferReply.DESCRIPTOR.fields_by_name["outputs"].number
_INTERMEDIATES = board_pb2.InferReply.DESCRIPTOR.fields_by_name["intermediates"].number


def request_inputs(req) -> List[np.ndarray]:
    """The input tensors of an InferRequest or a PerfRequest."""
    return [from_wire(t) for t in req.inputs]


def infer_reply(result: InferResult) -> board_pb2.InferReply:
    reply = board_pb2.InferReply(latency_ms=result.latency_ms)
    reply.outputs.extend(to_wire(n, a) for n, a in result.outputs.items())
    reply.intermediates.extend(to_wire(n, a) for n, a in result.intermediates.items())
    return reply


def infer_result(reply: board_pb2.InferReply) -> InferResult:
    return InferResult(
        outputs={t.name: from_wire(t) for t in reply.outputs},
        intermediates={t.name: from_wire(t) for t in reply.intermediates},
        latency_ms=list(reply.latency_ms),
    )


# --- a connection's stream of infer calls (the data channel) ---------------------------------------
#
# The data channel carries InferRequest / InferReply in their protobuf encoding without copying a tensor in
# Python: the sender writes a frame as a list of buffers for one sendmsg (the message's other fields, each
# tensor's header, the arrays' own memory), the receiver finds each tensor's data in the buffer it read and
# views it there. Both ends stay plain protobuf: either may be the ordinary encoder or parser.
#
# A client calls one model with inputs of one form over and over, and the board answers with outputs of one
# form: each call's bytes are the last call's everywhere but in the tensors' data (and the latencies). So
# each end of a connection keeps the bytes around the data from the last call: the sender reuses them, the
# receiver compares them with the last message it parsed and, when they are the same, views the data where
# it was before. A call of another form is encoded, or parsed, in full (tensor_layout, from_wire's checks).

def _frame_heads(kind: int, pieces: Sequence) -> list:
    """The bytes around the varying parts of a frame, [h0, h1, ..., hk]: the frame is h0 v0 h1 v1 ... hk.
    ``pieces``: the payload in order, each fixed bytes or the size (an int > 0) of a varying part."""
    heads, cur, size = [], b"", 0
    for piece in pieces:
        if isinstance(piece, int):
            heads.append(cur)
            cur = b""
            size += piece
        else:
            cur += piece
            size += len(piece)
    heads.append(cur)
    heads[0] = DATA_HEADER.pack(DATA_MAGIC, kind, size) + heads[0]
    return heads


def _tensor_pieces(field: int, name: str, array: np.ndarray) -> list:
    head = tensor_head(field, name, array)
    return [head, array.nbytes] if array.nbytes else [head]


def _interleave(heads: list, varying: list) -> list:
    parts = [heads[0]]
    for v, h in zip(varying, heads[1:]):
        parts.append(v)
        if h:
            parts.append(h)
    return parts


#: Forms of call each end of a connection keeps (a client calling several models in turn, an OCR
#: pipeline's detector, classifier and recogniser, has one form per model).
FORMS_KEPT = 8


def _keep(forms: dict, key, value) -> None:
    """``forms[key] = value``, the oldest form dropped beyond FORMS_KEPT."""
    forms.pop(key, None)
    forms[key] = value
    if len(forms) > FORMS_KEPT:
        del forms[next(iter(forms))]


class RequestFrames:
    """INFER frames for one data channel connection (the client's end), as buffers for one sendmsg: the
    encoded infer_request with its frame header, the inputs' data not copied, the bytes around it kept from
    the last call of the same form (model, names, options, input dtypes and shapes)."""

    def __init__(self):
        self._forms: dict = {}  # form -> the bytes around the inputs' data

    def parts(self, sha: str, model_name: str, inputs: Sequence[np.ndarray], input_names: Sequence[str] = (),
              dump_intermediate: bool = False, frame_count: int = 1, core_id: int = 0) -> list:
        arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in inputs]
        key = (sha, model_name, tuple(input_names), dump_intermediate, frame_count, core_id,
               tuple([(a.dtype, a.shape) for a in arrays]))
        heads = self._forms.get(key)
        if heads is None:
            req, named = _request_fields(sha, model_name, arrays, input_names, dump_intermediate, frame_count, core_id)
            pieces = [req.SerializeToString()]
            for n, a in named:
                pieces += _tensor_pieces(_INPUTS, n, a)
            heads = _frame_heads(INFER, pieces)
            _keep(self._forms, key, heads)
        return _interleave(heads, [a if a.flags.c_contiguous else tensor_data(a) for a in arrays if a.nbytes])


class ReplyFrames:
    """REPLY frames for one data channel connection (the board's end), as buffers for one sendmsg: the
    encoded infer_reply with its frame header, the tensors' data not copied, the bytes around it and the
    latencies kept from the last reply of the same form (tensor names, dtypes and shapes, number of frames)."""

    def __init__(self):
        self._forms: dict = {}  # form -> the bytes around the latencies and the tensors' data

    def parts(self, result: InferResult) -> tuple:
        """(the REPLY frame as buffers, its size in bytes)."""
        tensors = [(_OUTPUTS, n, a if type(a) is np.ndarray else np.asarray(a)) for n, a in result.outputs.items()]
        if result.intermediates:
            tensors += [(_INTERMEDIATES, n, np.asarray(a)) for n, a in result.intermediates.items()]
        latency = result.latency_ms
        key = (tuple([(f, n, a.dtype, a.shape) for f, n, a in tensors]), len(latency))
        form = self._forms.get(key)
        if form is None:
            frames = len(latency)
            pieces = [_LATENCY_KEY + varint(8 * frames), 8 * frames] if frames else []
            for f, n, a in tensors:
                pieces += _tensor_pieces(f, n, a)
            heads = _frame_heads(REPLY, pieces)
            size = sum(len(h) for h in heads) + 8 * frames + sum(a.nbytes for _, _, a in tensors)
            form = heads, size, struct.Struct(f"<{frames}d") if frames else None
            _keep(self._forms, key, form)
        heads, size, doubles = form
        varying = [a if a.flags.c_contiguous else tensor_data(a) for _, _, a in tensors if a.nbytes]
        if doubles is not None:
            varying.insert(0, doubles.pack(*latency))
        return _interleave(heads, varying), size


_LATENCY = board_pb2.InferReply.DESCRIPTOR.fields_by_name["latency_ms"].number
_LATENCY_KEY = bytes([_LATENCY << 3 | 2])


class _StreamParser:
    """Messages of one class with tensors, from one connection: a message whose bytes are those of one
    parsed before (of the same size) everywhere but in its tensors' data (and, for a reply, its latencies)
    reuses that parse."""

    def __init__(self, message_class, tensor_fields: Sequence[int], packed_doubles: Optional[int] = None,
                 bounded: bool = False):
        self.message_class, self.tensor_fields, self.packed_doubles = message_class, tensor_fields, packed_doubles
        self.bounded = bounded  # a message of a new form is parsed only within bpuemu.common.wire's parse bound
        # size -> (the message without its tensors, [(start, stop, bytes)] around the varying parts,
        #          [(field, name, start, dtype, shape)] of the tensors,
        #          (start, their struct) of the doubles or None)
        self._forms: dict = {}
        # (view, message, fixed, tensors) of the last message parsed without copies: a reader that reads each
        # call into the same place of its buffer gives the same view (FrameReader.payload), whose arrays stay.
        self._last: Optional[tuple] = None

    def parse(self, view: memoryview, copy: bool) -> tuple:
        """(the message without its tensors, [(field, name, array)], the packed doubles or None).
        ``copy``: the arrays own their data, all in one copy of ``view`` (else they view ``view``)."""
        last = self._last
        if last is not None and last[0] is view:
            for start, stop, ref in last[2]:
                if bytes(view[start:stop]) != ref:  # a memoryview compares item by item: 3x slower
                    break
            else:
                return last[1], last[3], None  # a message with doubles is not kept so
        form = self._forms.get(len(view))
        if form is not None:
            message, fixed, layout, packed = form
            data = bytearray(view) if copy else view
            for start, stop, ref in fixed:
                if data[start:stop] != ref:
                    break
            else:
                tensors = [(field, name, np.ndarray(shape, dtype, data, start))
                           for field, name, start, dtype, shape in layout]
                if packed is not None:
                    return message, tensors, list(packed[1].unpack_from(data, packed[0]))
                if not copy:
                    self._last = (view, message, fixed, tensors)
                return message, tensors, None
        return self._full(view, copy)

    def _full(self, view: memoryview, copy: bool) -> tuple:
        if self.bounded:  # MessageTooLarge (a ValueError) for a request whose parse would grow past its bound
            check_parse_bound(self.message_class, view)
        message, where = tensor_layout(view, self.message_class, self.tensor_fields)
        tensors, layout, varying = [], [], []
        for field in self.tensor_fields:
            for t, start, stop in where[field]:
                a = from_wire(t, view[start:stop])
                layout.append((field, t.name, start, a.dtype, a.shape))
                tensors.append((field, t.name, a.copy() if copy else a))
                varying.append((start, stop))
        doubles = packed = None
        if self.packed_doubles is not None:
            doubles = list(getattr(message, self.message_class.DESCRIPTOR.fields_by_number[self.packed_doubles].name))
            found = [(p, e) for f, _, _, p, e in message_fields(view, 0, len(view)) if f == self.packed_doubles]
            if doubles and (len(found) != 1 or found[0][1] - found[0][0] != 8 * len(doubles)):
                return message, tensors, doubles  # not one packed field: parsed, not kept
            if doubles:
                varying.append(found[0])
                packed = (found[0][0], struct.Struct(f"<{len(doubles)}d"))
        fixed, at = [], 0
        for start, stop in sorted(varying):
            if start > at:
                fixed.append((at, start, bytes(view[at:start])))
            at = stop
        if at < len(view):
            fixed.append((at, len(view), bytes(view[at:])))
        _keep(self._forms, len(view), (message, fixed, layout, packed))
        return message, tensors, doubles


class RequestParser:
    """Encoded InferRequests of one data channel connection (the board's end): the inputs are views of the
    buffer, the request's other fields parsed once for a stream of calls of one form."""

    def __init__(self):
        self._parser = _StreamParser(board_pb2.InferRequest, (_INPUTS,), bounded=True)
        self._call: Optional[tuple] = None  # (request, its tensors, call) of the last call

    def parse(self, buf) -> tuple:
        """(the InferRequest without its inputs, the inputs viewed in ``buf``); ValueError or DecodeError
        for a malformed request."""
        flat = type(buf) is memoryview and buf.format == "B" and buf.ndim == 1  # a reader's payload, as it is
        request, tensors, _ = self._parser.parse(buf if flat else byte_view(buf), copy=False)
        return request, [a for _, _, a in tensors]

    def call(self, buf) -> tuple:
        """(sha256, model_name, frame_count, dump_intermediate, inputs) of an encoded InferRequest, as parse
        reads it; a call read into the same place as the last one, of its form, gets the same tuple (its
        inputs view the new data)."""
        flat = type(buf) is memoryview and buf.format == "B" and buf.ndim == 1
        request, tensors, _ = self._parser.parse(buf if flat else byte_view(buf), copy=False)
        last = self._call
        if last is not None and last[0] is request and last[1] is tensors:
            return last[2]
        call = (request.sha256, request.model_name, request.frame_count, request.dump_intermediate,
                [a for _, _, a in tensors])
        self._call = (request, tensors, call)
        return call


class ReplyParser:
    """Encoded InferReplies of one data channel connection (the client's end), as InferResults."""

    def __init__(self):
        self._parser = _StreamParser(board_pb2.InferReply, (_OUTPUTS, _INTERMEDIATES), packed_doubles=_LATENCY)

    def parse(self, buf, copy: bool) -> InferResult:
        """The InferResult of an encoded InferReply; ``copy``: its tensors own their data (else they view
        ``buf``, which they keep alive)."""
        reply, tensors, latency = self._parser.parse(buf if type(buf) is memoryview and buf.format == "B"
                                                     and buf.ndim == 1 else byte_view(buf), copy)
        outputs, intermediates = {}, {}
        for f, n, a in tensors:
            (outputs if f == _OUTPUTS else intermediates)[n] = a
        return InferResult(outputs, intermediates, latency if latency is not None else list(reply.latency_ms))
