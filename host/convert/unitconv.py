"""unitconv: a 1x1 identity Conv inserted next to a passive operator (ptq_faq_j6, "How to use unitconv
operator to optimize model performance?").

A passive op (Concat, Reshape, ...) takes its quantization threshold from the
ops around it, so at the model's head or tail it runs on the CPU. A unitconv
after (or before) it introduces a threshold of its own, and the op runs on the
BPU; the price is the accuracy of the tail Conv's int32/float32 output, which
now passes through int8 before the unitconv.

How a user asks for one is bpuemu's own (the real toolchain leaves it to the
user's model): ``quant_config`` ``node_config.<node>.unitconv`` "after" puts a
unitconv named ``<node>_unitconv`` on the node's first output (the readers and
the model output keep their tensor name, the node writes
``<output>_unitconv_input``); "before" puts one on its first activation input.
The tensor must be 4-D (N, C, H, W): the unitconv's weight is the C x C
identity, its bias zero, so the float model's outputs do not change.
"""
from typing import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from bpuemu.common.errors import InvalidInput
from bpuemu.host.onnxgraph import GraphIndex, tensor_infos

SIDES = ("after", "before")


def _fresh(used, name: str) -> str:
    out, k = name, 1
    while out in used:
        out = f"{name}_{k}"
        k += 1
    used.add(out)
    return out


def _identity(channels: int, name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1), name)


def insert_unitconvs(model: onnx.ModelProto, where: Mapping[str, str]) -> onnx.ModelProto:
    """``model`` with a unitconv after / before each node ``where`` names (node -> "after" | "before")."""
    if not where:
        return model
    infos = tensor_infos(model)
    idx = GraphIndex(model)
    g = model.graph
    used = {t.name for t in g.initializer} | {n.name for n in g.node} | {t for n in g.node for t in (*n.input, *n.output)}
    for node_name, side in where.items():
        node = idx.by_name.get(node_name)
        if node is None:
            raise InvalidInput(f"unitconv: '{node_name}' is not a node of the model")
        if side == "after":
            tensor = node.output[0]
        else:
            tensor = next((i for i in node.input if i and i not in idx.inits), "")
        info = infos.get(tensor)
        if info is None or not info.shape or len(info.shape) != 4 or info.shape[1] <= 0 or not info.is_float:
            raise InvalidInput(f"unitconv {side} node {node_name}: tensor '{tensor}' is not a 4-D float (N, C, H, W) "
                               "featuremap with a known channel count",
                               hint="a unitconv is a 1x1 Conv; reshape the tensor to 4-D around it")
        channels = info.shape[1]
        conv_name = _fresh(used, f"{node_name}_unitconv")
        weight = _identity(channels, _fresh(used, f"{conv_name}_weight"))
        bias = numpy_helper.from_array(np.zeros(channels, np.float32), _fresh(used, f"{conv_name}_bias"))
        g.initializer.extend([weight, bias])
        if side == "after":
            inner = _fresh(used, f"{tensor}_unitconv_input")
            node.output[0] = inner
            conv = helper.make_node("Conv", [inner, weight.name, bias.name], [tensor], name=conv_name, kernel_shape=[1, 1])
        else:
            outer = _fresh(used, f"{tensor}_unitconv")
            node.input[list(node.input).index(tensor)] = outer
            conv = helper.make_node("Conv", [tensor, weight.name, bias.name], [outer], name=conv_name, kernel_shape=[1, 1])
        position = list(g.node).index(node) + (1 if side == "after" else 0)
        g.node.insert(position, conv)
    del g.value_info[:]
    return onnx.shape_inference.infer_shapes(model)


__all__ = ["SIDES", "insert_unitconvs"]
