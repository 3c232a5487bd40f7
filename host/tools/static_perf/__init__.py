"""hb_perf: static performance analysis of a `.bin` model.

    est = estimate_model(model, blobs)          # per BPU subgraph and per layer
    estimate_line(model, blobs)                 # "FPS=…, latency = … us, DDR = … bytes" (makertbin)
    files = analyze(binfile, "hb_perf_result")  # the seed's folder, one subfolder per model

The cost model is in ``x5`` (its docstring has every formula and parameter),
the compile_mode / optimize_level it is costed for in ``strategy``,
the per-layer analysis of the ONNX pieces in ``layers``, the drawing in
``structure``, the result folder (pages, PNG, DOT, JSON) in ``result_folder`` and
``--compare`` in ``compare``.
"""
import dataclasses
import os
from typing import List, Optional

from bpuemu.common.atomic import staged_dir
from bpuemu.common.container import BinFile
from bpuemu.host.tools.static_perf.estimate import ModelEstimate, SubgraphEstimate, estimate_line, estimate_model, is_debug_build
from bpuemu.host.tools.static_perf.result_folder import ReportFiles, write_report
from bpuemu.host.tools.static_perf.strategy import CompileStrategy, strategy_of
from bpuemu.host.tools.static_perf.structure import structure
from bpuemu.host.tools.static_perf.x5 import X5_BPU, X5Bpu

__all__ = ["X5Bpu", "X5_BPU", "ModelEstimate", "SubgraphEstimate", "ReportFiles", "estimate_model", "estimate_line",
           "is_debug_build", "analyze", "RESULT_DIR", "CompileStrategy", "strategy_of"]

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
            files = write_report(est, structure(m), work, is_debug_build(m))
        out.append(_moved(files, work, os.path.abspath(final)))
    return out


def _moved(files: ReportFiles, old: str, new: str) -> ReportFiles:
    """``files`` with the paths under ``old`` pointing under ``new``."""
    def move(p: str) -> str:
        return os.path.join(new, os.path.relpath(p, old))

    return dataclasses.replace(files, directory=new, html=move(files.html), png=move(files.png), dot=move(files.dot),
                               subgraph_html=[move(p) for p in files.subgraph_html],
                               subgraph_json=[move(p) for p in files.subgraph_json])
