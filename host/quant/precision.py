"""Each node's resolved precision after quantization: what the node table's "Output Data Type" shows,
and why a configured qtype did not take effect (ptq_faq_j6, "quant_config qtype is set but does
not take effect?").

Placement (bpuemu.host.compiler.placement and j6rules) decides ON and the
tail Conv's int32/float32; quantization decides which BPU tensors are int16.
``resolve_precision`` reads both into ``NodePlacement.output_dtype`` and
``qtype_note``, naming one of the FAQ's three reasons for a qtype that did not
take effect: the op's constraint, the tail rule, passive quantization.
"""
import logging
from typing import List, Mapping

from bpuemu.host.compiler.optable import BPU_OPS
from bpuemu.host.quant.marking import INT16_OPS, QuantPlan
from bpuemu.host.quant.quant_config import MODEL, Resolved

#: The qtypes quantization itself decides (float ones are decided by placement).
_INT_QTYPES = ("int8", "int16")
FLOAT16 = "float16"
#: How bpuemu computes a BPU node configured float16 (nash-b/h/p): its output quantized to int16.
FLOAT16_EMULATION = "int16"


def _is_passive(op_type: str) -> bool:
    return op_type in BPU_OPS and not BPU_OPS[op_type].active


def _constraint_note(plan: QuantPlan, group, name: str, march_name: str) -> str:
    """Why an int16 request on ``name``'s output group fell back to int8."""
    idx_ops = {n.name: n.op_type for n in plan.model.graph.node}
    touching = {n for t in group.members for n, _ in plan.activations[t].quantized_readers}
    touching |= {plan.activations[t].producer for t in group.members if plan.activations[t].producer_on_bpu}
    bad = sorted(n for n in touching if n in plan.bpu_nodes and idx_ops.get(n) not in INT16_OPS)
    if idx_ops.get(name) not in INT16_OPS:
        return f"op constraint: {idx_ops.get(name)} does not compute in int16 on {march_name}'s BPU; it stays int8"
    if bad:
        return (f"op constraint: its output is read by {', '.join(bad)} ({', '.join(sorted({idx_ops[n] for n in bad}))}),"
                f" which does not take int16 on {march_name}'s BPU; it stays int8")
    return "op constraint: the model's opset cannot hold int16 tensors (see the opset line above); it stays int8"


def resolve_precision(placement, plan: QuantPlan, resolved: Mapping[str, Resolved], march_name: str,
                      log: logging.Logger) -> List[str]:
    """Set BPU nodes' output_dtype from the quantization plan and add the qtype notes quantization
    explains; log one WARNING per configured qtype that does not take effect. Returns those lines."""
    nodes = {n.name: n for n in plan.model.graph.node}
    emulated: List[str] = []
    for p in placement.nodes:
        n = nodes.get(p.name)
        if p.on != "BPU" or p.high_precision or n is None or not n.output or p.output_dtype not in ("", "int8"):
            continue
        out = n.output[0]
        if out not in plan.activations:
            continue
        group = plan.group_of(out)
        p.output_dtype = group.dtype
        r = resolved.get(p.name)
        if r is not None and r.qtype == FLOAT16 and group.dtype == FLOAT16_EMULATION and not _is_passive(p.op_type):
            p.output_dtype = FLOAT16
            emulated.append(p.name)
            continue
        wanted = FLOAT16_EMULATION if r is not None and r.qtype == FLOAT16 else (r.qtype if r is not None else None)
        if r is None or wanted not in _INT_QTYPES or wanted == group.dtype or p.qtype_note:
            continue
        if _is_passive(p.op_type):
            p.qtype_note = (f"passive quantization: {r.describe()} does not take effect; {p.op_type} takes the "
                            f"threshold and type of the ops around it ({group.dtype})")
        elif wanted == "int16":
            p.qtype_note = _constraint_note(plan, group, p.name, march_name)
        else:
            p.qtype_note = (f"passive quantization: {r.describe()} does not take effect; its output shares one scale "
                            f"with ops configured {group.dtype} (the passive ops after it)")
    if emulated:
        log.info("quant_config: float16 on %s's BPU is emulated with int16 quantization (bpuemu has no float16 "
                 "BPU kernels): %s", march_name, ", ".join(emulated))
    lines = []
    for p in placement.nodes:
        if p.qtype_note:
            line = f"quant_config: node {p.name} ({p.op_type}) output {p.output_dtype or 'float32'} on {p.on}: {p.qtype_note}"
            # the model-level default names every node; a qtype given for an op type or a node is a WARNING
            model_default = p.name in resolved and resolved[p.name].qtype_from == MODEL
            log.log(logging.INFO if model_default else logging.WARNING, line)
            lines.append(line)
    return lines


__all__ = ["resolve_precision"]
