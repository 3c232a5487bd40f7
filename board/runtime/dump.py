"""--enable_dump and --dump_intermediate: writing tensors as .bin or .txt files.

Output files:   <model>_output_<i>_<name>.bin|.txt
Intermediates:  layer-<k>-<bpu|cpu>-<step>-<input|output>-<j>-<tensor>.bin|.txt
(the layer naming of the real tool's dump_intermediate). In .txt files each
line holds the values of the dimensions after ``txt_axis``.
"""
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from bpuemu.common.atomic import atomic_output, write_file_atomic
from bpuemu.common.proto import model_pb2

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe(name: str) -> str:
    return _UNSAFE.sub("_", name)[:120]


def write_tensor(path_no_ext: str, array: np.ndarray, fmt: str, precision: int, txt_axis: int) -> str:
    array = np.asarray(array)
    if fmt == "bin":
        path = path_no_ext + ".bin"
        write_file_atomic(path, np.ascontiguousarray(array).tobytes())
        return path
    path = path_no_ext + ".txt"
    if array.ndim == 0:
        rows = array.reshape(1, 1)
    else:
        axis = txt_axis if 0 <= txt_axis < array.ndim else array.ndim - 1
        rows = array.reshape(int(np.prod(array.shape[:axis], dtype=np.int64)) if axis else 1, -1)
    fmt_str = "%d" if np.issubdtype(array.dtype, np.integer) else f"%.{precision}f"
    with atomic_output(path, "wb") as f:
        np.savetxt(f, rows, fmt=fmt_str, delimiter=" ")
    return path


def output_stem(model_name: str, index: int, tensor: str) -> str:
    """The dump file name (without extension) of model output ``index``."""
    return f"{safe(model_name)}_output_{index}_{safe(tensor)}"


def layer_stem(k: int, step: model_pb2.PlanStep, role: str, j: int, tensor: str) -> str:
    """The dump file name (without extension) of ``tensor``, the ``j``-th ``role`` ("input" or
    "output") of plan step ``k`` (the real tool's dump_intermediate layer naming)."""
    proc = "bpu" if step.kind == model_pb2.PlanStep.BPU_SUBGRAPH else "cpu"
    return f"layer-{k}-{proc}-{safe(step.name)}-{role}-{j}-{safe(tensor)}"


def dump_outputs(out_dir: str, model_name: str, outputs: Dict[str, np.ndarray], fmt: str, precision: int,
                 txt_axis: int) -> Dict[str, List[str]]:
    """Write every output; returns output name -> the files written."""
    os.makedirs(out_dir, exist_ok=True)
    return {name: [write_tensor(os.path.join(out_dir, output_stem(model_name, i, name)), arr, fmt, precision, txt_axis)]
            for i, (name, arr) in enumerate(outputs.items())}


def dump_aliases(model: model_pb2.Model) -> Dict[str, str]:
    """Plan tensor -> the name dumps give it.

    A Preprocess compiled into its subgraph (``fused_into_subgraph``) passes the
    input_type_rt data on as ``rt:<input>``; dumps name it after the model input
    it stands for, and hold that model input, as when the step converted it.
    """
    return {s.outputs[0]: model.input_specs[s.input_index].plan_tensor for s in model.plan
            if s.kind == model_pb2.PlanStep.PREPROCESS and s.fused_into_subgraph}


def dump_intermediate(out_dir: str, model: model_pb2.Model, tensors: Dict[str, np.ndarray], level: int,
                      precision: int, txt_axis: int) -> Dict[str, List[str]]:
    """Level 1: .bin files; 2 and 3: .bin and .txt files. Returns tensor name -> the files written."""
    os.makedirs(out_dir, exist_ok=True)
    formats = ["bin"] if level == 1 else ["bin", "txt"]
    aliases = dump_aliases(model)
    written: Dict[str, List[str]] = {}
    for k, step in enumerate(model.plan):
        for role, names in (("input", step.inputs), ("output", step.outputs)):
            for j, name in enumerate(aliases.get(n, n) for n in names):
                if name not in tensors:
                    continue
                base = os.path.join(out_dir, layer_stem(k, step, role, j, name))
                written.setdefault(name, []).extend(
                    write_tensor(base, tensors[name], fmt, precision, txt_axis) for fmt in formats)
    return written


@dataclass
class DumpConfig:
    """Which dumps an infer writes (hrt_model_exec's --enable_dump, --dump_format, --dump_precision,
    --dump_txt_axis, --dump_intermediate)."""

    outputs: bool = False
    fmt: str = "bin"
    precision: int = 9
    txt_axis: int = -1
    intermediate: int = 0  # 0 off, 1 bin, 2/3 bin and txt

    def write(self, out_dir: str, model: model_pb2.Model, model_name: str, result
              ) -> Tuple[Dict[str, List[str]], Dict[str, List[str]]]:
        """(output -> files, tensor -> files) of the dumps asked for, written into ``out_dir``."""
        outputs = dump_outputs(out_dir, model_name, result.outputs, self.fmt, self.precision, self.txt_axis) \
            if self.outputs else {}
        inter = dump_intermediate(out_dir, model, result.intermediates, self.intermediate, self.precision,
                                  self.txt_axis) if self.intermediate else {}
        return outputs, inter
