"""Board API messages <-> runtime objects: the marshalling both ends share.

The host's BoardClient builds requests and reads replies with these; the
daemon's servicer and its data channel read requests and build replies with
the same functions, so the two ends cannot drift apart.
"""
import os
import platform
import socket
from typing import List, Sequence

import numpy as np

from bpuemu.common.proto import board_pb2
from bpuemu.common.version import API_VERSION, FORMAT_MAJOR, FORMAT_MINOR, RUNTIME_VERSION, __version__
from bpuemu.common.tensor import WIRE_NAMES, from_wire, split_tensors, tensor_parts, to_wire
from bpuemu.board.runtime.infer import InferResult
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


#: Below this many bytes of tensors a message is built and parsed by protobuf itself: copying
#: small tensors costs less than handling them one by one in Python.
ZERO_COPY_BYTES = 64 << 10

_INPUTS = board_pb2.InferRequest.DESCRIPTOR.fields_by_name["inputs"].number
_OUTPUTS = board_pb2.InferReply.DESCRIPTOR.fields_by_name["outputs"].number
_INTERMEDIATES = board_pb2.InferReply.DESCRIPTOR.fields_by_name["intermediates"].number


def infer_request_parts(sha: str, model_name: str, inputs: Sequence[np.ndarray], input_names: Sequence[str] = (),
                        dump_intermediate: bool = False, frame_count: int = 1, core_id: int = 0) -> list:
    """infer_request's encoding as buffers for one sendmsg, the inputs' data not copied (the data channel)."""
    inputs = [np.asarray(a) for a in inputs]
    if sum(a.nbytes for a in inputs) < ZERO_COPY_BYTES:
        return [infer_request(sha, model_name, inputs, input_names, dump_intermediate, frame_count, core_id)
                .SerializeToString()]
    req, named = _request_fields(sha, model_name, inputs, input_names, dump_intermediate, frame_count, core_id)
    parts = [req.SerializeToString()]
    for n, a in named:
        parts += tensor_parts(_INPUTS, n, a)
    return parts


def request_from_buffer(buf) -> tuple:
    """(the InferRequest without its inputs, the inputs viewed in ``buf``) of an encoded InferRequest."""
    if len(buf) < ZERO_COPY_BYTES:
        req = board_pb2.InferRequest.FromString(buf)
        inputs = request_inputs(req)
        del req.inputs[:]
        return req, inputs
    req, tensors = split_tensors(buf, board_pb2.InferRequest, (_INPUTS,))
    return req, [from_wire(t, data) for t, data in tensors[_INPUTS]]


def infer_reply_parts(result: InferResult) -> list:
    """infer_reply's encoding as buffers for one sendmsg, the tensors' data not copied (the data channel)."""
    named = ((_OUTPUTS, result.outputs), (_INTERMEDIATES, result.intermediates))
    if sum(np.asarray(a).nbytes for _, tensors in named for a in tensors.values()) < ZERO_COPY_BYTES:
        return [infer_reply(result).SerializeToString()]
    parts = [board_pb2.InferReply(latency_ms=result.latency_ms).SerializeToString()]
    for field, tensors in named:
        for n, a in tensors.items():
            parts += tensor_parts(field, n, a)
    return parts


def infer_result_from_buffer(buf) -> InferResult:
    """infer_result of an encoded InferReply, its tensors viewed in ``buf`` (which they keep alive)."""
    if len(buf) < ZERO_COPY_BYTES:
        return infer_result(board_pb2.InferReply.FromString(buf))
    reply, tensors = split_tensors(buf, board_pb2.InferReply, (_OUTPUTS, _INTERMEDIATES))
    return InferResult(outputs={t.name: from_wire(t, data) for t, data in tensors[_OUTPUTS]},
                       intermediates={t.name: from_wire(t, data) for t, data in tensors[_INTERMEDIATES]},
                       latency_ms=list(reply.latency_ms))


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
