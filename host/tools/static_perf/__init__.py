"""hb_perf: static performance analysis of a `.bin` model.

    est = estimate_model(model, blobs)          # per plan step, per BPU layer
    estimate_line(model, blobs)                 # "FPS=…, latency = … us, DDR = … bytes" (makertbin)
    annotate(model, blobs)                      # the compile step: store each step's X5 time in the .bin
    files = analyze(binfile, "hb_perf_result")  # the seed's folder, one subfolder per model
    modeled_perf("m.bin", thread_num=2)         # what hrt_model_exec perf on an X5 would show (bench)

The X5 timing model this report reads is below it, in bpuemu.host.compiler.timing
(makertbin runs it too): ``x5`` (its docstring has every formula, its ``PARAMETERS``
table every parameter with its provenance; bench/x5_fit.py fits them),
the compile_mode / optimize_level it is costed for in ``strategy``,
the per-layer analysis of the ONNX pieces in ``layers`` and the estimates in
``estimate``. Here: the drawing in ``structure``, the result folder (pages, PNG,
DOT, JSON) in ``result_folder`` and ``--compare`` in ``compare``.
"""
import dataclasses
import os
from typing import List, Optional

from bpuemu.common.atomic import staged_dir
from bpuemu.common.container import BinFile
from bpuemu.common.container import read_bin
from bpuemu.host.compiler.timing.estimate import (ModelEstimate, StepEstimate, SubgraphEstimate, annotate, estimate_line,
                                                  estimate_model, is_debug_build)
from bpuemu.host.tools.static_perf.result_folder import ReportFiles, write_report
from bpuemu.host.compiler.timing.strategy import CompileStrategy, strategy_of
from bpuemu.host.tools.static_perf.structure import structure
from bpuemu.host.compiler.timing.x5 import PARAMETERS, X5_BPU, X5Bpu

__all__ = ["X5Bpu", "X5_BPU", "PARAMETERS", "ModelEstimate", "SubgraphEstimate", "StepEstimate", "ReportFiles",
           "estimate_model", "estimate_line", "annotate", "modeled_perf", "is_debug_build", "analyze", "RESULT_DIR",
           "CompileStrategy", "strategy_of"]

RESULT_DIR = "hb_perf_result"


def analyze(binfile: BinFile, result_dir: str = RESULT_DIR, model_name: Optional[str] = None,
            bpu: X5Bpu = X5_BPU) -> List[ReportFiles]:
    """Estimate and write ``<result_dir>/<model>/`` for one model (``model_name``) or all of the file's.

    Each model's folder is written aside and replaces the old one whole, only
    once every file of it is written (bpuemu.common.atomic).
    """
    models = [binfile.model(model_name)] if model_name else list(binfile.manifest.models)
    out = []
    for m in models:
        est = estimate_model(m, binfile.blobs, bpu)
        final = os.path.join(result_dir, m.name)
        with staged_dir(final, "hb_perf") as work:
            files = write_report(est, structure(m), work, is_debug_build(m), m.march)
        out.append(_moved(files, work, os.path.abspath(final)))
    return out


def modeled_perf(bin_path: str, thread_num: int = 1, frame_count: int = 200, model_name: Optional[str] = None,
                 bpu: X5Bpu = X5_BPU) -> dict:
    """What the timing model says an X5 shows for ``bin_path`` (recomputed from its plan with ``bpu``):
    hrt_model_exec perf's modeled figures at ``thread_num`` and at 1 thread, and makertbin's line."""
    binfile = read_bin(bin_path)
    model = binfile.model(model_name)
    est = estimate_model(model, binfile.blobs, bpu)
    run = est.modeled(thread_num, frame_count)
    return {"model": model.name, "thread_num": thread_num, "frame_count": frame_count,
            "latency_1thread_ms": run.latency_1thread_ms, "latency_ms": run.latency_ms, "fps": run.fps,
            "estimate_fps": est.fps or 0.0, "estimate_latency_us": est.latency_us, "ddr_bytes": est.ddr_bytes,
            "bpu_ms": run.bpu_ms, "cpu_ms": run.cpu_ms}


def _moved(files: ReportFiles, old: str, new: str) -> ReportFiles:
    """``files`` with the paths under ``old`` pointing under ``new``."""
    def move(p: str) -> str:
        return os.path.join(new, os.path.relpath(p, old))

    return dataclasses.replace(files, directory=new, html=move(files.html), png=move(files.png), dot=move(files.dot),
                               subgraph_html=[move(p) for p in files.subgraph_html],
                               subgraph_json=[move(p) for p in files.subgraph_json])
