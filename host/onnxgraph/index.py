"""Producers and consumers of an ONNX graph's tensors."""
from typing import Dict, List, Tuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

Q, DQ = "QuantizeLinear", "DequantizeLinear"


class GraphIndex:
    """Who makes and who reads each tensor of ``model``'s graph, built once.

    ``producer[t]``: the node that outputs ``t``; ``consumers[t]``: every
    ``(node, input position)`` reading it, in graph order; ``inputs``: the
    graph inputs that are not initializers; ``inits``: initializers by name.
    Node lists hold the model's own NodeProtos: an index of a graph that is
    then edited is stale, build a new one.
    """

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model = model
        self.nodes = list(g.node)
        self.by_name = {n.name: n for n in self.nodes}
        self.position = {n.name: i for i, n in enumerate(self.nodes)}
        self.inits = {t.name: t for t in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in self.inits]
        self.outputs = [o.name for o in g.output]
        self.producer: Dict[str, onnx.NodeProto] = {}
        self.consumers: Dict[str, List[Tuple[onnx.NodeProto, int]]] = {}
        for n in self.nodes:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for k, i in enumerate(n.input):
                if i:
                    self.consumers.setdefault(i, []).append((n, k))

    def readers(self, tensor: str) -> List[onnx.NodeProto]:
        """The nodes reading ``tensor`` (a node reading it twice is listed twice)."""
        return [n for n, _ in self.consumers.get(tensor, [])]

    def const(self, name: str) -> np.ndarray:
        return numpy_helper.to_array(self.inits[name])


def attr(node: onnx.NodeProto, name: str, default=None):
    """The value of ``node``'s attribute ``name``, or ``default``."""
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default
