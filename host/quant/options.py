"""Typed options of the calibration parameter group (ptq_guide_x5, "Calibration parameter group").

``QuantOptions`` is what the yaml layer builds from ``calibration_type``,
``max_percentile``, ``per_channel``, ``optimization`` and ``node_info``;
``QuantOptions.from_optimization`` parses the ``optimization`` strings
(``set_model_output_int8``, ``set_Conv_output_int16``, ``asymmetric``, ...).
"""
import re
from dataclasses import dataclass, field, replace
from typing import FrozenSet, Iterable, Mapping, Tuple

from bpuemu.common.errors import InvalidInput

CALIBRATION_TYPES = ("default", "mix", "kl", "max", "skip", "load")
OUTPUT_TYPES = ("float", "int8", "int16")

#: The threshold that ends the default search early (ptq_faq_x5 6.6.1.4).
DEFAULT_TARGET_COSINE = 0.995
#: The percentile the default and mix searches try ("Max-Percentile 0.99995").
SEARCH_PERCENTILE = 0.99995


@dataclass(frozen=True)
class Int16Spec:
    """Which inputs/outputs of a node compute in int16 (node_info InputType[N]/OutputType).

    ``all_inputs`` is ``'InputType': 'int16'``, ``inputs`` lists the N of
    ``'InputTypeN': 'int16'``, ``output`` is ``'OutputType': 'int16'`` (all outputs).
    """

    all_inputs: bool = False
    inputs: Tuple[int, ...] = ()
    output: bool = False

    def input_indices(self, count: int) -> Tuple[int, ...]:
        return tuple(range(count)) if self.all_inputs else tuple(i for i in self.inputs if i < count)

    def merged(self, other: "Int16Spec") -> "Int16Spec":
        return Int16Spec(self.all_inputs or other.all_inputs, tuple(sorted(set(self.inputs) | set(other.inputs))),
                         self.output or other.output)


@dataclass(frozen=True)
class QuantOptions:
    """How to calibrate and quantize (see the module docstring of bpuemu.host.quant).

    ``per_channel`` is per-channel *featuremap* calibration ("Controls whether
    to calibrate each channel of featuremap"); weights are always per-channel
    symmetric int8 as X5 does. ``int16_nodes`` maps node names, ``int16_kinds``
    op types (set_{NodeKind}_input/output_int16) to an ``Int16Spec``.
    """

    calibration_type: str = "default"
    max_percentile: float = 1.0
    per_channel: bool = False
    asymmetric: bool = False
    bias_correction: bool = False
    model_output_type: str = "float"
    int16_nodes: Mapping[str, Int16Spec] = field(default_factory=dict)
    int16_kinds: Mapping[str, Int16Spec] = field(default_factory=dict)
    seed: int = 0
    # Knobs of the searches; the defaults are what makertbin uses.
    search_target: float = DEFAULT_TARGET_COSINE   # default: stop at a step whose best cosine reaches this
    search_percentile: float = SEARCH_PERCENTILE
    search_samples: int = 16                       # first N calibration samples the searches score on; 0 = all
    #: from this many calibration samples on, the default and mix searches score on their last search_samples,
    #: held out of the statistics (the candidates are judged on data they were not calibrated on); 0 = never
    search_held_out_from: int = 48
    mix_sensitive_nodes: int = 8                   # mix: at most this many sensitive nodes get their own method
    mix_sensitivity_samples: int = 4               # mix: samples for the per-node sensitivity (one model per node)
    histogram_bins: int = 2048
    kl_quantized_bins: int = 128
    skip_samples: int = 4                          # skip: number of random calibration samples
    #: quant_config per op type / node: node -> (method kind "kl" | "max", max_percentile) for its output's group.
    node_methods: Mapping[str, Tuple[str, float]] = field(default_factory=dict)
    #: Tensors a BPU node outputs unquantized: the J6 tail Conv's int32 / float32 output (placement's tail rule).
    high_precision_outputs: FrozenSet[str] = frozenset()

    def __post_init__(self):
        if self.calibration_type not in CALIBRATION_TYPES:
            raise InvalidInput(f"calibration_type '{self.calibration_type}' is not one of {', '.join(CALIBRATION_TYPES)}")
        if not 0.5 <= self.max_percentile <= 1.0:
            raise InvalidInput(f"max_percentile {self.max_percentile} is outside 0.5~1.0")
        if self.model_output_type not in OUTPUT_TYPES:
            raise InvalidInput(f"model output type '{self.model_output_type}' is not one of {', '.join(OUTPUT_TYPES)}")
        if self.calibration_type == "default" and self.asymmetric:
            raise InvalidInput(
                "optimization 'asymmetric' cannot be configured with calibration_type: default",
                hint="the default search tries asymmetric quantization itself; choose kl, max or mix to force it",
            )
        if self.histogram_bins < 2 * self.kl_quantized_bins:
            raise InvalidInput(f"histogram_bins {self.histogram_bins} must be at least twice kl_quantized_bins")

    def with_(self, **changes) -> "QuantOptions":
        return replace(self, **changes)

    @classmethod
    def from_optimization(cls, values: Iterable[str], **kwargs) -> "QuantOptions":
        """Options from the yaml ``optimization`` list plus any other fields.

        Values that are not about quantization (set_Softmax_input_int8,
        lstm_batch_last) are accepted and left to the placement/compile stages.
        """
        kinds = dict(kwargs.pop("int16_kinds", {}) or {})
        for value in values:
            value = value.strip()
            if not value:
                continue
            if value == "asymmetric":
                kwargs["asymmetric"] = True
            elif value == "bias_correction":
                kwargs["bias_correction"] = True
            elif value in ("set_model_output_int8", "set_model_output_int16"):
                kwargs["model_output_type"] = value.rsplit("_", 1)[1]
            elif value in ("set_Softmax_input_int8", "set_Softmax_output_int8", "lstm_batch_last"):
                continue
            else:
                m = re.fullmatch(r"set_([A-Za-z0-9]+)_(input|output)_int16", value)
                if not m:
                    raise InvalidInput(f"optimization '{value}' is not supported",
                                       hint="see ptq_guide 'optimization' for the accepted values")
                kind, side = m.groups()
                spec = Int16Spec(all_inputs=True) if side == "input" else Int16Spec(output=True)
                kinds[kind] = kinds[kind].merged(spec) if kind in kinds else spec
        return cls(int16_kinds=kinds, **kwargs)
