"""The J6 flow's artifacts (hb_compile), written into the staging directory beside the ONNX ones:

    <prefix>_quantized_model.bc          the fixed-point model (bpuemu.common.container, .bc)
    <prefix>_quantized_removed_model.bc  the same with remove_node_type / remove_node_name applied
    <prefix>.hbm                         the deployable model (the .bin's plan under the .hbm magic)
    <prefix>_node_info.csv               the node table (bpuemu.host.convert.nodetable)

What the `.bc` holds: the quantized model in the integer domain (the QDQ
``*_ptq_model.onnx`` the compile step partitions), its march, its input and
output order (the float model's), and per node its placement and output data
type. The `.hbm`'s inputs are in name order (sorted), whatever the float
model's order: bpuemu's documented rule for the FAQ's "the order of model
inputs may change"; hb_model_info shows it and every tool addresses inputs by
name.
"""
import csv
import io
from typing import Dict, List, Sequence

import onnx

from bpuemu.common.atomic import write_file_atomic
from bpuemu.common.container import write_bc, write_hbm
from bpuemu.common.proto import model_pb2
from bpuemu.host.onnxgraph import DQ, Q, GraphIndex, graph_inputs


#: remove_node_type -> the ONNX op type of the quantized model it names.
_ONNX_TYPE = {"Quantize": Q, "Dequantize": DQ}


def write_j6_artifacts(job, paths: Dict[str, str], quantized: onnx.ModelProto, placement, rows: List[Dict[str, str]],
                       model: model_pb2.Model, blobs: Dict[str, bytes], removed: Sequence[str]) -> str:
    """The `.bc` (and the removed one), the node table CSV and the `.hbm`; returns the `.hbm`'s SHA-256."""
    dtypes = {r["Node"]: r.get("Output Data Type", "") for r in rows}
    write_bc(paths["bc"], fixed_point_manifest(job, quantized, placement, dtypes), quantized.SerializeToString())
    if removed:
        cut, cut_names = remove_edges(quantized, job.remove_node_type, job.remove_node_name)
        manifest = fixed_point_manifest(job, cut, placement, dtypes, keep=lambda n: n not in cut_names)
        manifest.removed_nodes.extend(list(removed))
        write_bc(paths["removed_bc"], manifest, cut.SerializeToString())
    write_node_info(paths["node_info"], rows)
    return write_hbm(paths["bin"], [model], blobs)


def fixed_point_manifest(job, quantized: onnx.ModelProto, placement, dtypes: Dict[str, str],
                         keep=lambda name: True) -> model_pb2.FixedPointModel:
    fp = model_pb2.FixedPointModel(name=job.output_model_file_prefix, march=job.march,
                                   input_names=[i.name for i in graph_inputs(quantized)],
                                   output_names=[o.name for o in quantized.graph.output])
    for p in placement.nodes:
        if keep(p.name):
            fp.nodes.add(name=p.name, op_type=p.op_type, on=p.on, subgraph=-1 if p.subgraph is None else p.subgraph,
                         type=p.bpu_type, output_dtype=dtypes.get(p.name, ""))
    fp.build_info.CopyFrom(job.build_info)
    return fp


def remove_edges(model: onnx.ModelProto, types: Sequence[str], names: Sequence[str]):
    """``model`` without the nodes at its inputs and outputs that remove_node_type / remove_node_name
    name (types repeated until none is left at an edge, as the compile step's removal does).
    Returns (the model, the names of the nodes removed)."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    want_types = {_ONNX_TYPE.get(t, t) for t in types}
    removed = set()
    while True:
        idx = GraphIndex(m)
        inputs, outputs = set(idx.inputs), set(idx.outputs)
        todo = None
        for n in idx.nodes:
            if n.op_type not in want_types and n.name not in names:
                continue
            acts = [i for i in n.input if i and i not in idx.inits]
            if len(acts) == 1 and acts[0] in inputs and len(n.output) == 1:
                todo = (n, "input")
                break
            if len(n.output) == 1 and n.output[0] in outputs and acts:
                todo = (n, "output")
                break
        if todo is None:
            return m, removed
        n, edge = todo
        _cut(m, n, edge)
        removed.add(n.name)


def _cut(m: onnx.ModelProto, n: onnx.NodeProto, edge: str) -> None:
    """Remove ``n``: at the input edge its output becomes the graph input, at the output edge its input the output."""
    from onnx import helper

    g = m.graph
    inferred = onnx.shape_inference.infer_shapes(m)
    infos = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    if edge == "input":
        old = n.input[0]
        vi = infos.get(n.output[0]) or helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None)
        pos = [i.name for i in g.input].index(old)
        g.node.remove(n)
        if not any(old in x.input for x in g.node):
            del g.input[pos]
            g.input.insert(pos, vi)
        else:
            g.input.append(vi)
    else:
        acts = [i for i in n.input if i and i not in {t.name for t in g.initializer}]
        new = acts[0]
        vi = infos.get(new) or helper.make_tensor_value_info(new, onnx.TensorProto.FLOAT, None)
        pos = [o.name for o in g.output].index(n.output[0])
        g.node.remove(n)
        del g.output[pos]
        g.output.insert(pos, vi)


def write_node_info(path: str, rows: List[Dict[str, str]]) -> None:
    """``*_node_info.csv``: the node table, one row per node, the log table's columns."""
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    write_file_atomic(path, buf.getvalue().encode())
