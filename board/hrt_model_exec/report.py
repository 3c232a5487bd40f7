"""What hrt_model_exec prints: tensor property blocks, infer summaries."""
from typing import List, Sequence

import numpy as np

from bpuemu.common.proto import model_pb2
from bpuemu.common.tensor import layout_name, quanti_type_name, tensor_type_name

RULE = "-" * 69


def _tuple(values) -> str:
    return "(" + "".join(f"{v}," for v in values) + ")"


def tensor_block(kind: str, index: int, p: model_pb2.TensorProperties) -> List[str]:
    lines = [f"{kind}[{index}]: ", f"name: {p.name}"]
    if kind == "input":
        lines.append(f"input source: {model_pb2.InputSource.Name(p.input_source)}")
    lines += [
        f"valid shape: {_tuple(p.valid_shape)}",
        f"aligned shape: {_tuple(p.aligned_shape)}",
        f"aligned byte size: {p.aligned_byte_size}",
        f"tensor type: {tensor_type_name(p.tensor_type)}",
        f"tensor layout: {layout_name(p.tensor_layout)}",
        f"quanti type: {quanti_type_name(p.quanti_type)}",
        f"stride: {_tuple(p.stride)}",
    ]
    lines.append("scale data: " + "".join(f"{s:g}," for s in p.scale_data))
    if p.quanti_type != model_pb2.NONE:
        lines.append("zero point data: " + "".join(f"{z}," for z in p.zero_point_data))
    lines.append(f"quantizeAxis: {p.quantize_axis}")
    return lines


def model_info_text(models: Sequence[model_pb2.Model], where: str, load_ms: float) -> str:
    out = [f"Load model on {where} cost {load_ms:.3f}ms.",
           f"This model file has {len(models)} model:"]
    out += [f"[{m.name}]" for m in models]
    for m in models:
        out += [RULE, f"[model name]: {m.name}", ""]
        for i, p in enumerate(m.inputs):
            out += tensor_block("input", i, p) + [""]
        for i, p in enumerate(m.outputs):
            out += tensor_block("output", i, p) + [""]
    out.append(RULE)
    return "\n".join(out)


def infer_text(model_name: str, outputs: dict, latencies: Sequence[float], top_k: int = 5) -> str:
    out = [f"infer success: model {model_name}"]
    for i, (name, arr) in enumerate(outputs.items()):
        arr = np.asarray(arr)
        line = f"output[{i}]: name: {name}, shape: {list(arr.shape)}, dtype: {arr.dtype.name}"
        if arr.size:
            line += f", min: {arr.min():.6g}, max: {arr.max():.6g}"
        out.append(line)
        flat = arr.reshape(-1)
        if arr.ndim >= 2 and arr.shape[0] == 1 and flat.size == max(arr.shape) and flat.size > 1:
            top = np.argsort(-flat.astype(np.float64), kind="stable")[:top_k]
            out.append("  top%d: %s" % (len(top), ", ".join(f"{int(k)}:{float(flat[k]):.6f}" for k in top)))
    n = len(latencies)
    out.append(f"frame count: {n}, Average latency is: {sum(latencies) / max(n, 1):.6f} ms")
    return "\n".join(out)
