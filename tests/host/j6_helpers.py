"""Builders for the J6 tests: tiny float models (onnx.helper), calibration data, hb_compile yaml configs,
and a pipeline-level conversion for the quant_config and FAQ tests."""
import os
from typing import Dict, Optional, Sequence

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from bpuemu.host.convert.caldata import CalInput
from bpuemu.host.convert.pipeline import ConvertJob, JobInput, run
from bpuemu.host.convert.preprocess import InputPreprocess
from bpuemu.host.quant import QuantOptions

from makertbin_helpers import write_cal_dir


def conv_model(path: str, shape=(1, 3, 8, 8), relu_tail: bool = False, opset: int = 13, ir_version: int = 8,
               input_name: str = "data", matmul: bool = False, seed: int = 0) -> str:
    """data -> Conv(3->4) -> Relu -> Conv(4->2) [-> Relu] [-> Reshape -> MatMul]: a tiny NCHW CNN."""
    rng = np.random.default_rng(seed)
    c = shape[1]
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, c, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.normal(0, 0.5, (2, 4, 1, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.normal(0, 0.1, (2,)).astype(np.float32), "b2")]
    nodes = [helper.make_node("Conv", [input_name, "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2")]
    out, out_shape = "c2", [shape[0], 2, shape[2], shape[3]]
    if relu_tail:
        nodes.append(helper.make_node("Relu", ["c2"], ["r2"], name="relu_tail"))
        out = "r2"
    if matmul:
        hw = shape[2] * shape[3]
        inits += [numpy_helper.from_array(np.array([shape[0], 2, hw], np.int64), "rs"),
                  numpy_helper.from_array(rng.normal(0, 0.2, (hw, 5)).astype(np.float32), "wm")]
        nodes += [helper.make_node("Reshape", [out, "rs"], ["flat"], name="reshape"),
                  helper.make_node("MatMul", ["flat", "wm"], ["mm"], name="matmul")]
        out, out_shape = "mm", [shape[0], 2, 5]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    onnx.save(model, path)
    return path


def cal_dir(directory: str, shapes: Dict[str, Sequence[int]], samples: int = 3, seed: int = 0,
            dtype=np.float32) -> Dict[str, str]:
    """One directory of .npy samples per input; returns input name -> directory."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        d = os.path.join(directory, f"cal_{name}")
        os.makedirs(d, exist_ok=True)
        for i in range(samples):
            np.save(os.path.join(d, f"{i}.npy"), rng.normal(0, 1, shape).astype(dtype))
        out[name] = d
    return out


def write_yaml(path: str, model: str, march: str = "nash-e", prefix: str = "tiny", inputs: Optional[Dict[str, dict]] = None,
               calibration: Optional[dict] = None, compiler: Optional[dict] = None, model_extra: Optional[dict] = None,
               input_extra: Optional[dict] = None) -> str:
    """An hb_compile yaml: the four groups; ``inputs``: name -> per-input values (featuremap by default)."""
    inputs = inputs or {"data": {}}
    names = list(inputs)
    per = {k: ";".join(str(inputs[n].get(k, d)) for n in names)
           for k, d in (("input_type_train", "featuremap"), ("input_type_rt", "featuremap"),
                        ("norm_type", "no_preprocess"))}
    shapes = [inputs[n].get("input_shape") for n in names]
    ip = {"input_name": ";".join(names), **per}
    if any(shapes):
        ip["input_shape"] = ";".join(s or "None" for s in shapes)
    ip.update(input_extra or {})
    cal = {"calibration_type": "default"}
    dirs = [inputs[n].get("cal_data_dir") for n in names]
    if any(dirs):
        cal["cal_data_dir"] = ";".join(dirs)
    cal.update(calibration or {})
    doc = {
        "model_parameters": {"onnx_model": model, "march": march, "output_model_file_prefix": prefix,
                             "working_dir": "model_output", **(model_extra or {})},
        "input_parameters": ip,
        "calibration_parameters": cal,
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O2", **(compiler or {})},
    }
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def tiny_project(tmp, march: str = "nash-e", **model_kw) -> str:
    """A tiny conv model, 3 calibration samples and its hb_compile yaml in ``tmp``; returns the yaml's path."""
    tmp = str(tmp)
    model = conv_model(os.path.join(tmp, "tiny.onnx"), **model_kw)
    shape = model_kw.get("shape", (1, 3, 8, 8))
    cal = cal_dir(tmp, {"data": shape})
    return write_yaml(os.path.join(tmp, "config.yaml"), model, march, inputs={"data": {"cal_data_dir": cal["data"]}})


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


# --- the FAQ's example models (ptq_faq_j6), shared by the pipeline-level and the hb_compile tests ---

def scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, np.float32), name)


def ends_in_conv(relu: bool) -> onnx.ModelProto:
    """int32 case 1: x -> Conv -> Relu -> Conv (conv_tail) [-> Relu (relu_tail)] -> y."""
    ns = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv_1", pads=[1, 1, 1, 1]),
          helper.make_node("Relu", ["c1"], ["r1"], name="relu_1"),
          helper.make_node("Conv", ["r1", "w2"], ["c2" if relu else "y"], name="conv_tail", pads=[1, 1, 1, 1])]
    if relu:
        ns.append(helper.make_node("Relu", ["c2"], ["y"], name="relu_tail"))
    bias = numpy_helper.from_array(np.linspace(-0.5, 0.5, 8).astype(np.float32), "b1")
    return model_of(ns, {"x": [1, 3, 8, 8]}, ["y"], [weight("w1", (8, 3, 3, 3), 1), bias, weight("w2", (4, 8, 3, 3), 2)])


def int32_mul() -> onnx.ModelProto:
    """int32 case 2: a Mul whose two inputs are int32 in the model."""
    return model_of([helper.make_node("Mul", ["a", "b"], ["y"], name="mul")], {"a": [1, 4, 8, 8], "b": [1, 4, 8, 8]},
                    ["y"], input_types={"a": TensorProto.INT32, "b": TensorProto.INT32})


def argmax(cast_to=None) -> onnx.ModelProto:
    """int32 case 3, the FAQ's export with onnx.helper at opset 11: argmax(x, dim=1) over a 1x3xHxW input
    [.to(cast_to)]."""
    ns = [helper.make_node("ArgMax", ["input"], ["idx" if cast_to else "output"], name="argmax", axis=1, keepdims=0)]
    if cast_to:
        ns.append(helper.make_node("Cast", ["idx"], ["output"], name="cast", to=cast_to))
    return model_of(ns, {"input": [1, 3, 16, 16]}, ["output"], opset=11)


def where_neg_inf() -> onnx.ModelProto:
    """Calibrated Cosine nan, case 1: the second input of Where is -Inf (an attention mask)."""
    return model_of([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                     helper.make_node("Greater", ["c", "zero"], ["keep"], name="greater"),
                     helper.make_node("Where", ["keep", "neg_inf", "c"], ["masked"], name="where"),
                     helper.make_node("Softmax", ["masked"], ["y"], name="softmax", axis=1)],
                    {"x": [1, 3, 8, 8]}, ["y"], [weight("w", (4, 3, 3, 3)), scalar("zero", 0.0),
                                                    scalar("neg_inf", -np.inf)])


def conv_reshape_concat(size: int = 8) -> onnx.ModelProto:
    """unitconv: the FAQ's conv+reshape+concat model output, two Conv heads reshaped and concatenated
    (a ``size`` x ``size`` input)."""
    shape = numpy_helper.from_array(np.array([1, 4, size * size, 1], np.int64), "shape")
    return model_of([helper.make_node("Conv", ["x", "w0"], ["f"], name="conv_body", pads=[1, 1, 1, 1]),
                     helper.make_node("Relu", ["f"], ["r"], name="relu_body"),
                     helper.make_node("Conv", ["r", "wa"], ["ca"], name="conv_a", pads=[1, 1, 1, 1]),
                     helper.make_node("Conv", ["r", "wb"], ["cb"], name="conv_b", pads=[1, 1, 1, 1]),
                     helper.make_node("Reshape", ["ca", "shape"], ["ra"], name="reshape_a"),
                     helper.make_node("Reshape", ["cb", "shape"], ["rb"], name="reshape_b"),
                     helper.make_node("Concat", ["ra", "rb"], ["y"], name="concat", axis=2)],
                    {"x": [1, 3, size, size]}, ["y"], [weight("w0", (8, 3, 3, 3), 1), weight("wa", (4, 8, 3, 3), 2),
                                                       weight("wb", (4, 8, 3, 3), 3), shape])


def transpose_between_convs() -> onnx.ModelProto:
    """A passive Transpose between two Convs (quant_config qtype on it alone does not take effect)."""
    return model_of([helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv_1", pads=[1, 1, 1, 1]),
                     helper.make_node("Transpose", ["c1"], ["t"], name="transpose", perm=[0, 1, 3, 2]),
                     helper.make_node("Conv", ["t", "w2"], ["y"], name="conv_2")],
                    {"x": [1, 3, 8, 8]}, ["y"], [weight("w1", (8, 3, 3, 3), 1), weight("w2", (4, 8, 1, 1), 2)])
