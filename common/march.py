"""The BPU generations as data: one ``March`` per BPU micro-architecture.

bpuemu emulates two toolchain generations on one core. What differs between
them is described here and passed to the pipeline, the runtime and the tools,
which take a ``March`` as a parameter instead of branching on a name:

    from bpuemu.common.march import march
    m = march("nash-e")
    m.flow.model_suffix            # ".hbm"
    m.tail_output_dtype            # "int32" (float32 on nash-b/h/p)
    m.nv12_stride_align            # 32 (64 on nash-h/p)

``bayes-e`` is the X5 (RDK X5), documented by ``ptq_guide_x5``; ``nash-e``,
``nash-m``, ``nash-b``, ``nash-h`` and ``nash-p`` are the J6E/M/B/H/P,
documented by ``ptq_faq_j6``. A value the documents give is marked
``documented``; a published product specification ``specification``; what
bpuemu chose where the documents are silent ``assumed``, and the docs say so.
"""
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

from bpuemu.common.errors import InvalidInput

#: Where a value of a march description comes from.
DOCUMENTED = "documented"        # the seed documents say it
SPECIFICATION = "specification"  # the vendor's published product specification
FITTED = "fitted"                # fitted to published board measurements (bench/x5_fit.csv)
ASSUMED = "assumed"              # bpuemu's own choice where nothing is published


class UnknownMarch(InvalidInput):
    """A march name that no description has."""


@dataclass(frozen=True)
class Flow:
    """The tools and file names of a march's conversion flow."""

    convert_command: str            # what the user types to convert
    log_file: str                   # the conversion's log, in the directory it runs from
    model_suffix: str               # the deployable model's file suffix
    quantized_artifact: str         # the fixed-point model's artifact suffix (after the prefix)
    #: the PTQ (fake-quant) ONNX model's suffix; "" when the flow has none.
    ptq_artifact: str = ""
    #: the fixed-point model with input/output nodes removed; "" when the flow has none.
    removed_artifact: str = ""
    #: the per-node table as CSV; "" when the flow writes it only to the log.
    node_info_artifact: str = ""
    host_runtime: str = ""          # the host-side inference class the documents name


@dataclass(frozen=True)
class Timing:
    """What the modeled board time of a march rests on, with each value's provenance."""

    bpu_int8_tops: float
    bpu_tops_source: str
    cpu_cores: int
    cpu_core: str
    cpu_source: str
    #: How the model's time is obtained: the fitted X5 model itself, or scaled from it.
    method: str
    method_source: str
    #: A CPU core's speed against the X5's Cortex-A55 (1.0 on the X5).
    cpu_speed_vs_x5: float = 1.0
    cpu_speed_source: str = ASSUMED

    @property
    def bpu_speed_vs_x5(self) -> float:
        return self.bpu_int8_tops / BAYES_E_TOPS

    @property
    def label(self) -> str:
        """One line a printed timing figure carries, saying what it rests on."""
        if self.method_source == FITTED:
            return "modeled: fitted to published RDK X5 measurements"
        return (f"modeled: {self.method} ({self.method_source}); BPU {self.bpu_int8_tops:g} int8 TOPS "
                f"({self.bpu_tops_source}), {self.cpu_cores}x {self.cpu_core} ({self.cpu_source}); "
                "no board measurements")


@dataclass(frozen=True)
class March:
    """One BPU micro-architecture: what its toolchain, compiler and runtime do differently."""

    name: str
    generation: str                 # "X5" or "J6"
    platform: str                   # the SoC the documents call it
    flow: Flow
    #: qtypes the BPU computes in; a node configured to another one runs on the CPU.
    bpu_qtypes: FrozenSet[str]
    #: qtypes a precision configuration may name.
    config_qtypes: FrozenSet[str]
    bpu_qtypes_source: str
    #: The dtype a model-tail Conv outputs for accuracy (its accumulator, or float).
    tail_output_dtype: str
    optimize_levels: Tuple[str, ...]
    #: Row stride alignment (bytes) of an nv12 input on the board; 1: rows are dense.
    nv12_stride_align: int
    nv12_align_source: str
    #: Inclusive opset range and highest ir_version the documents accept; refused outside.
    opset_range: Tuple[int, int]
    max_ir_version: int
    #: Whether conversion may change the input layout (input_layout_train/rt).
    converts_input_layout: bool
    timing: Timing

    @property
    def is_j6(self) -> bool:
        return self.generation == "J6"

    def aligned_stride(self, width: int) -> int:
        """The row stride (bytes) of an nv12 plane ``width`` pixels wide on this march."""
        a = self.nv12_stride_align
        return -(-width // a) * a


BAYES_E_TOPS = 10.0

_X5_FLOW = Flow(convert_command="hb_mapper makertbin", log_file="hb_mapper_makertbin.log", model_suffix=".bin",
                quantized_artifact="_quantized_model.onnx", host_runtime="HB_ONNXRuntime")
_J6_FLOW = Flow(convert_command="hb_compile", log_file="hb_compile.log", model_suffix=".hbm",
                quantized_artifact="_quantized_model.bc", ptq_artifact="_ptq_model.onnx",
                removed_artifact="_quantized_removed_model.bc", node_info_artifact="_node_info.csv",
                host_runtime="HBRuntime")

_INT = frozenset({"int8", "int16"})
_INT_FP16 = frozenset({"int8", "int16", "float16"})
_J6_CONFIG = frozenset({"int8", "int16", "float16", "float32"})


def _j6_timing(tops: float, cores: int, core: str, cpu_source: str) -> Timing:
    return Timing(bpu_int8_tops=tops, bpu_tops_source=SPECIFICATION, cpu_cores=cores, cpu_core=core,
                  cpu_source=cpu_source, method="the X5 model's BPU time scaled by int8 TOPS, CPU time by core speed",
                  method_source=ASSUMED, cpu_speed_vs_x5=2.5, cpu_speed_source=ASSUMED)


def _nash(suffix: str, platform: str, tail: str, align: int, bpu_qtypes: FrozenSet[str], timing: Timing) -> March:
    return March(name=f"nash-{suffix}", generation="J6", platform=platform, flow=_J6_FLOW,
                 bpu_qtypes=bpu_qtypes, config_qtypes=_J6_CONFIG, bpu_qtypes_source=ASSUMED,
                 tail_output_dtype=tail, optimize_levels=("O0", "O1", "O2"), nv12_stride_align=align,
                 nv12_align_source=DOCUMENTED, opset_range=(10, 19), max_ir_version=9,
                 converts_input_layout=False, timing=timing)


MARCHES: Dict[str, March] = {m.name: m for m in (
    March(name="bayes-e", generation="X5", platform="RDK X5", flow=_X5_FLOW,
          bpu_qtypes=_INT, config_qtypes=_INT, bpu_qtypes_source=DOCUMENTED,
          tail_output_dtype="int32", optimize_levels=("O0", "O1", "O2", "O3"),
          nv12_stride_align=1, nv12_align_source=ASSUMED,
          # ptq_guide_x5 documents opset 10/11 and ir_version <= 7; hb_mapper checker warns, not refuses, beyond.
          opset_range=(10, 11), max_ir_version=7, converts_input_layout=True,
          timing=Timing(bpu_int8_tops=BAYES_E_TOPS, bpu_tops_source=SPECIFICATION, cpu_cores=8,
                        cpu_core="Cortex-A55", cpu_source=SPECIFICATION,
                        method="per-layer X5 model (host/compiler/timing)", method_source=FITTED,
                        cpu_speed_vs_x5=1.0, cpu_speed_source=SPECIFICATION)),
    _nash("e", "J6E", "int32", 32, _INT, _j6_timing(80.0, 6, "Cortex-A78AE", SPECIFICATION)),
    _nash("m", "J6M", "int32", 32, _INT, _j6_timing(128.0, 6, "Cortex-A78AE", SPECIFICATION)),
    _nash("b", "J6B", "float32", 32, _INT_FP16, _j6_timing(18.0, 4, "Cortex-A55", ASSUMED)),
    _nash("h", "J6H", "float32", 64, _INT_FP16, _j6_timing(560.0, 18, "Cortex-A78AE", ASSUMED)),
    _nash("p", "J6P", "float32", 64, _INT_FP16, _j6_timing(560.0, 18, "Cortex-A78AE", SPECIFICATION)),
)}

DEFAULT_MARCH = "bayes-e"
J6_MARCHES = tuple(n for n, m in MARCHES.items() if m.is_j6)


def march(name: Optional[str] = None) -> March:
    """The description of ``name`` (``bayes-e`` when empty); one clear error for an unknown name."""
    key = (name or DEFAULT_MARCH).strip().lower()
    try:
        return MARCHES[key]
    except KeyError:
        raise UnknownMarch(f"unknown march '{name}'", hint=f"one of: {', '.join(MARCHES)}") from None


def march_of_model_file(path: str) -> Optional[str]:
    """The generation a model file's suffix names ("X5" for .bin, "J6" for .hbm), or None."""
    for m in MARCHES.values():
        if path.endswith(m.flow.model_suffix):
            return m.generation
    return None


__all__ = ["ASSUMED", "BAYES_E_TOPS", "DEFAULT_MARCH", "DOCUMENTED", "FITTED", "Flow", "J6_MARCHES", "MARCHES",
           "March", "SPECIFICATION", "Timing", "UnknownMarch", "march", "march_of_model_file"]
