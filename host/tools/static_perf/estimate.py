"""Static estimates of a model's BPU subgraphs and of the whole model (the numbers hb_perf reports)."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from bpuemu.common.proto import model_pb2
from bpuemu.host.tools.static_perf.layers import Layer, io_tensors, subgraph_layers
from bpuemu.host.tools.static_perf.strategy import CompileStrategy, strategy_of
from bpuemu.host.tools.static_perf.x5 import X5_BPU, X5Bpu
from bpuemu.host.tools.plan import Kind, piece_model

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
class ModelEstimate:
    model_name: str
    subgraphs: List[SubgraphEstimate]
    bpu: X5Bpu
    cpu_steps: List[str] = field(default_factory=list)
    strategy: CompileStrategy = field(default_factory=CompileStrategy)

    @property
    def latency_us(self) -> float:
        return sum(s.latency_us for s in self.subgraphs)

    @property
    def latency_ms(self) -> float:
        return self.latency_us / 1e3

    @property
    def fps(self) -> Optional[float]:
        return 1e6 / self.latency_us if self.latency_us > 0 else None

    @property
    def loaded_bytes(self) -> int:
        return sum(s.loaded_bytes for s in self.subgraphs)

    @property
    def stored_bytes(self) -> int:
        return sum(s.stored_bytes for s in self.subgraphs)

    @property
    def ddr_bytes(self) -> int:
        return self.loaded_bytes + self.stored_bytes

    @property
    def ops(self) -> int:
        return sum(s.ops for s in self.subgraphs)

    def summary(self) -> Dict[str, object]:
        return {
            "model_name": self.model_name,
            "model_latency_ms": self.latency_ms,
            "fps": self.fps,
            "total_ddr_mb_per_frame": self.ddr_bytes / MB,
            "loaded_bytes_per_frame": self.loaded_bytes,
            "stored_bytes_per_frame": self.stored_bytes,
            "calculation_load_ops_per_frame": self.ops,
            "compile_mode": self.strategy.compile_mode,
            "balance_factor": self.strategy.balance_factor,
            "optimize_level": self.strategy.optimize_level,
        }

    def line(self) -> str:
        """``FPS=…, latency = … us, DDR = … bytes``."""
        fps = f"{self.fps:.2f}" if self.fps is not None else "inf"
        return f"FPS={fps}, latency = {self.latency_us:.1f} us, DDR = {self.ddr_bytes} bytes"


def estimate_model(model: model_pb2.Model, blobs: Dict[str, bytes], bpu: X5Bpu = X5_BPU,
                   strategy: Optional[CompileStrategy] = None) -> ModelEstimate:
    """Estimate every BPU subgraph of ``model`` from its ONNX piece, compiled with ``strategy``
    (default: the compile_mode / optimize_level the model records)."""
    strategy = strategy or strategy_of(model)
    subgraphs, cpu = [], []
    for step in model.plan:
        if step.kind == Kind.BPU_SUBGRAPH:
            piece = piece_model(blobs[step.blob])
            inputs, outputs = io_tensors(piece)
            subgraphs.append(SubgraphEstimate(step.name, subgraph_layers(piece, bpu, strategy), inputs, outputs,
                                              bpu.us(bpu.subgraph_overhead_cycles)))
        else:
            cpu.append(step.name)
    return ModelEstimate(model.name, subgraphs, bpu, cpu, strategy)


def estimate_line(model: model_pb2.Model, blobs: Dict[str, bytes], bpu: X5Bpu = X5_BPU) -> str:
    """The line makertbin prints after compiling: ``FPS=…, latency = … us, DDR = … bytes``."""
    return estimate_model(model, blobs, bpu).line()


def advice_lines(est: ModelEstimate, threshold_us: float) -> List[str]:
    """compiler_parameters.advice: the layers whose computation after data alignment takes more than
    ``threshold_us`` longer than in theory (unpadded), with both shapes and the padding ratio."""
    lines = []
    for sub in est.subgraphs:
        for layer in sub.layers:
            if layer.fused_into or not layer.ops:
                continue
            theory = est.bpu.us(est.bpu.compute_cycles(layer.unit, layer.ops))
            aligned = est.bpu.us(est.bpu.compute_cycles(layer.unit, layer.aligned_ops))
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
