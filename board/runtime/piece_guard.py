"""A model is data: refuse an ONNX piece that would make onnxruntime read a file of the board.

ONNX lets a tensor keep its bytes in a file beside the model (``data_location:
EXTERNAL``, ``external_data {key: "location" value: "weights.bin"}``). A model
opened from bytes has no directory, so onnxruntime resolves such a location
against the daemon's working directory: a piece could carry any file the daemon
can read back to its caller as a weight. Every tensor a piece holds is checked
before the piece is opened, wherever ONNX lets one sit: the graph's
initializers and sparse initializers, node attributes (``t``, ``tensors``,
``sparse_tensor``, ``sparse_tensors``), the graphs of If/Loop/Scan attributes
at any depth, local functions (their nodes and attribute defaults) and training
graphs. A tensor marked EXTERNAL, or carrying ``external_data`` entries at all,
is refused with one line naming it. Sessions are also told the bytes are ONNX
(``session.load_model_format``), so they are never read as an ORT-format model,
whose layout this check does not know. That is every way an ONNX model reaches
the file system in onnxruntime: no operator of the CPU provider opens a file.

The onnx package is not on the board (bpuemu.board never imports it): the
pieces are read with a schema of the few ONNX fields that can hold a tensor,
built here from a descriptor with onnx.proto's field numbers (tests check them
against onnx's own), as bpuemu.board.runtime.merge reads the fields it merges.
Protobuf parses with the same rules onnxruntime's parser follows, so what this
check sees is what onnxruntime would load; what it cannot parse is refused.
"""
import functools
from typing import Iterator, Tuple

from google.protobuf.message import DecodeError

from bpuemu.common.errors import InvalidModelFile

from bpuemu.board.runtime.onnx_fields import INT32 as _INT32
from bpuemu.board.runtime.onnx_fields import MANY as _MANY
from bpuemu.board.runtime.onnx_fields import ONE as _ONE
from bpuemu.board.runtime.onnx_fields import STRING as _STRING
from bpuemu.board.runtime.onnx_fields import message_classes
_PACKAGE = "bpuemu_onnx_guard"

#: TensorProto.DataLocation.EXTERNAL in onnx.proto.
EXTERNAL = 1

#: message -> (field, number, type or message, label): onnx.proto's fields that hold tensors, or hold what holds
#: them. Names are onnx.proto's, without the "Proto" suffix.
SCHEMA = {
    "Model": [("graph", 7, "Graph", _ONE), ("training_info", 20, "TrainingInfo", _MANY),
              ("functions", 25, "Function", _MANY)],
    "TrainingInfo": [("initialization", 1, "Graph", _ONE), ("algorithm", 2, "Graph", _ONE)],
    "Function": [("name", 1, _STRING, _ONE), ("node", 7, "Node", _MANY), ("attribute_proto", 11, "Attribute", _MANY)],
    "Graph": [("node", 1, "Node", _MANY), ("name", 2, _STRING, _ONE), ("initializer", 5, "Tensor", _MANY),
              ("sparse_initializer", 15, "SparseTensor", _MANY)],
    "Node": [("name", 3, _STRING, _ONE), ("op_type", 4, _STRING, _ONE), ("attribute", 5, "Attribute", _MANY)],
    "Attribute": [("name", 1, _STRING, _ONE), ("t", 5, "Tensor", _ONE), ("g", 6, "Graph", _ONE),
                  ("tensors", 10, "Tensor", _MANY), ("graphs", 11, "Graph", _MANY),
                  ("sparse_tensor", 22, "SparseTensor", _ONE), ("sparse_tensors", 23, "SparseTensor", _MANY)],
    "SparseTensor": [("values", 1, "Tensor", _ONE), ("indices", 2, "Tensor", _ONE)],
    "Tensor": [("name", 8, _STRING, _ONE), ("external_data", 13, "StringStringEntry", _MANY),
               ("data_location", 14, _INT32, _ONE)],
    "StringStringEntry": [("key", 1, _STRING, _ONE), ("value", 2, _STRING, _ONE)],
}


@functools.lru_cache(maxsize=1)
def _model_class():
    return message_classes(_PACKAGE, SCHEMA)["Model"]


def _named(kind: str, name: str) -> str:
    return f"{kind} '{name[:60]}'" if name else kind


def _graph_tensors(graph, here: str) -> Iterator[Tuple[object, str]]:
    """``here``: how the graph is named in a refusal ("graph 'main'", "subgraph 'then' of node 'If' in ...")."""
    for t in graph.initializer:
        yield t, f"initializer of {here}"
    for s in graph.sparse_initializer:
        yield from _sparse_tensors(s, f"sparse initializer of {here}")
    for node in graph.node:
        yield from _node_tensors(node, here)


def _sparse_tensors(sparse, where: str) -> Iterator[Tuple[object, str]]:
    if sparse.HasField("values"):
        yield sparse.values, where
    if sparse.HasField("indices"):
        yield sparse.indices, f"indices of {where}"


def _attribute_tensors(attr, where: str) -> Iterator[Tuple[object, str]]:
    here = f"attribute '{attr.name[:60]}' of {where}"
    owner = where
    if attr.HasField("t"):
        yield attr.t, here
    for t in attr.tensors:
        yield t, here
    if attr.HasField("sparse_tensor"):
        yield from _sparse_tensors(attr.sparse_tensor, here)
    for s in attr.sparse_tensors:
        yield from _sparse_tensors(s, here)
    for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
        yield from _graph_tensors(g, f"{_named('subgraph', g.name)} ({attr.name[:60]}) of {owner}")


def _node_tensors(node, where: str) -> Iterator[Tuple[object, str]]:
    here = f"{_named('node', node.name or node.op_type)} in {where}"
    for attr in node.attribute:
        yield from _attribute_tensors(attr, here)


def model_tensors(model) -> Iterator[Tuple[object, str]]:
    """(tensor, where it sits) for every tensor a parsed piece holds, at any depth."""
    if model.HasField("graph"):
        yield from _graph_tensors(model.graph, _named("graph", model.graph.name))
    for i, info in enumerate(model.training_info):
        for field in ("initialization", "algorithm"):
            if info.HasField(field):
                yield from _graph_tensors(getattr(info, field), f"training graph {i} ({field})")
    for function in model.functions:
        where = _named("function", function.name)
        for attr in function.attribute_proto:
            yield from _attribute_tensors(attr, where)
        for node in function.node:
            yield from _node_tensors(node, where)


def check_piece(blob: bytes, piece: str) -> None:
    """Refuse a piece (``piece``: how the error names it) that holds external data, or does not parse as ONNX."""
    try:
        model = _model_class().FromString(blob)
    except DecodeError as exc:
        raise InvalidModelFile(f"{piece}: not a valid ONNX model ({exc})") from None
    for tensor, where in model_tensors(model):
        if tensor.data_location == EXTERNAL or len(tensor.external_data):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            raise InvalidModelFile(
                f"{piece}: tensor '{tensor.name[:80]}' ({where}) is stored as external data"
                + (f" (location {location[:80]!r})" if location else "")
                + ": a model on a board must hold all its data; refused",
                hint="re-create the model with its weights inside the .bin (hb_mapper makertbin does this)")
