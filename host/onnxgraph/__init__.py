"""The ONNX graph toolkit every host stage builds on: reading a model, indexing its graph, running it.

The quantizer, the compiler, the conversion pipeline, the debugger, the
verifier and the model tools all work on ONNX graphs; what they share lives
here, once, below all of them (the host's layer order is in
``bpuemu.host``'s docstring):

``model``: loading an ``.onnx`` file with one user-facing error
    (``load_onnx``), the model's inputs (``graph_inputs``), opsets
    (``default_opset``, ``convert_opset``), node names (``name_nodes``),
    Constant nodes as initializers, tensor types and shapes (``tensor_infos``,
    ``value_infos``), and a copy of a model that also outputs some
    intermediate tensors (``with_outputs``);
``index``: producers and consumers of a graph's tensors (``GraphIndex``);
``session``: the one way the host opens an onnxruntime session on a model
    (``open_session``): with the board runtime's session options (QDQ fusion
    off), so what the host computes is what the board computes, unless the
    caller says otherwise (``board_options=False``), and the feed a session
    takes (``feed_for``), the calibration samples spread over the host's cores
    (``map_samples``, ``imap_samples``);
``parts``: a model outputting many intermediate tensors run as consecutive
    parts, one part's outputs in memory at a time (``Parts``).
"""
from bpuemu.host.onnxgraph.index import DQ, Q, GraphIndex, attr
from bpuemu.host.onnxgraph.model import (
    TensorInfo, constants_to_initializers, convert_opset, default_opset, elem_type_name, graph_inputs, has_qdq,
    load_onnx, name_nodes, tensor_infos, value_infos, with_outputs,
)
from bpuemu.host.onnxgraph.parts import Parts, open_parted
from bpuemu.host.onnxgraph.session import feed_for, imap_samples, map_samples, open_session, sample_workers

__all__ = [
    "DQ", "Q", "GraphIndex", "Parts", "TensorInfo", "attr", "constants_to_initializers", "convert_opset", "default_opset",
    "elem_type_name",
    "feed_for", "graph_inputs", "has_qdq", "imap_samples", "load_onnx", "map_samples", "name_nodes", "open_parted", "open_session", "sample_workers",
    "tensor_infos", "value_infos", "with_outputs",
]
