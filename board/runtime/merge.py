"""Consecutive onnxruntime pieces of a plan merged into one graph, for frames that need only outputs.

Every onnxruntime run has a fixed cost: about 6 us on a hot cache, 20-40 us
after a frame's convolutions have emptied the caches (the session's state and
the binding's code come back from memory). A plan of a BPU subgraph and a CPU
op after it (a Softmax) pays it twice where plain onnxruntime on the quantized
model pays it once. The pieces are cut at QuantizeLinear outputs, so the
merged graph is the quantized model's graph again (with the Preprocess the
first subgraph computes) and onnxruntime, with the same session options,
computes the same bits (DESIGN.md, "Numerical contract"); the step-by-step
path stays for profiled frames and dumps, which need every piece's tensors.

The onnx package is not on the board: the pieces are read with a schema of
the few ONNX fields the merge touches (field numbers of onnx.proto), built
here from a descriptor; protobuf keeps every other field as it read it, byte
for byte. Pieces that would need more than renaming their internal tensors
(subgraph attributes, local functions, sparse initializers, other opset
versions) are not merged: they run one by one, as before.
"""
import functools
from typing import Dict, List, Optional, Sequence, Set

from bpuemu.board.runtime.onnx_fields import BYTES as _BYTES
from bpuemu.board.runtime.onnx_fields import INT64 as _INT64
from bpuemu.board.runtime.onnx_fields import MANY as _MANY
from bpuemu.board.runtime.onnx_fields import ONE as _ONE
from bpuemu.board.runtime.onnx_fields import STRING as _STRING
from bpuemu.board.runtime.onnx_fields import message_classes

#: message -> (field, number, type or message, label): the ONNX fields the merge reads or writes.
_SCHEMA = {
    "Model": [("ir_version", 1, _INT64, _ONE), ("opset_import", 8, "Opset", _MANY), ("graph", 7, "Graph", _ONE),
              ("functions", 25, _BYTES, _MANY)],
    "Opset": [("domain", 1, _STRING, _ONE), ("version", 2, _INT64, _ONE)],
    "Graph": [("node", 1, "Node", _MANY), ("initializer", 5, "Tensor", _MANY), ("input", 11, "ValueInfo", _MANY),
              ("output", 12, "ValueInfo", _MANY), ("value_info", 13, "ValueInfo", _MANY),
              ("sparse_initializer", 15, _BYTES, _MANY)],
    "Node": [("input", 1, _STRING, _MANY), ("output", 2, _STRING, _MANY), ("name", 3, _STRING, _ONE),
             ("attribute", 5, "Attribute", _MANY)],
    "Attribute": [("g", 6, _BYTES, _ONE), ("graphs", 11, _BYTES, _MANY)],
    "Tensor": [("name", 8, _STRING, _ONE)],
    "ValueInfo": [("name", 1, _STRING, _ONE)],
}


@functools.lru_cache(maxsize=1)
def _messages():
    """The schema's message classes, by name."""
    return message_classes("bpuemu_onnx_merge", _SCHEMA)


class _Names:
    """Every name the merged graph uses, and fresh ones for the internal tensors of later pieces that repeat
    one (a DequantizeLinear the compiler copied into two pieces writes the same tensor in both)."""

    def __init__(self):
        self.used: Set[str] = set()

    def fresh(self, name: str, piece: int) -> str:
        new, i = f"{name}__merged{piece}", 0
        while new in self.used:
            i += 1
            new = f"{name}__merged{piece}_{i}"
        self.used.add(new)
        return new


class _Unmergeable(Exception):
    """The pieces cannot be merged by renaming alone."""


def merge_pieces(blobs: Sequence[bytes], outputs: Sequence[str]) -> Optional[bytes]:
    """One ONNX model computing what the pieces ``blobs`` (in plan order, each reading the chain's inputs or
    earlier pieces' outputs) compute, whose outputs are ``outputs`` (tensors the pieces output); None when
    the pieces cannot be merged by renaming alone."""
    models = [_messages()["Model"].FromString(b) for b in blobs]
    try:
        _check_mergeable(models)
        merged = _Merged(models)
        for index, m in enumerate(models):
            merged.add_piece(index, m.graph)
        return merged.finish(outputs)
    except _Unmergeable:
        return None


def _check_mergeable(models) -> None:
    """No piece has local functions, sparse initializers or subgraph attributes, and all use one version per
    opset domain."""
    opsets: Dict[str, int] = {}
    for m in models:
        if m.functions or m.graph.sparse_initializer or any(
                a.HasField("g") or a.graphs for n in m.graph.node for a in n.attribute):
            raise _Unmergeable
        for o in m.opset_import:
            if opsets.setdefault(o.domain, o.version) != o.version:
                raise _Unmergeable


class _Merged:
    """The merged model, piece by piece: the first piece's model header (opsets, metadata) with an empty
    graph, each piece's graph added (``add_piece``), then the graph outputs (``finish``)."""

    def __init__(self, models):
        self.model = _messages()["Model"]()
        self.model.CopyFrom(models[0])
        self.model.ir_version = max(m.ir_version for m in models)
        self.graph = self.model.graph
        for field in ("node", "initializer", "input", "output", "value_info"):
            self.graph.ClearField(field)
        self.names = _Names()
        self.linkable: Set[str] = set()          # the chain's inputs and the pieces' outputs: what a later piece may read
        self.constants: Dict[str, bytes] = {}    # initializer name -> its bytes (a repeated identical one is shared)
        self.declared: Dict[str, object] = {}    # tensor -> its ValueInfo (graph outputs)
        self.node_names: Set[str] = set()
        self.described: Set[str] = set()         # tensors with a value_info already

    def add_piece(self, index: int, mg) -> None:
        """Piece ``index``'s graph ``mg``: its inputs linked, its internal tensors that repeat a name renamed."""
        self._link_inputs(mg)
        rename: Dict[str, str] = {}
        kept_inits = self._new_initializers(mg, index, rename)
        self._rename_repeated_outputs(mg, index, rename)
        self._copy(mg, index, rename, kept_inits)

    def _link_inputs(self, mg) -> None:
        """The piece's inputs: the chain's inputs (new graph inputs) or earlier pieces' outputs."""
        inits = {t.name for t in mg.initializer}
        for vi in mg.input:
            if vi.name in inits:
                continue
            if vi.name in self.names.used and vi.name not in self.linkable:
                raise _Unmergeable       # an earlier piece's internal tensor of the same name
            if vi.name not in self.names.used:
                self.graph.input.add().CopyFrom(vi)
                self.names.used.add(vi.name)
                self.linkable.add(vi.name)

    def _new_initializers(self, mg, index: int, rename: Dict[str, str]) -> List:
        """The piece's initializers not already in the graph byte for byte; one whose name is taken is renamed."""
        kept = []
        for t in mg.initializer:
            data = t.SerializeToString()
            if t.name in self.constants and self.constants[t.name] == data:
                continue
            if t.name in self.names.used:
                rename[t.name] = self.names.fresh(t.name, index)
            else:
                self.names.used.add(t.name)
                self.constants[t.name] = data
            kept.append(t)
        return kept

    def _rename_repeated_outputs(self, mg, index: int, rename: Dict[str, str]) -> None:
        """The piece's internal tensors whose name is taken get fresh names; a piece output's cannot."""
        piece_outputs = {o.name for o in mg.output}
        for n in mg.node:
            for o in n.output:
                if o and o in self.names.used:
                    if o in piece_outputs:
                        raise _Unmergeable   # two pieces write the same plan tensor
                    rename[o] = self.names.fresh(o, index)
                elif o:
                    self.names.used.add(o)

    def _copy(self, mg, index: int, rename: Dict[str, str], kept_inits) -> None:
        """The piece's initializers, nodes (a repeated node name made fresh) and value_infos into the graph,
        renamed; its outputs become linkable."""
        g = self.graph
        for t in kept_inits:
            t.name = rename.get(t.name, t.name)
            g.initializer.add().CopyFrom(t)
        for n in mg.node:
            n.input[:] = [rename.get(i, i) for i in n.input]
            n.output[:] = [rename.get(o, o) for o in n.output]
            if n.name:
                if n.name in self.node_names:
                    n.name = self.names.fresh(n.name, index)
                self.node_names.add(n.name)
            g.node.add().CopyFrom(n)
        for vi in mg.value_info:
            vi.name = rename.get(vi.name, vi.name)
            if vi.name not in self.described:
                self.described.add(vi.name)
                g.value_info.add().CopyFrom(vi)
        for vi in mg.output:
            self.linkable.add(vi.name)
            self.declared[vi.name] = vi

    def finish(self, outputs: Sequence[str]) -> bytes:
        """The merged model's bytes, its graph outputs ``outputs`` (each some piece's output)."""
        if any(o not in self.declared for o in outputs):
            raise _Unmergeable
        for o in outputs:
            self.graph.output.add().CopyFrom(self.declared[o])
        return self.model.SerializeToString()


def chains(steps: Sequence, is_piece) -> List[List]:
    """``steps`` in runs: each run of two or more consecutive pieces (``is_piece``) as one list, every other
    step alone."""
    runs: List[List] = []
    for step in steps:
        if is_piece(step) and runs and is_piece(runs[-1][-1]):
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs
