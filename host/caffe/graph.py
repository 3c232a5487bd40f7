"""The ONNX graph a Caffe net is converted into, built layer by layer.

Caffe blobs are names that layers may overwrite in place (``top: "conv1"`` on
a ReLU reading ``conv1``); ONNX tensors are written once. ``Graph`` keeps the
current ONNX tensor of every Caffe blob and its static shape (inputs have
fixed shapes, so every shape is known while converting: pooling's ceil
rounding, Flatten, Reshape and Slice need them). Each layer's last node is
named after the layer, so node_info, run_on_cpu and the checker's table speak
of Caffe layer names; helper nodes a layer needs get ``<layer>_<suffix>``.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput
from bpuemu.host.caffe import caffe_pb2

Shape = Tuple[int, ...]
OPSET = 11


class Graph:
    """Nodes, weights and the blob -> tensor map of the ONNX model being built."""

    def __init__(self, name: str):
        self.name = name
        self.nodes: List[onnx.NodeProto] = []
        self.initializers: List[onnx.TensorProto] = []
        self.inputs: List[onnx.ValueInfoProto] = []
        self.blob_tensor: Dict[str, str] = {}
        self.shapes: Dict[str, Shape] = {}
        self.producer: Dict[str, onnx.NodeProto] = {}
        self.consumed: Dict[str, int] = {}
        #: blobs that layers after the one being converted read (a fold must not change what they see).
        self.read_later = set()
        #: blob name -> shape given by the user (--input-shape, input_shape), overriding the prototxt's.
        self.input_shapes: Dict[str, Shape] = {}
        self._used = set()
        self._node_names = set()

    def unique(self, name: str, used=None) -> str:
        """``name``, or ``name_<k>`` when taken (tensor names by default, node names with ``used``)."""
        used = self._used if used is None else used
        base, k = name, 1
        while name in used:
            name, k = f"{base}_{k}", k + 1
        used.add(name)
        return name

    def is_used(self, tensor: str) -> bool:
        return tensor in self._used

    def add_input(self, blob: str, shape: Shape) -> None:
        if not shape or any(d <= 0 for d in shape):
            raise InvalidInput(f"Caffe input {blob} has no fixed shape ({'x'.join(map(str, shape)) or 'none given'})",
                               hint=f"give the shape of {blob} (e.g. 1x3x224x224) in input_shape in the yaml",
                               subject="input_shape")
        tensor = self.unique(blob)
        self.inputs.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, list(shape)))
        self.define(blob, tensor, shape)

    def define(self, blob: str, tensor: str, shape: Shape) -> None:
        self.blob_tensor[blob] = tensor
        self.shapes[tensor] = tuple(int(d) for d in shape)

    def tensor(self, blob: str, layer: caffe_pb2.LayerParameter) -> str:
        if blob not in self.blob_tensor:
            raise InvalidInput(f"layer name={layer.name} type={layer.type} reads blob '{blob}', which no earlier "
                               "layer or input produces")
        return self.blob_tensor[blob]

    def const(self, name: str, value) -> str:
        name = self.unique(name)
        self.initializers.append(numpy_helper.from_array(np.asarray(value), name))
        self.shapes[name] = tuple(np.shape(value))
        return name

    def constants(self) -> Dict[str, np.ndarray]:
        return {t.name: numpy_helper.to_array(t) for t in self.initializers}

    def add_node(self, op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs) -> onnx.NodeProto:
        node = helper.make_node(op, list(inputs), list(outputs), name=self.unique(name, self._node_names), **attrs)
        self.nodes.append(node)
        for t in inputs:
            self.consumed[t] = self.consumed.get(t, 0) + 1
        for t in outputs:
            self.producer[t] = node
        return node

    def _live(self, outputs: Sequence[str]):
        """Nodes and initializers the outputs depend on (SSD's feature maps feeding only PriorBox are not)."""
        needed, nodes = set(outputs), []
        for node in reversed(self.nodes):
            if needed & set(node.output):
                nodes.append(node)
                needed |= set(node.input)
        return nodes[::-1], [t for t in self.initializers if t.name in needed]

    def model(self, outputs: Sequence[str]) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(self.shapes[t])) for t in outputs]
        nodes, initializers = self._live(outputs)
        graph = helper.make_graph(nodes, self.name or "caffe_net", self.inputs, outs, initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="bpuemu-caffe")
        model.ir_version = 6  # what opset 11 tools expect (the seeds document ir_version <= 7)
        return model


class LayerContext:
    """What one layer converter sees: its layer, weights, input tensors and shapes, and ways to emit."""

    def __init__(self, graph: Graph, layer: caffe_pb2.LayerParameter, blobs: List[np.ndarray]):
        self.graph = graph
        self.layer = layer
        self.blobs = blobs
        self.inputs = [graph.tensor(b, layer) for b in layer.bottom]

    @property
    def x(self) -> str:
        if not self.inputs:
            raise self.error("needs a bottom blob")
        return self.inputs[0]

    def shape(self, tensor: Optional[str] = None) -> Shape:
        return self.graph.shapes[tensor or self.x]

    def error(self, what: str) -> InvalidInput:
        return InvalidInput(f"layer name={self.layer.name} type={self.layer.type}: {what}")

    def weight(self, index: int, what: str) -> np.ndarray:
        if index >= len(self.blobs):
            raise self.error(f"the caffemodel has no {what} blob for this layer")
        return self.blobs[index]

    def const(self, suffix: str, value) -> str:
        """An initializer named after the layer; float values are stored as float32."""
        value = np.asarray(value)
        return self.graph.const(f"{self.layer.name}_{suffix}", value.astype(np.float32) if value.dtype.kind == "f" else value)

    def emit(self, op: str, inputs: Sequence[str], shape: Shape, suffix: Optional[str] = None, **attrs) -> str:
        """One node with one output; without ``suffix`` it is the layer's own node (named after the layer)."""
        return self.emit_many(op, inputs, [shape], suffix, **attrs)[0]

    def emit_many(self, op: str, inputs: Sequence[str], shapes: Sequence[Shape], suffix: Optional[str] = None,
                  **attrs) -> List[str]:
        """One node with an output per shape. The layer's own node (no ``suffix``) names its outputs after the
        layer's tops where those names are still free; helper nodes use ``<layer>_<suffix>[_out<i>]``."""
        name = self.layer.name if suffix is None else f"{self.layer.name}_{suffix}"
        outs = []
        for i, shape in enumerate(shapes):
            if suffix is None and i < len(self.layer.top) and not self.graph.is_used(self.layer.top[i]):
                wanted = self.layer.top[i]
            else:
                wanted = f"{name}_out{i}" if len(shapes) > 1 else name
            out = self.graph.unique(wanted)
            self.graph.shapes[out] = tuple(int(d) for d in shape)
            outs.append(out)
        self.graph.add_node(op, inputs, outs, name, **attrs)
        return outs

    def top(self, tensor: str, index: int = 0) -> None:
        """Bind top ``index`` of the layer to ``tensor``."""
        if index >= len(self.layer.top):
            raise self.error(f"has {len(self.layer.top)} top blob(s), the conversion makes more")
        self.graph.define(self.layer.top[index], tensor, self.graph.shapes[tensor])


def axis_of(axis: int, rank: int, ctx: LayerContext) -> int:
    """Caffe's CanonicalAxisIndex: a negative axis counts from the end."""
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for a {rank}-D blob")
    return axis % rank
