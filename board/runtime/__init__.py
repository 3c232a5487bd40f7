"""The emulated BPU runtime: load `.bin` files, report tensor properties, run models.

The same code is the board's runtime (behind hrt_boardd, or hrt_model_exec on
the board) and the host's x86 simulator (imported in-process), so a
simulator-vs-board difference is a transport, platform or version difference,
never a second implementation.

    rt = Runtime()
    rt.load(["model.bin"])
    m = rt.model()                  # or rt.model("name")
    m.input_properties              # hbDNNTensorProperties of each input
    outputs = m.run([nv12_bytes])   # input_type_rt form, model input order
"""
import os
from typing import Dict, Iterable, List, Optional, Union

from bpuemu.common.container import BinFile, read_bin, select_model
from bpuemu.common.errors import InvalidInput
from bpuemu.board.runtime.infer import InferResult, run_frames
from bpuemu.board.runtime.model import LoadedModel
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport, run_perf

__all__ = ["Runtime", "LoadedModel", "InferResult", "run_frames", "PerfConfig", "PerfReport", "run_perf"]


class Runtime:
    """Models loaded from one or more `.bin` files (hbDNNInitializeFromFiles)."""

    def __init__(self, intra_op_threads: int = 1):
        self.intra_op_threads = intra_op_threads
        self.models: Dict[str, LoadedModel] = {}
        self.files: List[BinFile] = []

    def load(self, sources: Iterable[Union[str, os.PathLike, BinFile]]) -> List[str]:
        """Load every model of every file; returns the names loaded."""
        if isinstance(sources, (str, os.PathLike, BinFile)):
            sources = [sources]
        loaded = []
        for src in sources:
            binfile = src if isinstance(src, BinFile) else read_bin(src)
            for m in binfile.manifest.models:
                if m.name in self.models:
                    raise InvalidInput(f"model name '{m.name}' appears twice in the given model files")
                self.models[m.name] = LoadedModel(m, binfile.blobs, self.intra_op_threads)
                loaded.append(m.name)
            self.files.append(binfile)
        return loaded

    @property
    def model_names(self) -> List[str]:
        return list(self.models)

    def model(self, name: Optional[str] = None) -> LoadedModel:
        """The loaded model called ``name``; with no name, the only one (NotFound otherwise)."""
        return select_model(self.models, name, "the loaded model files")
