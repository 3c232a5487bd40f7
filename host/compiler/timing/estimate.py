"""Static estimates of a model's BPU subgraphs and of the whole model (the numbers hb_perf reports)."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from bpuemu.common import x5_timing
from bpuemu.common.proto import model_pb2
from bpuemu.host.compiler.timing.fusion import NO_FUSION, lut_groups
from bpuemu.host.compiler.timing.layers import X5_BPU_EXTRA, Layer, io_tensors, subgraph_layers
from bpuemu.host.compiler.timing.strategy import CompileStrategy, strategy_of
from bpuemu.host.compiler.timing.x5 import KINDS, X5_BPU, X5Bpu
from bpuemu.host.compiler.plan import DQ, Q, Kind, PlanView, piece_model

MB = float(1 << 20)


@dataclass
class SubgraphEstimate:
    name: str                      # the plan step name, as the profiler names it: BPU_<model>_subgraph_<i>
    layers: List[Layer]
    inputs: List[dict]
    outputs: List[dict]
    overhead_us: float

    @property
    def file_stem(self) -> str:
        """``<model>_subgraph_<i>``: the name of its .html/.json files (the seed's)."""
        return self.name[len("BPU_"):] if self.name.startswith("BPU_") else self.name

    @property
    def ops(self) -> int:
        return sum(layer.ops for layer in self.layers)

    @property
    def loaded_bytes(self) -> int:
        return sum(layer.loaded_bytes for layer in self.layers)

    @property
    def stored_bytes(self) -> int:
        return sum(layer.stored_bytes for layer in self.layers)

    @property
    def ddr_bytes(self) -> int:
        return self.loaded_bytes + self.stored_bytes

    @property
    def latency_us(self) -> float:
        return self.overhead_us + sum(layer.latency_us for layer in self.layers)

    def summary(self) -> Dict[str, object]:
        return {
            "subgraph": self.name,
            "calculation_load_ops_per_frame": self.ops,
            "ddr_loaded_bytes_per_frame": self.loaded_bytes,
            "ddr_stored_bytes_per_frame": self.stored_bytes,
            "ddr_occupation_mb_per_frame": self.ddr_bytes / MB,
            "latency_ms": self.latency_us / 1e3,
            "launch_overhead_us": self.overhead_us,
        }


@dataclass
class StepEstimate:
    """A plan step that is not a BPU subgraph: the input conversion, a CPU op, a (de)quantize, a layout convert."""

    name: str
    kind: str                  # Preprocess | CPU op | Dequantize | Quantize | layout convert
    on_bpu: bool               # the input conversion compiled into the BPU subgraph, a CPU op the X5 runs on the BPU
    elements: int
    latency_us: float
    #: a CPU op the X5 runs on its BPU: its layers, costed as a BPU piece
    layers: Optional["SubgraphEstimate"] = None


@dataclass
class ModelEstimate:
    model_name: str
    subgraphs: List[SubgraphEstimate]
    bpu: X5Bpu
    cpu_steps: List[StepEstimate] = field(default_factory=list)
    strategy: CompileStrategy = field(default_factory=CompileStrategy)
    #: (name, on_bpu, us) of every plan step, in plan order
    plan: List[tuple] = field(default_factory=list)
    #: bytes of the model's outputs as the runtime hands them over (aligned)
    output_bytes: int = 0

    @property
    def task_overhead_us(self) -> float:
        """CPU time per frame outside the steps: the task's fixed cost and its output buffers."""
        return float(self.bpu.task_overhead_us + self.output_bytes * self.bpu.output_byte_ns / 1e3)

    @property
    def latency_us(self) -> float:
        """BPU time per frame (makertbin's line): the subgraphs and the input conversion compiled into them."""
        return sum(us for _, on_bpu, us in self.plan if on_bpu)

    @property
    def latency_ms(self) -> float:
        return self.latency_us / 1e3

    @property
    def cpu_us(self) -> float:
        return self.task_overhead_us + sum(us for _, on_bpu, us in self.plan if not on_bpu)

    @property
    def fps(self) -> Optional[float]:
        return 1e6 / self.latency_us if self.latency_us > 0 else None

    @property
    def bpu_pieces(self) -> List[SubgraphEstimate]:
        """The BPU subgraphs and the CPU ops of the plan that the X5 runs on its BPU, costed as pieces."""
        return list(self.subgraphs) + [s.layers for s in self.cpu_steps if s.layers is not None]

    @property
    def loaded_bytes(self) -> int:
        return sum(s.loaded_bytes for s in self.bpu_pieces)

    @property
    def stored_bytes(self) -> int:
        return sum(s.stored_bytes for s in self.bpu_pieces)

    @property
    def ddr_bytes(self) -> int:
        return self.loaded_bytes + self.stored_bytes

    @property
    def ops(self) -> int:
        return sum(s.ops for s in self.subgraphs)

    def model_steps(self) -> x5_timing.ModelSteps:
        return x5_timing.ModelSteps(self.model_name, tuple(x5_timing.StepTime(n, b, us) for n, b, us in self.plan),
                                    self.task_overhead_us, self.bpu.source)

    def modeled(self, thread_num: int = 1, frame_count: int = 200) -> x5_timing.ModeledPerf:
        """What hrt_model_exec perf on an X5 would show (bpuemu.common.x5_timing.schedule)."""
        return x5_timing.schedule(self.model_steps(), thread_num, frame_count)

    def summary(self) -> Dict[str, object]:
        one = self.modeled(1)
        return {
            "model_name": self.model_name,
            "model_latency_ms": self.latency_ms,
            "fps": self.fps,
            "total_ddr_mb_per_frame": self.ddr_bytes / MB,
            "loaded_bytes_per_frame": self.loaded_bytes,
            "stored_bytes_per_frame": self.stored_bytes,
            "calculation_load_ops_per_frame": self.ops,
            "cpu_ms_per_frame": self.cpu_us / 1e3,
            "task_latency_1thread_ms": one.latency_1thread_ms,
            "compile_mode": self.strategy.compile_mode,
            "balance_factor": self.strategy.balance_factor,
            "optimize_level": self.strategy.optimize_level,
        }

    def line(self) -> str:
        """``FPS=…, latency = … us, DDR = … bytes``."""
        fps = f"{self.fps:.2f}" if self.fps is not None else "inf"
        return f"FPS={fps}, latency = {self.latency_us:.1f} us, DDR = {self.ddr_bytes} bytes"


_STEP_KIND = {Kind.PREPROCESS: "Preprocess", Kind.CPU_OP: "CPU op", Kind.DEQUANTIZE: "Dequantize",
              Kind.QUANTIZE: "Quantize", Kind.LAYOUT_CONVERT: "layout convert"}


def _elements(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def step_elements(model: model_pb2.Model, view: PlanView, step: model_pb2.PlanStep) -> int:
    """The elements a non-BPU step reads and writes (the timing model's CPU work)."""
    if step.kind == Kind.PREPROCESS:
        spec = model.input_specs[step.input_index]
        if spec.input_type_rt == "featuremap" and spec.model_dtype != "float32":
            return 0                                       # handed to the BPU as it is
        return _elements(spec.model_shape)
    if step.kind == Kind.LAYOUT_CONVERT and not step.perm:
        return 0                                           # the layout kept: nothing moves
    if step.kind in (Kind.CPU_OP, Kind.QUANTIZE):
        ins, outs = io_tensors(view.piece(step))
        return sum(_elements(t["shape"]) for t in ins + outs)
    known = [view.tensors[t] for t in step.inputs if t in view.tensors]
    return sum(t.size for t in known)


#: Runtime input types the X5 hands to its BPU as they are: the compiled graph starts with their conversion
#: (nv12 -> yuv444, the colour conversion, the -128 shift) on the BPU, as a published nv12 .bin's hb_perf
#: graph shows no CPU node before its first BPU subgraph. bpuemu's plan converts them in a Preprocess step.
X5_BPU_INPUT_TYPES = ("nv12", "yuv444", "rgb", "bgr", "gray")


def x5_converts_on_bpu(model: model_pb2.Model, step: model_pb2.PlanStep) -> bool:
    """The input conversion of an image input: compiled into the X5's BPU graph (bpuemu's plan may keep it apart)."""
    if step.kind != Kind.PREPROCESS:
        return False
    if step.fused_into_subgraph:
        return True
    return 0 <= step.input_index < len(model.input_specs) and \
        model.input_specs[step.input_index].input_type_rt in X5_BPU_INPUT_TYPES


def step_us(step: model_pb2.PlanStep, elements: int, bpu: X5Bpu, converts_on_bpu: Optional[bool] = None) -> float:
    """The modeled time of a non-BPU step of ``elements`` elements."""
    if step.kind == Kind.PREPROCESS:
        if step.fused_into_subgraph if converts_on_bpu is None else converts_on_bpu:   # on the BPU's vector unit
            return float(bpu.us(elements / bpu.vector_elems_per_cycle))
        return elements * bpu.convert_elem_ns / 1e3        # a conversion on the CPU (0 elements: featuremap as is)
    if step.kind == Kind.CPU_OP:
        return bpu.cpu_op_overhead_us + elements * bpu.cpu_elem_ns / 1e3
    return elements * bpu.convert_elem_ns / 1e3


def x5_runs_on_bpu(step: model_pb2.PlanStep) -> bool:
    """A CPU op of the plan that the X5 runs on its BPU: every operator of it is one the X5 places there."""
    ops = [t for t in step.op_types if t not in (Q, DQ)]
    return step.kind == Kind.CPU_OP and bool(ops) and all(t in X5_BPU_EXTRA for t in ops)


def _charge_subgraph_overheads(order, bpu: X5Bpu) -> None:
    """One subgraph overhead per run of consecutive BPU work on the X5: the X5 compiles such a run as one
    BPU graph. Steps of no time in between do not break a run; the input conversion compiled into a
    subgraph belongs to the run that subgraph starts."""
    previous_bpu = False
    for o in order:
        sub = o if isinstance(o, SubgraphEstimate) else o.layers
        if sub is not None:
            sub.overhead_us = 0.0 if previous_bpu else float(bpu.subgraph_overhead_us)
            previous_bpu = True
        elif o.kind != "Preprocess" and (o.latency_us > 0 or o.on_bpu):
            previous_bpu = o.on_bpu


def _breaks_bpu_graph(step: model_pb2.PlanStep) -> bool:
    """A step between two BPU steps that the X5 runs elsewhere: its graph is split there."""
    if step.kind == Kind.LAYOUT_CONVERT:
        return bool(step.perm)
    return step.kind in (Kind.CPU_OP, Kind.DEQUANTIZE, Kind.QUANTIZE)


def on_chip_tensors(model: model_pb2.Model, bpu_steps) -> frozenset:
    """Tensors one BPU step of the plan hands to others with no step the X5 runs elsewhere in between.

    bpuemu's plan cuts a graph the X5 compiles as one (its BPU subgraphs around the CPU ops the X5 runs on
    its BPU: GELU's Erf, LayerNorm's Div and Sqrt, ...) into steps; between them the X5 keeps the int8
    tensor in its SRAM like any other intermediate, where costing each step as a subgraph of its own would
    store it to DDR and load it back (for a CPU op's float output, four bytes an element).
    ``bpu_steps``: the indexes of the plan steps costed on the BPU."""
    plan = list(model.plan)
    made_by = {t: i for i, step in enumerate(plan) if i in bpu_steps for t in step.outputs}
    breaks = [_breaks_bpu_graph(step) and i not in bpu_steps for i, step in enumerate(plan)]
    read_by: Dict[str, List[int]] = {}
    for j, step in enumerate(plan):
        if j in bpu_steps or breaks[j]:           # a layout convert that moves nothing passes the tensor on
            for t in step.inputs:
                read_by.setdefault(t, []).append(j)
    outputs = set(model.output_tensors)
    kept = set()
    for t, i in made_by.items():
        readers = read_by.get(t, [])
        if t in outputs or not readers or any(j not in bpu_steps for j in readers):
            continue
        if not any(breaks[i + 1:max(readers)]):
            kept.add(t)
    return frozenset(kept)


def estimate_model(model: model_pb2.Model, blobs: Dict[str, bytes], bpu: X5Bpu = X5_BPU,
                   strategy: Optional[CompileStrategy] = None) -> ModelEstimate:
    """Estimate every plan step of ``model`` (BPU subgraphs per layer, from their ONNX pieces),
    compiled with ``strategy`` (default: the compile_mode / optimize_level the model records)."""
    strategy = strategy or strategy_of(model)
    view = PlanView(model, blobs)
    subgraphs, cpu, order = [], [], []
    pieces = {i: piece_model(blobs[step.blob]) for i, step in enumerate(model.plan)
              if step.kind == Kind.BPU_SUBGRAPH or x5_runs_on_bpu(step)}
    fusion = lut_groups(list(pieces.values())) if strategy.fuses else NO_FUSION
    on_chip = on_chip_tensors(model, set(pieces))
    for i, step in enumerate(model.plan):
        if i in pieces:
            piece = pieces[i]
            inputs, outputs = io_tensors(piece)
            sub = SubgraphEstimate(step.name, subgraph_layers(piece, bpu, strategy, fusion, on_chip), inputs, outputs,
                                   float(bpu.subgraph_overhead_us))
            if step.kind == Kind.BPU_SUBGRAPH:
                subgraphs.append(sub)
                order.append(sub)
            else:   # a CPU op of the plan that the X5 runs on its BPU
                est = StepEstimate(step.name, "CPU op (BPU on the X5)", True, step_elements(model, view, step), 0.0)
                est.layers = sub
                cpu.append(est)
                order.append(est)
        else:
            elements = step_elements(model, view, step)
            bpu_input = x5_converts_on_bpu(model, step)
            est = StepEstimate(step.name, _STEP_KIND.get(step.kind, "CPU op"), x5_timing.on_bpu(step) or bpu_input,
                               elements, step_us(step, elements, bpu, bpu_input))
            cpu.append(est)
            order.append(est)
    _charge_subgraph_overheads(order, bpu)
    output_bytes = sum(int(p.aligned_byte_size) for p in model.outputs)
    return ModelEstimate(model.name, subgraphs, bpu, cpu, strategy, _plan(order), output_bytes)


def _plan(order) -> List[tuple]:
    out = []
    for o in order:
        if isinstance(o, SubgraphEstimate):
            out.append((o.name, True, o.latency_us))
        else:
            if o.layers is not None:
                o.latency_us = o.layers.latency_us
            out.append((o.name, o.on_bpu, o.latency_us))
    return out


def estimate_line(model: model_pb2.Model, blobs: Dict[str, bytes], bpu: X5Bpu = X5_BPU) -> str:
    """The line makertbin prints after compiling: ``FPS=…, latency = … us, DDR = … bytes``."""
    return estimate_model(model, blobs, bpu).line()


#: Bumped whenever plan_features' output changes (bench/x5_fit.py caches features by it).
FEATURES_VERSION = "7"


@dataclass
class StepFeatures:
    """A plan step as the timing model sees it, without its parameters (bench/x5_fit.py fits on these)."""

    name: str
    kind: int                          # model_pb2.PlanStep.Kind
    fused_into_subgraph: bool = False
    perm: tuple = ()
    elements: int = 0
    on_bpu: bool = False
    #: BPU_SUBGRAPH: its layers' x5.KINDS index, work, repacked bytes, DDR bytes, fused flag
    layers: Optional[Dict[str, np.ndarray]] = None


@dataclass
class PlanFeatures:
    model_name: str
    steps: List[StepFeatures]
    overlaps: bool
    output_bytes: int


def plan_features(model: model_pb2.Model, blobs: Dict[str, bytes], bpu: X5Bpu = X5_BPU) -> PlanFeatures:
    """The features of every plan step (``bpu`` gives only the assumed channel_align and sram_bytes)."""
    est = estimate_model(model, blobs, bpu)
    subs = iter(est.subgraphs)
    others = iter(est.cpu_steps)
    steps = []
    for step in model.plan:
        f = StepFeatures(step.name, step.kind, x5_converts_on_bpu(model, step), tuple(step.perm),
                         on_bpu=x5_timing.on_bpu(step) or x5_runs_on_bpu(step) or x5_converts_on_bpu(model, step))
        if step.kind == Kind.BPU_SUBGRAPH or x5_runs_on_bpu(step):
            if step.kind == Kind.BPU_SUBGRAPH:
                layers = next(subs).layers
            else:
                other = next(others)
                f.elements = other.elements
                layers = other.layers.layers
            f.layers = {"kind": np.array([KINDS.index(x.kind) for x in layers], dtype=np.int64),
                        "work": np.array([x.work for x in layers], dtype=np.float64),
                        "repacked": np.array([x.repacked_bytes for x in layers], dtype=np.float64),
                        "ddr": np.array([x.loaded_bytes + x.stored_bytes for x in layers], dtype=np.float64),
                        "fused": np.array([bool(x.fused_into) for x in layers], dtype=bool),
                        "pixels": np.array([x.pixels for x in layers], dtype=np.float64),
                        "launches": np.array([x.launches for x in layers], dtype=np.float64),
                        "barriers": np.array([x.barrier for x in layers], dtype=np.float64)}
        else:
            f.elements = next(others).elements
        steps.append(f)
    return PlanFeatures(model.name, steps, est.strategy.overlaps, est.output_bytes)


_LAYER_FEATURES = ("kind", "work", "repacked", "ddr", "fused", "pixels", "launches", "barriers")


def _all_layers(feat: PlanFeatures) -> Tuple[Dict[str, np.ndarray], np.ndarray]:
    """Every BPU layer of the plan in one set of arrays, and where each step's layers start in them."""
    with_layers = [f.layers for f in feat.steps if f.layers is not None]
    if not with_layers:
        return {}, np.zeros(0, dtype=np.int64)
    joined = {k: np.concatenate([layers[k] for layers in with_layers]) for k in _LAYER_FEATURES}
    starts = np.cumsum([0] + [len(layers["kind"]) for layers in with_layers[:-1]])
    return joined, starts


def plan_times(feat: PlanFeatures, bpu: X5Bpu) -> x5_timing.ModelSteps:
    """The modeled steps of a plan from its features: the same formulas as estimate_model (every layer of
    the plan costed in one call)."""
    if "_joined" not in feat.__dict__:            # the fit calls this many times on one plan's features
        feat.__dict__["_joined"] = _all_layers(feat)
    joined, starts = feat.__dict__["_joined"]
    step_layer_us = []
    if len(starts):
        _, _, cycles = bpu.layer_cycles(joined["kind"], joined["work"], joined["repacked"], joined["ddr"],
                                        joined["fused"], feat.overlaps, joined["pixels"], joined["launches"],
                                        joined["barriers"])
        sizes = np.diff(np.append(starts, len(joined["kind"])))
        sums = np.add.reduceat(bpu.us(cycles), np.minimum(starts, len(cycles) - 1)) if len(cycles) else np.zeros(len(starts))
        step_layer_us = [float(v) if n else 0.0 for v, n in zip(sums, sizes)]
    out = []
    previous_bpu = False
    layered = iter(step_layer_us)
    for f in feat.steps:
        if f.layers is not None:
            us = (0.0 if previous_bpu else float(bpu.subgraph_overhead_us)) + next(layered)
        else:
            us = step_us(f, f.elements, bpu)
        if f.layers is not None:
            previous_bpu = True
        elif f.kind != Kind.PREPROCESS and (us > 0 or f.on_bpu):
            previous_bpu = f.on_bpu
        out.append(x5_timing.StepTime(f.name, f.on_bpu, us))
    overhead = float(bpu.task_overhead_us + feat.output_bytes * bpu.output_byte_ns / 1e3)
    return x5_timing.ModelSteps(feat.model_name, tuple(out), overhead, bpu.source)


def annotate(model: model_pb2.Model, blobs: Dict[str, bytes], bpu: X5Bpu = X5_BPU) -> ModelEstimate:
    """The compile step that stores the X5 timing in ``model`` (each PlanStep.x5_us, Model.x5_timing),
    as the real compiler's output carries its estimate; returns the estimate."""
    est = estimate_model(model, blobs, bpu)
    for step, (name, on_bpu, us) in zip(model.plan, est.plan):
        step.x5_us = us
        step.x5_on_bpu = on_bpu and step.kind in (Kind.CPU_OP, Kind.PREPROCESS) and not step.fused_into_subgraph
    model.x5_timing.parameters = bpu.source
    model.x5_timing.ddr_bytes = int(est.ddr_bytes)
    model.x5_timing.task_overhead_us = est.task_overhead_us
    return est


def advice_lines(est: ModelEstimate, threshold_us: float) -> List[str]:
    """compiler_parameters.advice: the layers whose computation after data alignment takes more than
    ``threshold_us`` longer than in theory (unpadded), with both shapes and the padding ratio."""
    lines = []
    for sub in est.subgraphs:
        for layer in sub.layers:
            if layer.fused_into or not layer.ops:
                continue
            kind = KINDS.index(layer.kind)
            if layer.kind not in ("conv", "conv1x1", "matmul", "vector", "lut"):
                continue
            scale = 0.5 if layer.kind in ("conv", "conv1x1", "matmul") else 1.0     # OPs -> MACs
            rate = est.bpu.rates()[kind]
            theory = est.bpu.us(layer.ops * scale / rate)
            aligned = est.bpu.us(layer.aligned_ops * scale / rate)
            if aligned - theory > threshold_us:
                shape = "x".join(map(str, layer.output_shape))
                padded = "x".join(map(str, layer.aligned_output_shape))
                lines.append(f"advice: {sub.name} layer {layer.name} ({layer.bpu_type}) computes in {aligned:.3f} us "
                             f"after data alignment, {theory:.3f} us in theory (+{aligned - theory:.3f} us); "
                             f"output shape {shape} -> aligned {padded}, padding ratio "
                             f"{layer.aligned_ops / layer.ops:.2f}")
    if not lines:
        lines.append(f"advice: no layer's computation after data alignment exceeds its theoretical time by more "
                     f"than {threshold_us:g} us")
    return lines


def is_debug_build(model: model_pb2.Model) -> bool:
    """Compiled with compiler_parameters.debug: True (per-layer perf info available)."""
    for kv in model.build_info.compiler_parameters:
        if kv.key == "debug" and kv.value.strip().lower() == "true":
            return True
        if kv.key == "hbdk_pass_through_params" and "--debug" in kv.value.split():
            return True
    return False
