"""The config as hb_model_info shows it: ordered (key, value) pairs per group.

The keys and value formats are the seed's (ptq_guide, hb_model_info "Output
Description")::

    ############# model_parameters info #############
    onnx_model          : /.../efficientdet_nhwc.onnx
    BPU march           : bayes-e
    ...
    mean_value          : 123.68,116.779,103.939,

Settings the seed's example does not show are listed only when they differ
from their defaults, after the seed's keys.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

from bpuemu.host.config.model import MapperConfig, NodeInfo

Pairs = Tuple[Tuple[str, str], ...]


def _number(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _values(values: Optional[Sequence[float]]) -> str:
    return "None" if values is None else "".join(f"{_number(v)}," for v in values)


def _shape(shape: Optional[Sequence[int]]) -> str:
    return "None" if shape is None else "x".join(str(d) for d in shape)


def node_info_dict(node_info: Dict[str, NodeInfo]) -> Dict[str, Dict[str, str]]:
    """node_info back in its yaml dict form."""
    out = {}
    for name, info in node_info.items():
        entry = {}
        if info.on:
            entry["ON"] = info.on
        for index, dtype in info.input_types.items():
            entry["InputType" if index == "all" else f"InputType{index}"] = dtype
        if info.output_type:
            entry["OutputType"] = info.output_type
        out[name] = entry
    return out


@dataclass(frozen=True)
class ConfigInfo:
    model_parameters: Pairs
    #: (input name, pairs) per input, in input_name order.
    input_parameters: Tuple[Tuple[str, Pairs], ...]
    calibration_parameters: Pairs
    compiler_parameters: Pairs

    def render(self) -> str:
        """The text block hb_model_info prints between "model deps info" and the input/output types."""

        def pairs(items: Pairs):
            return [f"{k:<20}: {v}" for k, v in items]

        lines = ["############# model_parameters info #############", *pairs(self.model_parameters),
                 "############# input_parameters info #############"]
        for name, items in self.input_parameters:
            lines += ["------", f"---------input info : {name} ---------", *pairs(items),
                      f"---------input info : {name} end -------"]
        lines += ["------", "############# calibration_parameters info #############",
                  *pairs(self.calibration_parameters),
                  "############# compiler_parameters info #############", *pairs(self.compiler_parameters)]
        return "\n".join(lines)


def config_info(cfg: MapperConfig) -> ConfigInfo:
    m = cfg.model
    source = [("prototxt", str(m.prototxt)), ("caffe_model", str(m.caffe_model))] if m.model_type == "caffe" else [
        ("onnx_model", str(m.onnx_model))]
    model = [
        *source,
        ("BPU march", m.march),
        ("layer_out_dump", str(m.layer_out_dump)),
        ("working dir", m.working_dir),
        ("output_model_file_prefix", m.output_model_file_prefix),
    ]
    for key, values in (("output_nodes", m.output_nodes), ("remove_node_type", m.remove_node_type),
                        ("remove_node_name", m.remove_node_name)):
        if values:
            model.append((key, ";".join(values)))
    if m.debug_mode:
        model.append(("debug_mode", m.debug_mode))
    if m.node_info:
        model.append(("node_info", str(node_info_dict(m.node_info))))

    inputs = []
    for inp in cfg.inputs:
        items = [
            ("input_name", str(inp.name)),
            ("input_type_rt", inp.input_type_rt),
            ("input_space&range", inp.input_space_and_range),
            ("input_layout_rt", str(inp.input_layout_rt)),
            ("input_type_train", inp.input_type_train),
            ("input_layout_train", inp.input_layout_train),
            ("norm_type", inp.norm_type),
            ("input_shape", _shape(inp.input_shape)),
            ("mean_value", _values(inp.mean_value)),
            ("scale_value", _values(inp.scale_value)),
            ("cal_data_dir", str(inp.cal_data_dir)),
        ]
        if inp.cal_data_type:
            items.append(("cal_data_type", inp.cal_data_type))
        if cfg.input_batch != 1:
            items.append(("input_batch", str(cfg.input_batch)))
        inputs.append((str(inp.name), tuple(items)))

    c = cfg.calibration
    calibration = [("preprocess_on", str(c.preprocess_on)), ("calibration_type", c.calibration_type)]
    if c.calibration_type == "max":
        calibration.append(("max_percentile", _number(c.max_percentile)))
    if c.per_channel:
        calibration.append(("per_channel", "True"))
    if c.optimization.values:
        calibration.append(("optimization", ";".join(c.optimization.values)))

    sources = {str(inp.name): inp.input_source for inp in cfg.inputs}
    sources["_default_value"] = "ddr"
    compiler = [("hbdk_pass_through_params", cfg.compiler.hbdk_pass_through_params), ("input-source", str(sources))]
    return ConfigInfo(tuple(model), tuple(inputs), tuple(calibration), tuple(compiler))
