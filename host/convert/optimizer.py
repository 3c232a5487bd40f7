"""The optimizer stage: *_optimized_float_model.onnx.

Numerically equivalent rewrites that make a float model quantize well:

* opset raised to at least 13 (per-channel DequantizeLinear needs its ``axis``;
  onnx.version_converter keeps outputs identical);
* onnxruntime's basic graph optimizations, saved as standard ONNX: constant
  folding (Paddle keeps weights as Constant nodes), Identity/Dropout removal,
  Conv+BatchNormalization / Conv+Mul / Conv+Add folding;
* pattern fusions of our own: the Add/Clip/Mul/Div spelling of HardSwish
  (x * clip(x + 3, 0, 6) / 6) becomes one HardSwish node, so the whole
  activation gets one int8 range instead of one per piece; a
  BatchNormalization no Conv absorbed becomes a depthwise 1x1 Conv; a Conv
  followed by a Mul or Add with a per-channel or scalar constant absorbs it.
"""
import logging
import os
import tempfile
from typing import Dict, Mapping, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bpuemu.host.onnxgraph import GraphIndex, convert_opset, default_opset, name_nodes, open_session

log = logging.getLogger("bpuemu.host.convert")

MIN_OPSET = 13


def raise_opset(model: onnx.ModelProto, target: int = MIN_OPSET) -> onnx.ModelProto:
    """The model at opset ``target`` at least (the same converter the quantizer uses)."""
    before = default_opset(model)
    converted = convert_opset(model, target)
    if converted is not model:
        log.info("converted opset %d -> %d", before, target)
    return converted


def ort_basic_optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's basic graph optimizations, as the model onnxruntime saves after applying them
    (its own options: this session exists to write that model, not to compute like the board)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "optimized.onnx")
        opts.optimized_model_filepath = out
        open_session(model, opts, board_options=False)
        optimized = onnx.load(out)
    # Keep the producer's graph name and the original input order.
    optimized.graph.name = model.graph.name
    return optimized


class _Consts(Mapping[str, np.ndarray]):
    """The model's initializers by name as numpy arrays, each converted when first read (a pass reads a
    few of PP-OCRv4 det's 300; converting all of them took 3 ms, once per fold before)."""

    def __init__(self, model: onnx.ModelProto):
        self._protos = {t.name: t for t in model.graph.initializer}
        self._arrays: Dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._protos[name])
        return self._arrays[name]

    def __contains__(self, name) -> bool:
        return name in self._protos

    def __iter__(self):
        return iter(self._protos)

    def __len__(self) -> int:
        return len(self._protos)

    def add(self, proto: onnx.TensorProto, array: np.ndarray) -> None:
        """An initializer added to the model after this mapping was made."""
        self._protos[proto.name] = proto
        self._arrays[proto.name] = array


def _scalar(consts, name) -> Optional[float]:
    a = consts.get(name)
    if a is None or a.size != 1:
        return None
    return float(a.reshape(-1)[0])


def fuse_hardswish(model: onnx.ModelProto, dry_run: bool = False) -> int:
    """x * Clip(x + 3, 0, 6) / 6  (or * 1/6)  ->  HardSwish(x). Returns the number fused (found, with dry_run)."""
    if default_opset(model) < 14 and not dry_run:
        return 0
    g = model.graph
    consts = _Consts(model)
    idx = GraphIndex(model)
    fused, remove = 0, set()
    for add in list(g.node):
        if add.op_type != "Add" or add.name in remove:
            continue
        x = next((i for i in add.input if _scalar(consts, i) is None), None)
        three = next((i for i in add.input if _scalar(consts, i) is not None), None)
        if x is None or three is None or abs(_scalar(consts, three) - 3.0) > 1e-6:
            continue
        clip = idx.readers(add.output[0])
        if len(clip) != 1 or clip[0].op_type != "Clip" or len(clip[0].input) < 3:
            continue
        clip = clip[0]
        if _scalar(consts, clip.input[1]) != 0.0 or _scalar(consts, clip.input[2]) != 6.0:
            continue
        mul = idx.readers(clip.output[0])
        if len(mul) != 1 or mul[0].op_type != "Mul" or x not in mul[0].input:
            continue
        mul = mul[0]
        tail = idx.readers(mul.output[0])
        if len(tail) != 1:
            continue
        tail = tail[0]
        other = [i for i in tail.input if i != mul.output[0]]
        k = _scalar(consts, other[0]) if other else None
        if k is None or not ((tail.op_type == "Div" and abs(k - 6) < 1e-6) or (tail.op_type == "Mul" and abs(k - 1 / 6) < 1e-6)):
            continue
        fused += 1
        if dry_run:
            continue
        hs = helper.make_node("HardSwish", [x], [tail.output[0]], name=f"{add.name}_HardSwish")
        g.node.insert(list(g.node).index(tail), hs)
        remove.update({add.name, clip.name, mul.name, tail.name})
    if remove:
        keep = [n for n in g.node if n.name not in remove or n.op_type == "HardSwish"]
        del g.node[:]
        g.node.extend(keep)
    return fused


def batchnorm_to_conv(model: onnx.ModelProto) -> int:
    """A BatchNormalization that no Conv absorbed -> a depthwise 1x1 Conv (the BPU's form of it).

    y = (x - mean) / sqrt(var + eps) * gamma + beta = x * a + b per channel.
    """
    g = model.graph
    consts = _Consts(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(onnx.shape_inference.infer_shapes(model).graph.value_info) + list(g.input)}
    count = 0
    for i, n in enumerate(list(g.node)):
        if n.op_type != "BatchNormalization" or len(n.output) != 1 or not all(t in consts for t in n.input[1:5]):
            continue
        if len(shapes.get(n.input[0], [])) != 4:
            continue
        gamma, beta, mean, var = (consts[t].astype(np.float64) for t in n.input[1:5])
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        a = gamma / np.sqrt(var + eps)
        b = beta - mean * a
        c = a.size
        w_name, b_name = f"{n.name}_dw_weight", f"{n.name}_dw_bias"
        g.initializer.extend([numpy_helper.from_array(a.astype(np.float32).reshape(c, 1, 1, 1), w_name),
                              numpy_helper.from_array(b.astype(np.float32), b_name)])
        conv = helper.make_node("Conv", [n.input[0], w_name, b_name], list(n.output), name=n.name, group=c, kernel_shape=[1, 1])
        idx = list(g.node).index(n)
        g.node.remove(n)
        g.node.insert(idx, conv)
        count += 1
    return count


def _per_channel(a: np.ndarray, channels: int) -> Optional[np.ndarray]:
    """A constant that broadcasts over NCHW as one value per channel (or one value), as a [C] vector."""
    if a.size == 1:
        return np.full(channels, float(a.reshape(-1)[0]), dtype=np.float64)
    if a.size == channels and a.ndim <= 4 and a.shape[-1 if a.ndim == 1 else -3] == channels:
        if a.ndim == 1 or all(d == 1 for i, d in enumerate(a.shape) if i != a.ndim - 3):
            return a.reshape(-1).astype(np.float64)
    return None


def fold_conv_mul_add(model: onnx.ModelProto) -> int:
    """Conv -> Mul(const) / Add(const) -> folded into the Conv's weight and bias.

    Paddle exports (MobileOne blocks, unfused BatchNorm) leave these behind where
    onnxruntime's own fusion does not apply (a scalar, or a [1] constant).
    """
    g = model.graph
    folded = 0
    consts = _Consts(model)
    idx = GraphIndex(model)     # a fold removes only the Mul/Add it folds: the other readers stay true
    for conv in list(g.node):
        if conv.op_type != "Conv" or len(conv.input) < 2 or conv.input[1] not in consts:
            continue
        while True:             # a chain Conv -> Mul -> Add folds one after the other
            out = conv.output[0]
            users = idx.readers(out)
            if out in idx.outputs or len(users) != 1 or users[0].op_type not in ("Mul", "Add"):
                break
            op = users[0]
            other = [i for i in op.input if i != out]
            if len(other) != 1 or other[0] not in consts:
                break
            w = consts[conv.input[1]].astype(np.float64)
            c = w.shape[0]
            k = _per_channel(consts[other[0]], c)
            if k is None:
                break
            b = consts[conv.input[2]].astype(np.float64) if len(conv.input) > 2 and conv.input[2] else np.zeros(c)
            if op.op_type == "Mul":
                w = w * k.reshape((c,) + (1,) * (w.ndim - 1))
                b = b * k
            else:
                b = b + k
            w_name, b_name = f"{conv.name}_w_folded{folded}", f"{conv.name}_b_folded{folded}"
            for array, name in ((w.astype(np.float32), w_name), (b.astype(np.float32), b_name)):
                g.initializer.append(numpy_helper.from_array(array, name))
                consts.add(g.initializer[-1], array)
            del conv.input[1:]
            conv.input.extend([w_name, b_name])
            conv.output[0] = op.output[0]
            g.node.remove(op)
            folded += 1
    if folded:  # drop initializers nothing reads any more
        used = {i for n in g.node for i in n.input}
        keep = [t for t in g.initializer if t.name in used]
        del g.initializer[:]
        g.initializer.extend(keep)
    return folded


def optimize(model: onnx.ModelProto) -> onnx.ModelProto:
    """The optimized float model: same outputs (to float rounding), fewer and fused ops."""
    name_nodes(model)  # names survive into the checker table and the plan
    model = raise_opset(model)
    if model.ir_version < 7:
        # IR < 4 requires every initializer to be a graph input, which the
        # rewrites below (and onnxruntime's saved model) do not keep.
        model.ir_version = 7
    optimized = ort_basic_optimize(model)
    if default_opset(optimized) < 14 and fuse_hardswish(optimized, dry_run=True):
        optimized = raise_opset(optimized, 14)  # HardSwish is an opset-14 operator
    n = fuse_hardswish(optimized)
    if n:
        log.info("fused %d HardSwish pattern(s)", n)
    n = fold_conv_mul_add(optimized)
    if n:
        log.info("folded %d constant Mul/Add node(s) into the Conv before them", n)
    n = batchnorm_to_conv(optimized)
    if n:
        log.info("turned %d standalone BatchNormalization node(s) into depthwise 1x1 Conv", n)
    onnx.checker.check_model(optimized)
    return optimized
