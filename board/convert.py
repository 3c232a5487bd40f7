"""Conversions between runtime objects and board API messages (both ends use them)."""
import os
import platform
import socket

import numpy as np

from bpuemu.common.proto import board_pb2
from bpuemu.common.version import API_VERSION, FORMAT_MAJOR, FORMAT_MINOR, RUNTIME_VERSION, __version__
from bpuemu.board.runtime.perf import PerfConfig, PerfReport

_PERF_FIELDS = (
    "thread_num", "frame_count", "run_time_ms", "total_latency_ms", "average_latency_ms",
    "fps", "p50_ms", "p90_ms", "p99_ms", "profiler_log", "profiler_csv", "model_name", "core_id",
)


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
