"""One pass that rewrites the float model from a plan and its parameters.

``emit_quantized`` writes ``*_quantized_model.onnx`` (standard ONNX QDQ):

* activation tensor t: ``t_QuantizeLinear`` -> ``t_DequantizeLinear`` right
  after its producer; the plan's quantized readers read the DequantizeLinear
  output. A model output made by a BPU node keeps its name on the last
  DequantizeLinear (the runtime's ``<node>_HzDequantize``), its producer
  writes ``t_QuantizeLinear_Input``; with set_model_output_int8/int16 the
  QuantizeLinear output is the model output. An int8 image input becomes an
  int8 graph input read through a DequantizeLinear (scale 1, zero point 0);
* a per-channel tensor read by an op that takes one scale
  (``QuantPlan.single_scale_reads``): ``t_Requantize_QuantizeLinear`` ->
  ``t_Requantize_DequantizeLinear`` after its DequantizeLinear, with the one
  scale of ``params.requantized``; those readers read it, the others the
  per-channel tensor (the BPU's requantize before such an op);
* weight w: int8 initializer ``w_quantized`` + per-channel (axis of the op)
  ``w_DequantizeLinear``, zero point 0;
* bias: int32 initializer with scale s_x * s_w (per output channel) and a
  DequantizeLinear, as the BPU accumulates in int32. When |bias / scale| would
  not fit int32 (tiny scales of int16 inputs) that channel's bias scale grows
  to |bias| / 2^30.

``emit_calibrated`` writes ``*_calibrated_model.onnx``: the float model with a
``<tensor>_HzCalibration`` node (domain "horizon") on every quantized
activation and weight, holding thresholds, scales, zero points, quant type and
method as attributes (and ``<tensor>_Requantize_HzCalibration`` after it where
the quantized model requantizes). ``calibrated_to_fakequant`` turns those nodes into
QuantizeLinear + DequantizeLinear (optionally only some of them), so stock
onnxruntime runs the calibrated model.
"""
import copy
from typing import Collection, Dict, List, Optional, Set, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.errors import InvalidInput
from bpuemu.host.onnxgraph import DQ, Q, GraphIndex, convert_opset, default_opset
from bpuemu.host.quant.graph import INT16_OPSET
from bpuemu.host.quant.marking import QuantPlan
from bpuemu.host.quant.params import NP_DTYPE, TensorQuant, WeightQuant, requantized

HORIZON_DOMAIN = "horizon"
CALIBRATION_OP = "HzCalibration"
INT32_LIMIT = 2 ** 31 - 1
_ELEM = {"int8": TensorProto.INT8, "int16": TensorProto.INT16}


class _Names:
    """Fresh tensor/node names that do not collide with the model's."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.used: Set[str] = {t.name for t in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
        for n in g.node:
            self.used.update(n.input)
            self.used.update(n.output)
            self.used.add(n.name)

    def __call__(self, name: str) -> str:
        out, k = name, 1
        while out in self.used:
            out = f"{name}_{k}"
            k += 1
        self.used.add(out)
        return out


def _axis_attrs(axis: Optional[int]) -> dict:
    return {"axis": int(axis)} if axis is not None else {}


def bias_values(plan: QuantPlan, node: str, corrections: Dict[str, np.ndarray]) -> Optional[np.ndarray]:
    site = plan.biases[node]
    if node in corrections:
        return np.asarray(corrections[node], np.float32)
    if site.tensor is None:
        return None
    return numpy_helper.to_array(next(t for t in plan.model.graph.initializer if t.name == site.tensor)).astype(np.float32)


def quantize_bias(b: np.ndarray, input_q: TensorQuant, weight_q: WeightQuant, period: int) -> Tuple[np.ndarray, np.ndarray]:
    """int32 bias and its per-channel scale s_x * s_w (see the module docstring)."""
    s_x = np.float32(np.max(input_q.scale))
    s_w = weight_q.scale[np.arange(b.size) % period]
    scale = (s_x * s_w).astype(np.float32)
    with np.errstate(over="ignore"):  # a near-zero weight channel's tiny scale: handled just below
        too_big = np.abs(b) / scale > INT32_LIMIT
    if np.any(too_big):
        scale = np.where(too_big, np.abs(b) / np.float32(2 ** 30), scale).astype(np.float32)
    q = np.clip(np.rint(b / scale), -INT32_LIMIT, INT32_LIMIT).astype(np.int32)
    return q, scale


class _Rewrite:
    """What one emit pass builds on a copy of the plan's model, then applies (``finish``): nodes to
    put before all others (``pre``) or right after a node (``after``), node inputs to read another
    tensor (``rewire``), node outputs to rename (``out_renames``) and new initializers."""

    def __init__(self, plan: QuantPlan):
        self.model = copy.deepcopy(plan.model)
        self.idx = GraphIndex(self.model)
        self.fresh = _Names(self.model)
        self.pre: List[onnx.NodeProto] = []
        self.after: Dict[str, List[onnx.NodeProto]] = {}
        self.rewire: Dict[Tuple[str, int], str] = {}
        self.out_renames: Dict[Tuple[str, int], str] = {}
        self.inits: List[TensorProto] = []

    def hand_over_output(self, t: str, suffix: str) -> str:
        """Model output ``t`` is made by what follows its producer: the producer writes a fresh
        tensor ``<t>_<suffix>`` instead, returned."""
        src = self.fresh(f"{t}_{suffix}")
        prod = self.idx.producer[t]
        self.out_renames[(prod.name, list(prod.output).index(t))] = src
        return src

    def place(self, producer: Optional[str], nodes: List[onnx.NodeProto]) -> None:
        """``nodes`` go right after ``producer``, or before every node for a model input or a weight."""
        (self.pre if producer is None else self.after.setdefault(producer, [])).extend(nodes)

    def qparams(self, t: str, q: TensorQuant) -> Tuple[str, str]:
        """New initializers ``<t>_scale`` and ``<t>_zero_point`` holding ``q``'s; their names."""
        s, z = self.fresh(f"{t}_scale"), self.fresh(f"{t}_zero_point")
        self.inits.append(numpy_helper.from_array(np.asarray(q.scale, np.float32), s))
        self.inits.append(numpy_helper.from_array(q.zero_point_array(), z))
        return s, z

    def dequantized_constant(self, base: str, quantized: np.ndarray, scale: np.ndarray, zero_point: np.ndarray,
                             axis: int) -> str:
        """A quantized constant (a weight, a bias) as initializers and the DequantizeLinear before every node
        that reads it; the name of its dequantized tensor."""
        qi, s, z, out = (self.fresh(f"{base}_quantized"), self.fresh(f"{base}_scale"), self.fresh(f"{base}_zero_point"),
                         self.fresh(f"{base}_DequantizeLinear_Output"))
        self.inits += [numpy_helper.from_array(quantized, qi), numpy_helper.from_array(scale, s),
                       numpy_helper.from_array(zero_point, z)]
        self.pre.append(helper.make_node(DQ, [qi, s, z], [out], name=self.fresh(f"{base}_DequantizeLinear"), axis=axis))
        return out

    def finish(self) -> onnx.ModelProto:
        m = self.model
        g = m.graph
        nodes = list(self.pre)
        appended: Dict[str, List[Tuple[int, str]]] = {}
        for (name, k), new in self.rewire.items():
            appended.setdefault(name, []).append((k, new))
        for n in g.node:
            for k, new in sorted(appended.get(n.name, [])):
                if k < len(n.input):
                    n.input[k] = new
                else:  # an input the node did not have (a corrected bias where there was none)
                    while len(n.input) < k:
                        n.input.append("")
                    n.input.append(new)
            for k in range(len(n.output)):
                if (n.name, k) in self.out_renames:
                    n.output[k] = self.out_renames[(n.name, k)]
            nodes.append(n)
            nodes.extend(self.after.get(n.name, []))
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(self.inits)
        # Float weights replaced by their int8 versions go (and so do graph inputs naming them, old IR style).
        used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dropped = {t.name for t in g.initializer if t.name not in used}
        keep = [t for t in g.initializer if t.name in used]
        del g.initializer[:]
        g.initializer.extend(keep)
        inputs = [i for i in g.input if i.name not in dropped]
        del g.input[:]
        g.input.extend(inputs)
        del g.value_info[:]
        m.producer_name = "bpuemu"
        return m


def emit_quantized(
    plan: QuantPlan,
    acts: Dict[str, TensorQuant],
    weights: Dict[str, WeightQuant],
    corrections: Optional[Dict[str, np.ndarray]] = None,
    output_type: str = "float",
) -> onnx.ModelProto:
    corrections = corrections or {}
    r = _Rewrite(plan)
    for t, site in plan.activations.items():
        if site.fixed_int8:
            _dequantize_int8_input(r, t, site, acts[t])
        else:
            _quantize_activation(r, plan, t, site, acts[t], output_type)
    for w, site in plan.weights.items():
        _quantize_weight(r, w, site, weights[w])
    for node, site in plan.biases.items():
        _quantize_bias(r, plan, node, site, acts, weights, corrections)
    return r.finish()


def _dequantize_int8_input(r: _Rewrite, t: str, site, q: TensorQuant) -> None:
    """Model input ``t`` arrives as int8: the graph input says so, and a DequantizeLinear feeds its readers."""
    s, z = r.qparams(t, q)
    for vi in r.model.graph.input:
        if vi.name == t:
            vi.type.tensor_type.elem_type = TensorProto.INT8
    dq_out = r.fresh(f"{t}_DequantizeLinear_Output")
    r.pre.append(helper.make_node(DQ, [t, s, z], [dq_out], name=r.fresh(f"{t}_DequantizeLinear"), **_axis_attrs(q.axis)))
    for reader in site.quantized_readers:
        r.rewire[reader] = dq_out


def _quantize_activation(r: _Rewrite, plan: QuantPlan, t: str, site, q: TensorQuant, output_type: str) -> None:
    """A QuantizeLinear after ``t``'s producer and, for its quantized readers (or a float model output), a
    DequantizeLinear; a model output made on the BPU is handed over to them (in its quantized type unless
    ``output_type`` is "float")."""
    s, z = r.qparams(t, q)
    ax = _axis_attrs(q.axis)
    src, q_out, dq_out = t, None, None
    if site.is_graph_output and site.producer_on_bpu:
        src = r.hand_over_output(t, "QuantizeLinear_Input")
        if output_type != "float":
            q_out = t
            for vi in r.model.graph.output:
                if vi.name == t:
                    vi.type.tensor_type.elem_type = _ELEM[q.dtype]
        else:
            dq_out = t
    q_out = q_out or r.fresh(f"{t}_QuantizeLinear_Output")
    new = [helper.make_node(Q, [src, s, z], [q_out], name=r.fresh(f"{t}_QuantizeLinear"), **ax)]
    if dq_out is not None or site.quantized_readers:
        dq_out = dq_out or r.fresh(f"{t}_DequantizeLinear_Output")
        new.append(helper.make_node(DQ, [q_out, s, z], [dq_out], name=r.fresh(f"{t}_DequantizeLinear"), **ax))
    for reader in site.quantized_readers:
        r.rewire[reader] = dq_out
    r.place(site.producer, new + _requantize(r, plan, t, q, dq_out))


def _requantize(r: _Rewrite, plan: QuantPlan, t: str, q: TensorQuant, dq_out: Optional[str]) -> List[onnx.NodeProto]:
    """Per-channel ``t`` requantized to one scale for its readers that take one; they read it."""
    reads = plan.single_scale_reads.get(t)
    if not reads or not q.per_channel or dq_out is None:
        return []
    s, z = r.qparams(f"{t}_requantize", requantized(q))
    q_out, out = r.fresh(f"{t}_Requantize_QuantizeLinear_Output"), r.fresh(f"{t}_Requantize_DequantizeLinear_Output")
    for reader in reads:
        r.rewire[reader] = out
    return [helper.make_node(Q, [dq_out, s, z], [q_out], name=r.fresh(f"{t}_Requantize_QuantizeLinear")),
            helper.make_node(DQ, [q_out, s, z], [out], name=r.fresh(f"{t}_Requantize_DequantizeLinear"))]


def _quantize_weight(r: _Rewrite, w: str, site, wq: WeightQuant) -> None:
    """Weight ``w`` as int8 with its per-channel scales; its readers read it dequantized."""
    out = r.dequantized_constant(w, wq.quantized.astype(np.int8), wq.scale.astype(np.float32),
                                 np.zeros(wq.scale.shape, np.int8), wq.axis)
    for reader in site.readers:
        r.rewire[reader] = out


def _quantize_bias(r: _Rewrite, plan: QuantPlan, node: str, site, acts: Dict[str, TensorQuant],
                   weights: Dict[str, WeightQuant], corrections: Dict[str, np.ndarray]) -> None:
    """``node``'s bias (corrected where a correction was computed) quantized to int32 (``quantize_bias``); ``node``
    reads it dequantized."""
    b = bias_values(plan, node, corrections)
    if b is None or site.activation not in acts or site.weight not in weights:
        return
    qb, scale = quantize_bias(b, acts[site.activation], weights[site.weight], site.period)
    out = r.dequantized_constant(site.tensor or f"{node}_bias", qb, scale, np.zeros(scale.shape, np.int32), 0)
    r.rewire[(node, site.index)] = out


def _floats(a) -> List[float]:
    return [float(v) for v in np.asarray(a, np.float64).reshape(-1)]


def _ints(a) -> List[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def emit_calibrated(
    plan: QuantPlan,
    acts: Dict[str, TensorQuant],
    weights: Dict[str, WeightQuant],
    corrections: Optional[Dict[str, np.ndarray]] = None,
) -> onnx.ModelProto:
    corrections = corrections or {}
    r = _Rewrite(plan)
    fresh, rewire = r.fresh, r.rewire

    def calib_node(t: str, src: str, out: str, kind: str, q) -> onnx.NodeProto:
        per_channel = q.axis is not None if kind == "activation" else True
        attrs = dict(
            kind=kind,
            quant_type=q.dtype if kind == "activation" else "int8",
            method=q.method,
            thresholds=_floats(q.threshold),
            scales=_floats(q.scale),
            zero_points=_ints(q.zero_point if kind == "activation" else np.zeros(q.scale.shape, np.int64)),
        )
        if per_channel:
            attrs["axis"] = int(q.axis)
        return helper.make_node(CALIBRATION_OP, [src], [out], name=fresh(f"{t}_HzCalibration"), domain=HORIZON_DOMAIN, **attrs)

    for t, site in plan.activations.items():
        q = acts[t]
        if site.is_graph_output and site.producer_on_bpu:
            src = r.hand_over_output(t, "HzCalibration_Input")
            out = t
        else:
            src, out = t, fresh(f"{t}_HzCalibration_Output")
        nodes = [calib_node(t, src, out, "activation", q)]
        for reader in site.quantized_readers:
            rewire[reader] = out
        reads = plan.single_scale_reads.get(t)
        if reads and q.per_channel:
            requantized_out = fresh(f"{t}_Requantize_HzCalibration_Output")
            nodes.append(calib_node(f"{t}_Requantize", out, requantized_out, "activation", requantized(q)))
            for reader in reads:
                rewire[reader] = requantized_out
        r.place(site.producer, nodes)

    for w, site in plan.weights.items():
        out = fresh(f"{w}_HzCalibration_Output")
        r.pre.append(calib_node(w, w, out, "weight", weights[w]))
        for reader in site.readers:
            rewire[reader] = out

    for node, b in corrections.items():
        site = plan.biases.get(node)
        if site is None:
            continue
        name = fresh(f"{site.tensor or node + '_bias'}_corrected")
        r.inits.append(numpy_helper.from_array(np.asarray(b, np.float32), name))
        rewire[(node, site.index)] = name

    r.model.opset_import.append(helper.make_opsetid(HORIZON_DOMAIN, 1))
    return r.finish()


def calibration_nodes(model: onnx.ModelProto) -> List[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == CALIBRATION_OP]


def calibrated_to_fakequant(model: onnx.ModelProto, enabled: Optional[Collection[str]] = None,
                            keep_names: bool = False) -> onnx.ModelProto:
    """Replace HzCalibration nodes by QuantizeLinear + DequantizeLinear.

    ``enabled``: names of the calibration nodes to keep quantizing (default:
    all); the others are bypassed, so the float value flows through (what the
    accuracy debugger toggles). With ``keep_names`` a bypassed node becomes an
    Identity, so every tensor name of the calibrated model exists in every
    variant (the debugger compares tensors by name across variants).
    """
    m = copy.deepcopy(model)
    g = m.graph
    enabled_set = None if enabled is None else set(enabled)
    fresh = _Names(m)
    nodes: List[onnx.NodeProto] = []
    inits: List[TensorProto] = []
    bypass: Dict[str, str] = {}
    outputs = {o.name for o in g.output}
    needs_int16 = False
    for n in g.node:
        if n.op_type != CALIBRATION_OP:
            nodes.append(n)
            continue
        if enabled_set is not None and n.name not in enabled_set:
            if n.output[0] in outputs or keep_names:
                nodes.append(helper.make_node("Identity", [n.input[0]], [n.output[0]], name=n.name))
            else:
                bypass[n.output[0]] = n.input[0]
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        dtype = a["quant_type"].decode() if isinstance(a["quant_type"], bytes) else a["quant_type"]
        needs_int16 |= dtype == "int16"
        axis = a.get("axis")
        shape = (-1,) if axis is not None else ()
        s, z, mid = fresh(f"{n.name}_scale"), fresh(f"{n.name}_zero_point"), fresh(f"{n.name}_quantized")
        inits.append(numpy_helper.from_array(np.asarray(a["scales"], np.float32).reshape(shape), s))
        inits.append(numpy_helper.from_array(np.asarray(a["zero_points"]).astype(NP_DTYPE[dtype]).reshape(shape), z))
        ax = _axis_attrs(axis)
        nodes.append(helper.make_node(Q, [n.input[0], s, z], [mid], name=fresh(f"{n.name}_QuantizeLinear"), **ax))
        nodes.append(helper.make_node(DQ, [mid, s, z], [n.output[0]], name=fresh(f"{n.name}_DequantizeLinear"), **ax))
    for n in nodes:
        for k, i in enumerate(n.input):
            while i in bypass:
                i = bypass[i]
            n.input[k] = i
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(inits)
    keep = [o for o in m.opset_import if o.domain != HORIZON_DOMAIN]
    del m.opset_import[:]
    m.opset_import.extend(keep)
    if needs_int16 and default_opset(m) < INT16_OPSET:
        try:
            m = convert_opset(m, INT16_OPSET)
        except InvalidInput as exc:
            raise InvalidInput(f"the calibrated model has int16 calibration nodes but {exc}") from None
    return m
