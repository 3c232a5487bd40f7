"""The parsed hb_mapper makertbin config: typed, frozen, one object per group.

``MapperConfig`` is what ``load_config`` returns. Values are already split at
';', typed and checked; paths are absolute (resolved against the yaml file's
directory); per-input values live in one ``InputConfig`` per input, in
input_name order. What the yaml may leave to the model (the input name and
shape of a single-input model) is ``None`` until ``loader.complete_config`` is
given the model's inputs.
"""
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Sequence, Tuple, Union

from bpuemu.common.input_types import INTERMEDIATE_TYPE
from bpuemu.host.config import tables as T

#: node_info input index: an input number, or "all" for 'InputType'.
InputIndex = Union[int, str]


def cal_data_type_from_dir(cal_data_dir: str) -> str:
    """The folder-suffix rule: a directory whose name ends with ``_f32`` holds float32, any other uint8."""
    name = os.path.basename(os.path.normpath(cal_data_dir))
    return "float32" if name.endswith(T.F32_DIR_SUFFIX) else "uint8"


@dataclass(frozen=True)
class NodeInfo:
    """What node_info (with run_on_cpu, run_on_bpu, set_node_data_type merged in) says about one node."""

    #: "BPU", "CPU", or None to leave placement to the tool.
    on: Optional[str] = None
    #: Input data types: {"all": "int16"} for 'InputType', {0: "int16"} for 'InputType0'.
    input_types: Dict[InputIndex, str] = field(default_factory=dict)
    #: Data type of every output ('OutputType'), or None.
    output_type: Optional[str] = None

    def input_type(self, index: int) -> Optional[str]:
        """The data type set for input ``index`` (a numbered setting wins over 'InputType')."""
        return self.input_types.get(index, self.input_types.get("all"))


@dataclass(frozen=True)
class ModelParameters:
    model_type: str
    onnx_model: Optional[str]
    caffe_model: Optional[str]
    prototxt: Optional[str]
    march: str
    output_model_file_prefix: str
    working_dir: str
    layer_out_dump: bool = False
    output_nodes: Tuple[str, ...] = ()
    remove_node_type: Tuple[str, ...] = ()
    remove_node_name: Tuple[str, ...] = ()
    debug_mode: Optional[str] = None
    #: node name -> NodeInfo, from node_info, run_on_cpu, run_on_bpu and set_node_data_type.
    node_info: Dict[str, NodeInfo] = field(default_factory=dict)

    @property
    def model_file(self) -> Optional[str]:
        return self.onnx_model if self.model_type == "onnx" else self.caffe_model


@dataclass(frozen=True)
class InputConfig:
    """One model input: input_parameters, its cal_data_dir/cal_data_type and its input_source."""

    #: None for a single-input model whose yaml leaves input_name out.
    name: Optional[str]
    input_type_train: str
    input_layout_train: str
    input_type_rt: str
    #: None for nv12, which has no layout.
    input_layout_rt: Optional[str]
    input_space_and_range: str
    #: None when the shape is to be read from the model.
    input_shape: Optional[Tuple[int, ...]]
    norm_type: str
    mean_value: Optional[Tuple[float, ...]]
    scale_value: Optional[Tuple[float, ...]]
    #: None when calibration_type is load or skip and no directory was given.
    cal_data_dir: Optional[str]
    #: As configured; see ``calibration_data_type`` for the type actually used.
    cal_data_type: Optional[str]
    input_source: str

    @property
    def label(self) -> str:
        return f"input '{self.name}'" if self.name else "the input"

    @property
    def intermediate_type(self) -> str:
        """The input type of original_float_model.onnx (yuv444_128, RGB_128, ..., featuremap)."""
        return INTERMEDIATE_TYPE[self.input_type_rt]

    @property
    def calibration_data_type(self) -> Optional[str]:
        """cal_data_type, or when it is not given: float32 for featuremap, else the ``_f32`` folder-suffix rule."""
        if self.cal_data_type:
            return self.cal_data_type
        if self.input_type_train == "featuremap":
            return "float32"
        return cal_data_type_from_dir(self.cal_data_dir) if self.cal_data_dir else None

    @property
    def channels(self) -> Optional[int]:
        """C of a 4-D input_shape in input_layout_train, else None."""
        if not self.input_shape or len(self.input_shape) != 4:
            return None
        return self.input_shape[1] if self.input_layout_train == "NCHW" else self.input_shape[3]

    @property
    def height_width(self) -> Optional[Tuple[int, int]]:
        """(H, W) of a 4-D input_shape in input_layout_train, else None."""
        if not self.input_shape or len(self.input_shape) != 4:
            return None
        s = self.input_shape
        return (s[2], s[3]) if self.input_layout_train == "NCHW" else (s[1], s[2])


@dataclass(frozen=True)
class Optimization:
    """The calibration_parameters ``optimization`` switches, decoded."""

    #: The switches as configured, in order.
    values: Tuple[str, ...] = ()
    #: "int8" / "int16" from set_model_output_int8 / _int16, else None.
    model_output_type: Optional[str] = None
    #: NodeKinds from set_{NodeKind}_input_int16 / set_{NodeKind}_output_int16.
    int16_input_kinds: FrozenSet[str] = frozenset()
    int16_output_kinds: FrozenSet[str] = frozenset()
    #: set_Softmax_input_int8 or set_Softmax_output_int8: quantize Softmax and run it on the BPU.
    softmax_int8: bool = False
    asymmetric: bool = False
    bias_correction: bool = False
    lstm_batch_last: bool = False


@dataclass(frozen=True)
class CalibrationParameters:
    """calibration_parameters without the per-input keys (those are in InputConfig) and
    without run_on_cpu / run_on_bpu (merged into ModelParameters.node_info)."""

    calibration_type: str = "default"
    max_percentile: float = 1.0
    per_channel: bool = False
    preprocess_on: bool = False
    optimization: Optimization = Optimization()

    @property
    def needs_data(self) -> bool:
        return self.calibration_type not in T.CALIBRATION_TYPES_WITHOUT_DATA


@dataclass(frozen=True)
class CompilerParameters:
    compile_mode: str
    optimize_level: str
    balance_factor: Optional[int] = None
    debug: bool = False
    core_num: int = 1
    #: input_source as configured (input name -> ddr|pyramid|resizer); each
    #: InputConfig.input_source holds the value in effect, default included.
    input_source: Dict[str, str] = field(default_factory=dict)
    max_time_per_fc: int = 0
    jobs: Optional[int] = None
    advice: Optional[int] = None

    @property
    def hbdk_pass_through_params(self) -> str:
        """The compiler flags hb_model_info shows (``--fast --O3`` for latency at O3)."""
        flags = {"latency": ["--fast"], "bandwidth": [], "balance": [f"--balance {self.balance_factor}"]}[self.compile_mode]
        flags.append(f"--{self.optimize_level}")
        if self.debug:
            flags.append("--debug")
        if self.core_num != 1:
            flags.append(f"--core-num {self.core_num}")
        if self.max_time_per_fc:
            flags.append(f"--max-time-per-fc {self.max_time_per_fc}")
        if self.jobs:
            flags.append(f"--jobs {self.jobs}")
        if self.advice:
            flags.append(f"--advice {self.advice}")
        return " ".join(flags)


@dataclass(frozen=True)
class CustomOpParameters:
    custom_op_method: Optional[str] = None
    op_register_files: Tuple[str, ...] = ()
    custom_op_dir: Optional[str] = None

    @property
    def register_file_paths(self) -> Tuple[str, ...]:
        """op_register_files inside custom_op_dir."""
        base = self.custom_op_dir or ""
        return tuple(os.path.join(base, f) for f in self.op_register_files)


@dataclass(frozen=True)
class MapperConfig:
    model: ModelParameters
    #: One per input, in input_name order.
    inputs: Tuple[InputConfig, ...]
    calibration: CalibrationParameters
    compiler: CompilerParameters
    custom_op: Optional[CustomOpParameters]
    #: The yaml file ("" when parsed from a dict).
    path: str = ""
    #: input_batch: one value for all inputs.
    input_batch: int = 1

    @property
    def input_names(self) -> Tuple[Optional[str], ...]:
        return tuple(i.name for i in self.inputs)

    def input(self, name: str) -> InputConfig:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(name)
