"""Tiny featuremap models and a pipeline-level conversion for the J6 quant_config and FAQ tests."""
import os
from typing import Dict, Optional, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.host.convert.caldata import CalInput
from bpuemu.host.convert.pipeline import ConvertJob, JobInput, run
from bpuemu.host.convert.preprocess import InputPreprocess
from bpuemu.host.quant import QuantOptions

from makertbin_helpers import write_cal_dir


def weight(name: str, shape, seed: int = 0, scale: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32), name)


def model_of(nodes, inputs: Dict[str, Sequence[int]], outputs: Sequence[str], inits=(), opset: int = 13,
             input_types: Optional[Dict[str, int]] = None) -> onnx.ModelProto:
    """A model of ``nodes``; output types and shapes come from shape inference."""
    types = input_types or {}
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), list(s))
                                       for n, s in inputs.items()],
                          [helper.make_empty_tensor_value_info(o) for o in outputs], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    by_name = {vi.name: vi for vi in inferred.graph.value_info}
    for o in m.graph.output:
        o.CopyFrom(by_name[o.name])
    return m


def convert(tmp_path, model: onnx.ModelProto, march: str = "nash-e", quant_config=None, samples: int = 4,
            calibration_type: str = "max", name: str = "m", seed: int = 0, data=None):
    """Run the pipeline on ``model`` (featuremap inputs, ``samples`` random calibration samples)."""
    d = os.path.join(str(tmp_path), name)
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    inputs = []
    for vi in model.graph.input:
        shape = tuple(x.dim_value for x in vi.type.tensor_type.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        arrays = (data or {}).get(vi.name) or [
            (rng.standard_normal(shape) * 2).astype(dtype) if np.dtype(dtype).kind == "f"
            else rng.integers(-20, 20, shape).astype(dtype) for _ in range(samples)]
        cal = write_cal_dir(os.path.join(d, f"cal_{vi.name}"), arrays)
        pre = InputPreprocess(name=vi.name, input_type_rt="featuremap", input_type_train="featuremap",
                              input_layout_train="NCHW")
        inputs.append(JobInput(pre=pre, shape=shape, input_layout_rt="NCHW",
                               cal=CalInput(vi.name, cal, shape, np.dtype(dtype).name)))
    path = os.path.join(d, f"{name}.onnx")
    onnx.save(model, path)
    job = ConvertJob(onnx_model=path, output_model_file_prefix=name, working_dir=os.path.join(d, "out"),
                     inputs=inputs, quant_options=QuantOptions(calibration_type=calibration_type), march=march,
                     optimize_level="O2" if march.startswith("nash") else "O3", quant_config=quant_config)
    return run(job), job


def nodes(art) -> Dict[str, object]:
    """Node name -> its NodePlacement (ON, output_dtype, qtype_note, cosine_note) from a conversion."""
    return {n.name: n for n in art.nodes}


def bin_devices(path: str) -> Dict[str, str]:
    """Source node -> "BPU" / "CPU" as the compiled `.bin`'s plan runs it."""
    from bpuemu.common.container import read_bin
    from bpuemu.common.proto import model_pb2

    out = {}
    for step in read_bin(path).model().plan:
        for n in step.source_nodes:
            out[n] = "BPU" if step.kind == model_pb2.PlanStep.BPU_SUBGRAPH else "CPU"
    return out
