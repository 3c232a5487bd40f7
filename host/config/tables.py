"""The hb_mapper makertbin yaml parameters, as data.

One source of truth for every key the yaml may hold: its group, value kind,
allowed values or range, default, and whether it is required (ptq_guide,
"Model Conversion YAML Configuration Parameters" and its four tables). The
loader builds its ``schema`` validators and its did-you-mean suggestions from
these tables; the rules that tie several keys together (the input_type_train x
input_type_rt table, input_source defaults, ...) are here too, also as data.

Value kinds (``Param.kind``):

=============  ==============================================================
``str``        a name or text (yaml numbers are taken as their text)
``path``       a file or directory, resolved relative to the yaml's directory
``bool``       ``True`` / ``False``
``int``        an integer in ``ranges`` (or one of ``choices``)
``float``      a number in ``ranges``
``enum``       one of ``choices``
``shape``      ``'1x3x224x224'``
``values``     numbers separated by spaces: ``'103.94 116.78 123.68'``
``node_dtype`` ``'node_name:int16'``
``node_info``  the dict form or the ``'node1:int16;node2:int16'`` form
``input_source`` a dict of input name -> one of ``INPUT_SOURCES``
``optimization`` one of the optimization switches (see ``OPTIMIZATION_*``)
=============  ==============================================================

``multi`` keys hold several values separated by ';' (``'conv_0; conv_1'``);
``per_input`` keys hold one value per input, in input_name order, and
``none_ok`` lets an input's entry be ``'None'`` ("this input does not need
it").
"""
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

# --- value vocabularies ---------------------------------------------------------------

MARCHES = ("bayes-e",)
#: input_type_train / input_type_rt, in the order the seed's tables list them.
INPUT_TYPES_TRAIN = ("rgb", "bgr", "yuv444", "gray", "featuremap")
INPUT_TYPES_RT = ("rgb", "bgr", "yuv444", "nv12", "gray", "featuremap")
LAYOUTS = ("NHWC", "NCHW")
INPUT_SPACES = ("regular", "bt601_video")
NORM_TYPES = ("data_mean_and_scale", "data_mean", "data_scale", "no_preprocess")
REMOVE_NODE_TYPES = ("Quantize", "Transpose", "Dequantize", "Cast", "Reshape", "Softmax")
DEBUG_MODES = ("dump_calibration_data",)
CAL_DATA_TYPES = ("float32", "uint8", "int32", "int16", "int8")
CALIBRATION_TYPES = ("default", "mix", "kl", "max", "load", "skip")
#: calibration_type values that need no calibration data.
CALIBRATION_TYPES_WITHOUT_DATA = ("load", "skip")
COMPILE_MODES = ("latency", "bandwidth", "balance")
OPTIMIZE_LEVELS = ("O0", "O1", "O2", "O3")
INPUT_SOURCES = ("ddr", "pyramid", "resizer")
CUSTOM_OP_METHODS = ("register",)

#: Data types node_info / set_node_data_type may set ("X5 int16 configuration").
NODE_DATA_TYPES = ("int16",)
NODE_PLACEMENTS = ("BPU", "CPU")

#: optimization switches with a fixed spelling.
OPTIMIZATION_SWITCHES = (
    "set_model_output_int8",
    "set_model_output_int16",
    "set_Softmax_input_int8",
    "set_Softmax_output_int8",
    "asymmetric",
    "bias_correction",
    "lstm_batch_last",
)
#: set_{NodeKind}_input_int16 / set_{NodeKind}_output_int16; NodeKind is an ONNX op type (case sensitive).
OPTIMIZATION_INT16_PATTERN = r"set_([A-Z][A-Za-z0-9]*)_(input|output)_int16"
#: The spelled-out forms, for error messages.
OPTIMIZATION_FORMS = OPTIMIZATION_SWITCHES[:2] + (
    "set_{NodeKind}_input_int16",
    "set_{NodeKind}_output_int16",
) + OPTIMIZATION_SWITCHES[2:]

# --- rules between keys ------------------------------------------------------------------

#: input_type_train -> the input_type_rt values it can be converted from
#: ("Interpretation internal process", the Y/N table).
RT_TYPES_FOR_TRAIN: Dict[str, Tuple[str, ...]] = {
    "yuv444": ("nv12", "yuv444"),
    "rgb": ("nv12", "yuv444", "rgb", "bgr"),
    "bgr": ("nv12", "yuv444", "rgb", "bgr"),
    "gray": ("gray",),
    "featuremap": ("featuremap",),
}
#: input_type_rt values whose height and width must be even.
EVEN_SIZE_RT_TYPES = ("nv12", "yuv444")
#: The one input_type_rt that has no layout (input_layout_rt is not needed).
LAYOUTLESS_RT_TYPES = ("nv12",)
#: input_space_and_range only applies to these input_type_rt values (the seed names nv12; yuv444 is
#: YUV data too, so bpuemu accepts it there as well).
SPACE_AND_RANGE_RT_TYPES = ("nv12", "yuv444")
#: Channels an image input has, by input_type_train.
CHANNELS_OF_TRAIN_TYPE = {"rgb": 3, "bgr": 3, "yuv444": 3, "gray": 1}
#: norm_type -> (needs mean_value, needs scale_value)
NORM_NEEDS: Dict[str, Tuple[bool, bool]] = {
    "data_mean_and_scale": (True, True),
    "data_mean": (True, False),
    "data_scale": (False, True),
    "no_preprocess": (False, False),
}
#: input_source default by input_type_rt (ptq_faq: nv12 -> pyramid; yuv444/rgb/bgr -> ddr).
#: gray goes with nv12: a gray model reads the Y plane of the camera's nv12 frames.
DEFAULT_INPUT_SOURCE = {"nv12": "pyramid", "gray": "pyramid"}
FALLBACK_INPUT_SOURCE = "ddr"
#: The camera-path sources deliver nv12 (or its Y plane) only.
CAMERA_SOURCES = ("pyramid", "resizer")
CAMERA_SOURCE_RT_TYPES = ("nv12", "gray")
#: "If set to resizer, the h*w of the model must be less than 18432."
RESIZER_MAX_HW = 18432
#: X5 takes only core_num 1 (the table lists 1 and 2 for other platforms).
X5_CORE_NUM = 1
#: The folder-suffix rule when cal_data_type is not given.
F32_DIR_SUFFIX = "_f32"

# --- the parameter tables --------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One yaml key: how its value is read and checked."""

    key: str
    kind: str
    required: bool = False
    default: Any = None
    choices: Tuple[Any, ...] = ()
    #: Allowed integer / float intervals, inclusive: ((0, 0), (1000, 4294967295)).
    ranges: Tuple[Tuple[float, float], ...] = ()
    multi: bool = False
    per_input: bool = False
    none_ok: bool = False
    #: Shown as the error's Hint when the value is rejected.
    hint: str = ""

    @property
    def is_list(self) -> bool:
        return self.multi or self.per_input


_MAX_U32 = 4294967295

MODEL_PARAMETERS = (
    Param("prototxt", "path"),
    Param("caffe_model", "path"),
    Param("onnx_model", "path"),
    Param("march", "enum", required=True, choices=MARCHES, hint="hb_mapper converts for the X5, whose BPU micro-architecture is bayes-e; "
          "the J6 marches (nash-e/m/b/h/p) convert with hb_compile"),
    Param("output_model_file_prefix", "str", required=True),
    Param("working_dir", "path", default="model_output"),
    Param("layer_out_dump", "bool", default=False),
    Param("output_nodes", "str", multi=True),
    Param("remove_node_type", "enum", multi=True, choices=REMOVE_NODE_TYPES),
    Param("remove_node_name", "str", multi=True),
    Param("set_node_data_type", "node_dtype", multi=True),
    Param("debug_mode", "enum", choices=DEBUG_MODES),
    Param("node_info", "node_info"),
)

INPUT_PARAMETERS = (
    Param("input_name", "str", multi=True),
    Param("input_type_train", "enum", required=True, per_input=True, choices=INPUT_TYPES_TRAIN),
    Param("input_layout_train", "enum", required=True, per_input=True, choices=LAYOUTS),
    Param("input_type_rt", "enum", required=True, per_input=True, choices=INPUT_TYPES_RT),
    Param("input_layout_rt", "enum", per_input=True, none_ok=True, choices=LAYOUTS),
    Param("input_space_and_range", "enum", per_input=True, default="regular", choices=INPUT_SPACES),
    Param("input_shape", "shape", per_input=True, none_ok=True),
    Param("input_batch", "int", default=1, ranges=((1, 4096),)),
    Param("norm_type", "enum", required=True, per_input=True, choices=NORM_TYPES),
    Param("mean_value", "values", per_input=True, none_ok=True),
    Param("scale_value", "values", per_input=True, none_ok=True),
)

CALIBRATION_PARAMETERS = (
    Param("cal_data_dir", "path", per_input=True),
    Param("cal_data_type", "enum", per_input=True, none_ok=True, choices=CAL_DATA_TYPES),
    Param("preprocess_on", "bool", default=False),
    Param("calibration_type", "enum", default="default", choices=CALIBRATION_TYPES),
    Param("max_percentile", "float", default=1.0, ranges=((0.5, 1.0),)),
    Param("per_channel", "bool", default=False),
    Param("run_on_cpu", "str", multi=True),
    Param("run_on_bpu", "str", multi=True),
    Param("optimization", "optimization", multi=True),
)

COMPILER_PARAMETERS = (
    Param("compile_mode", "enum", required=True, choices=COMPILE_MODES),
    Param("balance_factor", "int", ranges=((0, 100),)),
    Param("debug", "bool", default=False),
    Param("core_num", "int", default=1, choices=(1, 2)),
    Param("optimize_level", "enum", required=True, choices=OPTIMIZE_LEVELS),
    Param("input_source", "input_source"),
    Param("max_time_per_fc", "int", default=0, ranges=((0, 0), (1000, _MAX_U32)),
          hint="0 means no limit; a limit is given in microseconds, at least 1000"),
    Param("jobs", "int", ranges=((1, _MAX_U32),)),
    Param("advice", "int", ranges=((0, _MAX_U32),)),
)

CUSTOM_OP = (
    Param("custom_op_method", "enum", choices=CUSTOM_OP_METHODS),
    Param("op_register_files", "str", multi=True),
    Param("custom_op_dir", "path"),
)

#: Every group, in the order the seed documents (and hb_model_info prints) them.
GROUPS: Dict[str, Tuple[Param, ...]] = {
    "model_parameters": MODEL_PARAMETERS,
    "input_parameters": INPUT_PARAMETERS,
    "calibration_parameters": CALIBRATION_PARAMETERS,
    "compiler_parameters": COMPILER_PARAMETERS,
    "custom_op": CUSTOM_OP,
}
#: "all four parameter group positions need to exist"; custom_op only with custom CPU operators.
REQUIRED_GROUPS = ("model_parameters", "input_parameters", "calibration_parameters", "compiler_parameters")
#: key -> the group it belongs to (no key appears in two groups).
GROUP_OF_KEY: Dict[str, str] = {p.key: g for g, params in GROUPS.items() for p in params}
#: Keys that hold one value per input, and the key their count is compared with.
PER_INPUT_KEYS = tuple(p.key for params in GROUPS.values() for p in params if p.per_input)


def param(group: str, key: str) -> Optional[Param]:
    """The Param for group/key, or None."""
    return next((p for p in GROUPS.get(group, ()) if p.key == key), None)
