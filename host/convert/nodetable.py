"""The conversion's node table: one row per node, the columns the march's flow logs.

The placement (bpuemu.host.compiler.placement) gives Node, ON, Subgraph and
Type; this module adds the columns after them, from one place for the log
table and (J6) ``*_node_info.csv``:

* X5 (``hb_mapper makertbin``): ``Cosine Similarity``, ``Threshold``.
* J6 (``hb_compile``): ``Output Data Type``, ``Calibrated Cosine`` (the node
  cosine of the calibrated against the float model; ``nan`` where
  ptq_faq_j6's nan cases apply, bpuemu.host.quant.nan_cosine) and
  ``Threshold``; ``*_node_info.csv`` adds ``Note``: why a configured qtype did
  not take effect (``NodePlacement.qtype_note``), why the cosine is nan
  (``cosine_note``), why a node runs on the CPU, and float16 emulated with
  int16.

``Output Data Type`` is ``NodePlacement.output_dtype``, what placement (the J6
rules: the tail Conv's int32/float32, int32 inputs, ArgMax's Cast) and
quantization (bpuemu.host.quant.precision: int8/int16) decided. Where they
left it unset, it is read from the quantized model (``model_output_dtypes``):
the type of the QuantizeLinear after a BPU node's output, the march's tail type
for a model-tail Conv left unquantized, the tensor's own type otherwise. The
two agree on every node but two, where the table says what the board does:
a node configured float16 (the model holds its int16 emulation) and an ArgMax
fused with its Cast (the model's ArgMax outputs int64, the BPU the Cast's type).
"""
from typing import Dict, List, Optional

import onnx

from bpuemu.common.march import March
from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.onnxgraph import Q, GraphIndex, elem_type_name
from bpuemu.host.quant.precision import FLOAT16, FLOAT16_EMULATION

J6_COLUMNS = ("Output Data Type", "Calibrated Cosine", "Threshold")
#: The column ``*_node_info.csv`` adds to the log table's.
NOTE = "Note"


def _elem_types(model: onnx.ModelProto) -> Dict[str, int]:
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    return types


def model_output_dtypes(placement, quantized: onnx.ModelProto, march: March) -> Dict[str, str]:
    """Node name -> the data type the quantized model gives its first output (see the module docstring)."""
    if not any(vi.name for vi in quantized.graph.value_info):
        quantized = onnx.shape_inference.infer_shapes(quantized)
    idx = GraphIndex(quantized)
    types = _elem_types(quantized)
    on = {p.name: p.on for p in placement.nodes}

    def quantized_as(t: str) -> Optional[str]:
        q = next((r for r in idx.readers(t) if r.op_type == Q), None)
        if q is None:
            return None
        zp = q.input[2] if len(q.input) > 2 and q.input[2] else ""
        return elem_type_name(types.get(zp, onnx.TensorProto.UINT8), "int8")

    out = {}
    for p in placement.nodes:
        node = idx.by_name.get(p.name)
        if node is None or not node.output:
            out[p.name] = "--"
            continue
        t = node.output[0]
        dtype = quantized_as(t) if p.on == "BPU" else None
        if dtype is None and p.on == "BPU":
            # A BPU node fused with the BPU op after it (Conv + Relu) outputs what that op outputs.
            readers = idx.readers(t)
            if len(readers) == 1 and on.get(readers[0].name) == "BPU" and readers[0].output:
                dtype = quantized_as(readers[0].output[0])
        if dtype is None and p.on == "BPU" and BPU_OPS.get(p.op_type) and BPU_OPS[p.op_type].int32_output:
            dtype = march.tail_output_dtype   # the model-tail Conv's high-accuracy output
        out[p.name] = dtype or elem_type_name(types.get(t, 0))
    return out


def node_columns(placement, quantized: onnx.ModelProto, cosines: Dict[str, float], thresholds: Dict[str, float],
                 march: March) -> Dict[str, List[str]]:
    """The columns after Node, ON, Subgraph and Type, by the march's flow. On a J6 march a node whose
    ``output_dtype`` placement and quantization left unset gets the quantized model's."""
    nodes = placement.nodes
    cos = [f"{cosines[n.name]:.6f}" if n.name in cosines else "--" for n in nodes]
    thr = [f"{thresholds[n.name]:.6f}" if n.name in thresholds else "--" for n in nodes]
    if not march.is_j6:
        return {"Cosine Similarity": cos, "Threshold": thr}
    from_model = model_output_dtypes(placement, quantized, march)
    for n in nodes:
        n.output_dtype = n.output_dtype or from_model[n.name]
    return {"Output Data Type": [n.output_dtype for n in nodes], "Calibrated Cosine": cos, "Threshold": thr}


def node_note(p) -> str:
    """What ``*_node_info.csv``'s Note says of a node ("" when nothing needs saying)."""
    notes = [p.qtype_note, p.cosine_note]
    if p.on == "CPU" and p.reason and not p.qtype_note:  # a qtype note says why more precisely
        notes.insert(0, p.reason)
    if p.output_dtype == FLOAT16 and p.on == "BPU":
        notes.append(f"float16 computed with {FLOAT16_EMULATION} quantization (bpuemu has no float16 BPU kernels)")
    return "; ".join(x for x in notes if x)


def node_rows(placement, columns: Dict[str, List[str]], march: March) -> List[Dict[str, str]]:
    """The table as rows (one dict per node): Node, ON, Subgraph, Type, the columns, and on J6 the Note."""
    rows = []
    for i, n in enumerate(placement.nodes):
        row = {"Node": n.name, "ON": n.on, "Subgraph": f"id({n.subgraph})" if n.subgraph is not None else "--",
               "Type": n.bpu_type, **{k: col[i] for k, col in columns.items()}}
        if march.is_j6:
            row[NOTE] = node_note(n)
        rows.append(row)
    return rows
