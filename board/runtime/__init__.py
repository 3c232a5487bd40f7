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
from bpuemu.common.errors import InvalidInput, InvalidModelFile
from bpuemu.common.march import DEFAULT_MARCH, MARCHES, march as march_of
from bpuemu.board.runtime.infer import InferResult, run_frames
from bpuemu.board.runtime.model import LoadedModel
from bpuemu.board.runtime.perf_job import PerfConfig, PerfReport, run_perf

__all__ = ["Runtime", "LoadedModel", "InferResult", "run_frames", "PerfConfig", "PerfReport", "run_perf",
           "FOLLOW_MODEL", "WrongMarch", "board_march", "set_board_march", "BOARD_MARCH_ENV"]

#: Runtime(march=FOLLOW_MODEL): the host's simulator, which runs each model on the march it was compiled for.
FOLLOW_MODEL = "model"

#: The march of this process's board (hrt_boardd --march, hrt_model_exec --march in-process).
_BOARD_MARCH = DEFAULT_MARCH


class WrongMarch(InvalidModelFile):
    """A model compiled for another march than the board's."""


#: The board's march in its environment: hrt_model_exec (in-process, as a board's own command run over SSH)
#: and hrt_boardd read it when no --march is given. A board's march is the board's, never the client's.
BOARD_MARCH_ENV = "BPUEMU_BOARD_MARCH"


def set_board_march(name: str) -> str:
    """The march a Runtime made without one runs (``bayes-e`` until set); returns the normalized name."""
    global _BOARD_MARCH
    _BOARD_MARCH = march_of(name).name
    return _BOARD_MARCH


def board_march() -> str:
    return _BOARD_MARCH


def check_march(model_march: str, board: str, model_name: str) -> None:
    """A model runs only on the march it was compiled for: one line naming both otherwise."""
    compiled = model_march or DEFAULT_MARCH   # a .bin made before models named their march: the X5's
    if compiled != board:
        compiled, model_name = compiled[:40], model_name[:80]   # a model is data: what it says is bounded
        suffix = MARCHES[compiled].flow.model_suffix if compiled in MARCHES else "model"
        raise WrongMarch(f"model '{model_name}' was compiled for march {compiled}; this board is {board}",
                         hint=f"run the {suffix} on a {compiled} board (hrt_boardd --march {compiled}, "
                              f"hrt_model_exec --march {compiled}, or {BOARD_MARCH_ENV}={compiled} in the board's "
                              f"environment), or compile it for {board}")


class Runtime:
    """Models loaded from one or more `.bin`/`.hbm` files (hbDNNInitializeFromFiles) on one march.

    ``march``: the board's march (default: this process's, ``set_board_march``); a model compiled for another
    is refused (WrongMarch). ``FOLLOW_MODEL``: the host simulator, running each model on its own march.
    """

    def __init__(self, intra_op_threads: int = 1, march: Optional[str] = None):
        self.march = march if march == FOLLOW_MODEL else march_of(march or _BOARD_MARCH).name
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
                if self.march != FOLLOW_MODEL:
                    check_march(m.march, self.march, m.name)
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
