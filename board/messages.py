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
from bpuemu.common.tensor import from_wire, to_wire
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
    names = list(input_names) or [f"input_{i}" for i in range(len(inputs))]
    req = board_pb2.InferRequest(sha256=sha, model_name=model_name, dump_intermediate=dump_intermediate,
                                 frame_count=frame_count, core_id=core_id)
    for n, a in zip(names, inputs):
        a = np.asarray(a)
        req.inputs.add(name=n, dtype=a.dtype.name, shape=a.shape, data=a.tobytes())  # one copy, not two
    return req


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
