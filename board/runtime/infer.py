"""Inference: frames run one after another on a loaded model.

What hrt_model_exec infer does in-process, and what the daemon runs for its
Infer method and its data channel: the same frame loop, so a board and the
x86 simulator time and return frames alike.
"""
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from bpuemu.board.runtime.model import LoadedModel


@dataclass
class InferResult:
    """Outputs by name, every intermediate tensor (when asked for), and each frame's latency."""

    outputs: Dict[str, np.ndarray]
    intermediates: Dict[str, np.ndarray] = field(default_factory=dict)
    latency_ms: List[float] = field(default_factory=list)


def run_frames(model: LoadedModel, inputs: Sequence[np.ndarray], frame_count: int = 1, dump_intermediate: bool = False,
               is_active: Optional[Callable[[], bool]] = None,
               on_frame: Optional[Callable[[], None]] = None) -> InferResult:
    """Run ``frame_count`` (at least 1) frames of the same inputs; the last frame's
    outputs (and, with ``dump_intermediate``, its intermediate tensors) are returned.

    ``on_frame`` is called after each frame; when ``is_active`` turns false (the
    caller went away) the loop stops and the result holds the latencies only.
    """
    frames = max(1, frame_count)
    if frames == 1 and not dump_intermediate:   # the usual call (a data channel infer): one frame, no loop around it
        t0 = time.perf_counter()
        outputs = model.run(inputs)
        latency_ms = (time.perf_counter() - t0) * 1e3
        if on_frame is not None:
            on_frame()
        return InferResult(model.output_by_name(outputs), {}, [latency_ms])
    latencies: List[float] = []
    result = None
    if dump_intermediate:
        model.open_pieces()   # the dumped frame runs the pieces one by one: their sessions open before its clock
    try:
        for i in range(frames):
            t0 = time.perf_counter()
            result = model.run(inputs, keep_intermediate=dump_intermediate and i == frames - 1)
            latencies.append((time.perf_counter() - t0) * 1e3)
            if on_frame is not None:
                on_frame()
            if is_active is not None and i < frames - 1 and not is_active():  # after the last frame: answered anyway
                return InferResult({}, {}, latencies)
    finally:
        if dump_intermediate:
            model.close_pieces()   # and close after it: the merged session alone stays open
    outputs, intermediates = result if dump_intermediate else (result, {})
    return InferResult(model.output_by_name(outputs), intermediates, latencies)
