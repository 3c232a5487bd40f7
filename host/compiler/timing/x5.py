"""The X5 timing model: its one parameter table and its cost formulas.

Every timing figure bpuemu prints comes from here: makertbin's estimate line,
hb_perf (summary, per-layer table, HTML, JSON) and, through the times
makertbin stores in the `.bin` (PlanStep.x5_us, Model.x5_timing), the X5 block
of ``hrt_model_exec perf`` and ``--timing x5`` (bpuemu.common.x5_timing).

The model, per frame of a compiled plan:

    BPU layer (one compute node of a BPU subgraph; features in ``layers``)
        compute   = work / rate(kind) + launches * layer_overhead   [cycles; 0 for a fused layer]
                    kind    work                          rate
                    conv    aligned MACs (kernel > 1)     peak_macs * conv_efficiency
                    conv1x1 aligned MACs (1x1 conv, Gemm) peak_macs * conv1x1_efficiency
                    dwconv  MACs (depthwise: 1 input channel a group) dwconv_macs_per_cycle
                    matmul  aligned MACs (MatMul of two   peak_macs * conv1x1_efficiency, run
                            activations: attention)       once per head: launches = the batch
                                                          dims, pixels = the rows of one head,
                                                          + matmul_head_us a launch (its operand
                                                          loaded as the MAC array's weights)
                    vector  aligned output elements       vector_elems_per_cycle
                            (elementwise, pooling, reductions, softmax, other)
                    lut     aligned output elements       lut_elems_per_cycle (Sigmoid, Tanh, Exp, ...)
                    move    bytes moved                   move_bytes_per_cycle
                            (Concat, Transpose, Resize, Slice, Split, Pad)
                    view    0                             (Reshape, Flatten)
                    "aligned": channels padded to channel_align (NHWC; a conv pays the
                    padding of its output and input channels per group); the MAC kinds'
                    rate falls on small feature maps: x HW / (HW + mac_half_pixels)
                  + repacked bytes / move_bytes_per_cycle (compile_mode bandwidth)
        memory    = DDR bytes / ddr_bytes_per_cycle
                    loaded: weights, the subgraph's inputs, spilled intermediates (a tensor
                    larger than sram_bytes); stored: subgraph outputs and spills
        latency   = max(compute, memory)
    lookup tables (``fusion``): a chain of elementwise ops whose one non-constant input is an
                    int8 tensor (GELU's Div, Erf, Add, Mul, Mul; SiLU; a decomposed HardSwish) is
                    one table: its last op a lut pass over its output, the others fused
    one BPU graph (``estimate.on_chip_tensors``): where bpuemu's plan cuts the X5's graph into
                    steps around the CPU ops the X5 runs on its BPU (X5_BPU_EXTRA: Erf, Div,
                    Sqrt, ReduceMax, ...), the tensors handed between them stay in SRAM (DDR only
                    above sram_bytes, one byte an element), and the run pays one subgraph_overhead
    gate barrier  = gate_barrier_us for each elementwise layer that applies a 1x1-spatial gate to a map
                    (squeeze-excitation): the gate needs the whole map pooled first
    BPU subgraph  = subgraph_overhead + the sum of its layers' latencies
    input conversion (Preprocess; nv12 -> yuv444, the -128 shift) = its output elements
                    / vector_elems_per_cycle, on the BPU for image inputs (nv12, yuv444, rgb,
                    bgr, gray: the X5 compiles it into its graph) and whenever bpuemu's plan
                    compiles it into the subgraph, else on the CPU at convert_elem_ns
    CPU op        = cpu_op_overhead + elements (inputs + outputs) * cpu_elem_ns
    _HzDequantize, _HzQuantize, layout converts (CPU) = elements * convert_elem_ns
    task          = task_overhead + output bytes * output_byte_ns (CPU, per frame: the runtime's
                    submission and completion, and its output buffers)

    makertbin's line: latency = the sum of the BPU steps, FPS = 1 / latency (the BPU
    busy all the time, as the real compiler's line), DDR = loaded + stored bytes.
    hrt_model_exec perf's X5 block schedules the steps on 1 BPU + 8 A55 cores for its
    thread_num (bpuemu.common.x5_timing).

Parameters are in ``PARAMETERS`` (value, unit, provenance). The "fitted" ones are
set by ``bench/x5_fit.py`` (least squares on the log errors of the published 1-thread
latency and multi-thread FPS of bench/x5_fit.csv and bench/x5_check.csv, on nv12 .bins as the
boards run them, every model weighted alike, and of makertbin's line against the real
compiler's where it is published); re-run it with ``--write``
to refit, and it rewrites the values below between the FITTED markers.

The compile strategy a model records changes the layer costs
(bpuemu.host.compiler.timing.strategy): bandwidth mode stores outputs and spills
packed (valid bytes instead of the aligned layout's) and repacks them; balance N
mixes the two N:100-N; below O3 intermediates spill above half the SRAM, below O2
latency = compute + memory, at O0 nothing is fused.
"""
from dataclasses import dataclass, field, replace
from typing import Dict

import numpy as np

#: Layer kinds of the model, in the order of the fit's feature arrays.
KINDS = ("conv", "conv1x1", "dwconv", "matmul", "vector", "lut", "move", "view")

#: KINDS[:MAC_KINDS] run on the MAC array.
MAC_KINDS = 4

SPEC, ASSUMED, FITTED = "X5 published specification", "assumed", "fitted"


@dataclass(frozen=True)
class Param:
    value: float
    unit: str
    provenance: str
    doc: str


# --- the parameter table ---------------------------------------------------------------------------
#: Where bench/x5_fit.py starts, and what its weak ridge pulls towards: physical guesses (assumed).
START_VALUES = {
    "conv_efficiency": 0.35,
    "conv1x1_efficiency": 0.25,
    "dwconv_macs_per_cycle": 128.0,
    "vector_elems_per_cycle": 64.0,
    "lut_elems_per_cycle": 32.0,
    "move_bytes_per_cycle": 64.0,
    "ddr_bytes_per_cycle": 8.0,
    "layer_overhead_us": 2.0,
    "subgraph_overhead_us": 30.0,
    "cpu_elem_ns": 5.0,
    "cpu_op_overhead_us": 20.0,
    "convert_elem_ns": 2.0,
    "task_overhead_us": 200.0,
    "output_byte_ns": 1.0,
    "mac_half_pixels": 64.0,
    "matmul_head_us": 2.0,
    "gate_barrier_us": 5.0,
}
# FITTED-BEGIN (bench/x5_fit.py rewrites the block between these markers)
FIT_SOURCE = 'fitted by bench/x5_fit.py on x5_fit.csv + x5_check.csv (66 models, nv12 .bins), 2026-12-03'
FITTED_VALUES = {
    'conv_efficiency': 0.581528,
    'conv1x1_efficiency': 0.521207,
    'dwconv_macs_per_cycle': 159.402,
    'vector_elems_per_cycle': 40.0257,
    'lut_elems_per_cycle': 16.3086,
    'move_bytes_per_cycle': 58.5139,
    'ddr_bytes_per_cycle': 21.0849,
    'layer_overhead_us': 0.278765,
    'subgraph_overhead_us': 7.40193,
    'cpu_elem_ns': 5,
    'cpu_op_overhead_us': 20,
    'convert_elem_ns': 2,
    'task_overhead_us': 195.412,
    'output_byte_ns': 2.19625,
    'mac_half_pixels': 358.274,
    'matmul_head_us': 48.0465,
    'gate_barrier_us': 2.48808,
}
# FITTED-END

_FITTED_DOCS = {
    "conv_efficiency": ("fraction of peak", "MAC-array efficiency of a dense convolution with a kernel > 1"),
    "conv1x1_efficiency": ("fraction of peak", "MAC-array efficiency of a 1x1 convolution and of Gemm"),
    "dwconv_macs_per_cycle": ("MACs/cycle", "depthwise convolution rate (unaligned MACs; a grouped conv with several "
                                             "channels a group is costed as a dense conv per group)"),
    "vector_elems_per_cycle": ("elements/cycle", "vector unit: elementwise, pooling, reductions, softmax, the input conversion"),
    "lut_elems_per_cycle": ("elements/cycle", "lookup-table activations (Sigmoid, Tanh, Exp, HardSwish, Pow)"),
    "move_bytes_per_cycle": ("bytes/cycle", "data movement: Concat, Transpose, Resize, Slice, Split, Pad, repacking"),
    "ddr_bytes_per_cycle": ("bytes/cycle", "effective DDR bandwidth of the BPU (x clock = bytes/s)"),
    "layer_overhead_us": ("us", "fixed cost of each BPU layer that is not fused"),
    "subgraph_overhead_us": ("us", "fixed cost of each BPU subgraph (function call setup)"),
    "cpu_elem_ns": ("ns/element", "CPU operator on an A55 core, per input+output element"),
    "cpu_op_overhead_us": ("us", "fixed cost of each CPU operator"),
    "convert_elem_ns": ("ns/element", "_HzDequantize / _HzQuantize / layout convert on an A55 core, per element"),
    "task_overhead_us": ("us", "per frame on the CPU: the runtime's task submission and completion"),
    "output_byte_ns": ("ns/byte", "per frame on the CPU, per byte of the model's outputs: handing the output buffers over"),
    "mac_half_pixels": ("pixels", "output H x W at which the MAC array runs at half its rate (small feature maps fill "
                                  "it poorly: rate x HW / (HW + this))"),
    "matmul_head_us": ("us", "per head of a MatMul of two activations (attention): its second operand written out "
                             "and loaded into the MAC array's weight buffer before the head can start"),
    "gate_barrier_us": ("us", "per broadcast of a globally pooled gate over the map it was pooled from (the "
                              "squeeze-excitation's Mul): the layer pipeline drains, as the gate needs the whole map "
                              "first, and refills"),
}


#: Parameters the fit set cannot see, kept at their start values: the published models converted with
#: --fast-perf run all their work on the BPU (no CPU operator, no _HzDequantize step in their plans).
NOT_FITTED = {"cpu_elem_ns": "an A55 core at 1.8 GHz, ~9 cycles per element of a float operator",
              "cpu_op_overhead_us": "a CPU operator's call into the runtime",
              "convert_elem_ns": "an A55 core at 1.8 GHz, ~4 cycles per element of a (de)quantize or transpose"}


def _table(fitted: Dict[str, float], source: str) -> Dict[str, Param]:
    table = {
        "clock_hz": Param(1.0e9, "Hz", SPEC, "BPU clock (Bayes-e core at 1 GHz)"),
        "peak_macs_per_cycle": Param(5000.0, "MACs/cycle", SPEC, "10 TOPS int8 at 1 GHz = 10,000 OPs = 5,000 MACs per cycle"),
        "cpu_cores": Param(8, "cores", SPEC, "Cortex-A55 at 1.8 GHz (bpuemu.common.x5_timing.X5_CPU_CORES)"),
        "channel_align": Param(8, "channels", ASSUMED, "the MAC array and vector unit work on channel groups of this size"),
        "sram_bytes": Param(float(1 << 20), "bytes", ASSUMED, "on-chip SRAM: a larger intermediate spills to DDR"),
    }
    for name, value in fitted.items():
        unit, doc = _FITTED_DOCS[name]
        if name in NOT_FITTED:
            prov = f"{ASSUMED} ({NOT_FITTED[name]}; the fit set has no CPU operators to fit it on)"
        elif "not fitted" in source:
            prov = f"{ASSUMED} ({source})"
        else:
            prov = f"{FITTED} ({source})"
        table[name] = Param(float(value), unit, prov, doc)
    return table


PARAMETERS: Dict[str, Param] = _table(FITTED_VALUES, FIT_SOURCE)


def align(value: int, to: int) -> int:
    return -(-int(value) // to) * to if value > 0 else 0


@dataclass(frozen=True)
class X5Bpu:
    """The parameters as numbers (``PARAMETERS``' values), with overrides for hb_perf and the fit."""

    values: Dict[str, float] = field(default_factory=lambda: {k: p.value for k, p in PARAMETERS.items()})
    source: str = FIT_SOURCE

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def with_values(self, **values) -> "X5Bpu":
        unknown = set(values) - set(self.values)
        if unknown:
            raise KeyError(f"unknown X5 timing parameter(s): {sorted(unknown)}")
        return replace(self, values={**self.values, **values}, source=self.source + " (overridden)")

    def with_ddr_bandwidth(self, gb_per_s: float) -> "X5Bpu":
        return self.with_values(ddr_bytes_per_cycle=gb_per_s * 1e9 / self.clock_hz)

    @property
    def channel_align_int(self) -> int:
        return int(self.values["channel_align"])

    @property
    def ddr_bytes_per_s(self) -> float:
        return self.ddr_bytes_per_cycle * self.clock_hz

    def rates(self) -> np.ndarray:
        """Work units per cycle of each layer kind (``KINDS`` order; 0 for view)."""
        peak = self.peak_macs_per_cycle
        return np.array([peak * self.conv_efficiency, peak * self.conv1x1_efficiency, self.dwconv_macs_per_cycle,
                         peak * self.conv1x1_efficiency, self.vector_elems_per_cycle, self.lut_elems_per_cycle,
                         self.move_bytes_per_cycle, 0.0])

    def us(self, cycles):
        return cycles / self.clock_hz * 1e6

    def cycles(self, us):
        return us * self.clock_hz / 1e6

    def layer_cycles(self, kind, work, repacked, ddr_bytes, fused, overlaps: bool = True, pixels=None, launches=None,
                     barriers=None):
        """(compute, memory, latency) cycles of layers: numpy arrays (or scalars) of their features.

        ``kind`` indexes ``KINDS``; ``fused`` layers run in the output stage of the layer before;
        ``pixels``: the output's H x W (the MAC kinds' rate falls on small feature maps); ``launches``: how many
        times the layer is started (a MatMul of two activations once per head; default 1); ``barriers``: 1 for a
        layer that broadcasts a globally pooled gate over a map (default 0).
        """
        rates = self.rates()
        kind = np.asarray(kind, dtype=np.int64)
        rate = rates[kind]
        if pixels is not None:
            px = np.asarray(pixels, dtype=np.float64)
            rate = np.where(kind < MAC_KINDS, rate * px / (px + self.mac_half_pixels), rate)
        compute = np.where(rate > 0, np.asarray(work, dtype=np.float64) / np.where(rate > 0, rate, 1.0), 0.0)
        active = ~np.asarray(fused, dtype=bool) & (kind != KINDS.index("view"))
        starts = 1.0 if launches is None else np.asarray(launches, dtype=np.float64)
        per_start = self.cycles(self.layer_overhead_us) + np.where(kind == KINDS.index("matmul"),
                                                                   self.cycles(self.matmul_head_us), 0.0)
        compute = np.where(active, compute + starts * per_start, 0.0)
        if barriers is not None:
            compute = compute + np.asarray(barriers, dtype=np.float64) * self.cycles(self.gate_barrier_us)
        compute = compute + np.asarray(repacked, dtype=np.float64) / self.move_bytes_per_cycle
        memory = np.asarray(ddr_bytes, dtype=np.float64) / self.ddr_bytes_per_cycle
        latency = np.maximum(compute, memory) if overlaps else compute + memory
        return compute, memory, latency

    def parameters(self) -> Dict[str, object]:
        """The parameter table as the report lists it: name -> value."""
        return dict(self.values)

    def table(self):
        """[(name, value, unit, provenance, doc)] for the report."""
        out = []
        for name, p in PARAMETERS.items():
            value = self.values.get(name, p.value)
            prov = p.provenance if value == p.value else "overridden for this run"
            out.append((name, value, p.unit, prov, p.doc))
        return out


X5_BPU = X5Bpu()
PARAMETERS_VERSION = f"x5-timing ({FIT_SOURCE})"
