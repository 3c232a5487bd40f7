"""The hb_mapper makertbin yaml layer (bpuemu.host.config): parsing, defaults, typing, and the seed's errors."""
import copy
import logging
import os
import textwrap

import pytest

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import INPUT_TYPES_RT, INTERMEDIATE_TYPE
from bpuemu.host.config import (
    PARSE_FAILED,
    ConfigError,
    NodeInfo,
    cal_data_type_from_dir,
    config_info,
    load_config,
    parse_config,
)
from bpuemu.host.config import tables as T
from bpuemu.host.config.loader import complete_config

# The seed's template (ptq_guide, "Model Conversion YAML Configuration Parameters") for an
# ONNX model, with the group indentation fixed and the commented-out options switched on.
SEED_TEMPLATE = """\
# Model Parameters Group
model_parameters:
  # Original ONNX floating-point model file
  onnx_model: 'mobilenetv1.onnx'
  march: 'bayes-e'
  output_model_file_prefix: 'mobilenetv1'
  working_dir: './model_output_dir'
  layer_out_dump: False
  output_nodes: 'prob'
  remove_node_type: Dequantize
  remove_node_name: 'conv_out'

input_parameters:
  input_name: "data"
  input_type_train: 'bgr'
  input_layout_train: 'NCHW'
  input_shape: '1x3x224x224'
  input_batch: 1
  norm_type: 'data_mean_and_scale'
  mean_value: '103.94 116.78 123.68'
  scale_value: '0.017'
  input_type_rt: 'yuv444'
  input_space_and_range: 'regular'
  input_layout_rt: 'NHWC'

calibration_parameters:
  cal_data_dir: './calibration_data'
  cal_data_type: 'float32'
  preprocess_on: False
  calibration_type: 'max'
  max_percentile: 0.99995
  run_on_cpu: 'conv_0; conv_1; conv12'
  run_on_bpu: 'relu_9'
  per_channel: False
  optimization: set_model_output_int8

compiler_parameters:
  compile_mode: 'latency'
  debug: False
  core_num: 1
  optimize_level: 'O3'
  input_source: {"data": "ddr"}
  max_time_per_fc: 1000
  jobs: 8

custom_op:
  custom_op_method: register
  op_register_files: sample_custom.py
  custom_op_dir: ./custom_op
"""


@pytest.fixture
def project(tmp_path):
    """A project directory: a model file, calibration data, custom op file; the yaml goes beside them."""
    (tmp_path / "mobilenetv1.onnx").write_bytes(b"onnx")
    (tmp_path / "calibration_data").mkdir()
    (tmp_path / "custom_op").mkdir()
    (tmp_path / "custom_op" / "sample_custom.py").write_text("")
    return tmp_path


def write(directory, text, name="config.yaml"):
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def minimal():
    """The smallest valid document: required keys only."""
    return {
        "model_parameters": {"onnx_model": "mobilenetv1.onnx", "march": "bayes-e", "output_model_file_prefix": "m"},
        "input_parameters": {
            "input_type_train": "rgb",
            "input_layout_train": "NCHW",
            "input_type_rt": "nv12",
            "norm_type": "no_preprocess",
        },
        "calibration_parameters": {"cal_data_dir": "calibration_data"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }


def two_inputs():
    doc = minimal()
    doc["input_parameters"] = {
        "input_name": "img; feat",
        "input_type_train": "rgb;featuremap",
        "input_layout_train": "NCHW;NCHW",
        "input_type_rt": "nv12;featuremap",
        "input_layout_rt": "None;NCHW",
        "input_shape": "1x3x224x224;1x64x7x7",
        "norm_type": "data_mean_and_scale;no_preprocess",
        "mean_value": "123.675 116.28 103.53;None",
        "scale_value": "0.0171;None",
    }
    doc["calibration_parameters"]["cal_data_dir"] = "cal_img;cal_feat"
    return doc


def parse(doc, base_dir, **kwargs):
    return parse_config(doc, str(base_dir), **kwargs)


def error_of(doc, base_dir, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(doc, base_dir, **kwargs)
    return info.value


# --- a valid config, typed -----------------------------------------------------------------------


def test_seed_template_is_typed_and_resolved(project):
    cfg = load_config(write(project, SEED_TEMPLATE), model_type="onnx")

    m = cfg.model
    assert (m.model_type, m.onnx_model, m.march) == ("onnx", str(project / "mobilenetv1.onnx"), "bayes-e")
    assert m.output_model_file_prefix == "mobilenetv1"
    assert m.working_dir == str(project / "model_output_dir")
    assert m.layer_out_dump is False
    assert (m.output_nodes, m.remove_node_type, m.remove_node_name) == (("prob",), ("Dequantize",), ("conv_out",))

    (inp,) = cfg.inputs
    assert inp.name == "data"
    assert (inp.input_type_train, inp.input_layout_train, inp.input_type_rt, inp.input_layout_rt) == (
        "bgr", "NCHW", "yuv444", "NHWC")
    assert inp.input_shape == (1, 3, 224, 224)
    assert inp.norm_type == "data_mean_and_scale"
    assert inp.mean_value == (103.94, 116.78, 123.68)
    assert inp.scale_value == (0.017,)
    assert inp.cal_data_dir == str(project / "calibration_data")
    assert inp.calibration_data_type == "float32"
    assert (inp.input_source, inp.intermediate_type, inp.channels, inp.height_width) == ("ddr", "yuv444_128", 3, (224, 224))
    assert cfg.input_batch == 1

    c = cfg.calibration
    assert (c.calibration_type, c.max_percentile, c.per_channel, c.preprocess_on) == ("max", 0.99995, False, False)
    assert c.optimization.values == ("set_model_output_int8",)
    assert c.optimization.model_output_type == "int8"
    # run_on_cpu / run_on_bpu are merged into node_info, in order
    assert list(m.node_info) == ["conv_0", "conv_1", "conv12", "relu_9"]
    assert [i.on for i in m.node_info.values()] == ["CPU", "CPU", "CPU", "BPU"]

    k = cfg.compiler
    assert (k.compile_mode, k.debug, k.core_num, k.optimize_level) == ("latency", False, 1, "O3")
    assert (k.input_source, k.max_time_per_fc, k.jobs, k.advice, k.balance_factor) == ({"data": "ddr"}, 1000, 8, None, None)
    assert k.hbdk_pass_through_params == "--fast --O3 --max-time-per-fc 1000 --jobs 8"

    assert cfg.custom_op.custom_op_method == "register"
    assert cfg.custom_op.register_file_paths == (str(project / "custom_op" / "sample_custom.py"),)
    assert cfg.path == str(project / "config.yaml")


def test_defaults_are_filled(project):
    cfg = parse(minimal(), project)
    assert cfg.model.working_dir == str(project / "model_output")
    assert cfg.model.layer_out_dump is False
    assert cfg.model.node_info == {} and cfg.model.output_nodes == () and cfg.model.debug_mode is None
    (inp,) = cfg.inputs
    # a single-input model may leave name and shape to the model
    assert inp.name is None and inp.input_shape is None
    assert inp.input_layout_rt is None  # nv12 has no layout
    assert inp.input_space_and_range == "regular"
    assert inp.input_source == "pyramid"  # nv12 defaults to pyramid
    assert inp.mean_value is None and inp.scale_value is None
    assert inp.cal_data_type is None and inp.calibration_data_type == "uint8"
    assert cfg.input_batch == 1
    c = cfg.calibration
    assert (c.calibration_type, c.max_percentile, c.per_channel, c.preprocess_on) == ("default", 1.0, False, False)
    assert c.optimization.values == () and not c.optimization.asymmetric
    k = cfg.compiler
    assert (k.debug, k.core_num, k.max_time_per_fc, k.jobs, k.advice, k.input_source) == (False, 1, 0, None, None, {})
    assert cfg.custom_op is None
    assert cfg.path == ""


def test_input_layout_rt_defaults_to_the_training_layout(project):
    doc = minimal()
    doc["input_parameters"].update(input_type_rt="rgb", input_layout_train="NHWC")
    (inp,) = parse(doc, project).inputs
    assert inp.input_layout_rt == "NHWC"
    assert inp.input_source == "ddr"


def test_empty_optional_keys_and_groups_count_as_unset(project):
    text = """\
    model_parameters:
      onnx_model: mobilenetv1.onnx
      march: bayes-e
      output_model_file_prefix: m
      remove_node_type:
      output_nodes: ''
    input_parameters:
      input_type_train: gray
      input_layout_train: NCHW
      input_type_rt: gray
      norm_type: no_preprocess
    calibration_parameters:
      calibration_type: skip
    compiler_parameters:
      compile_mode: bandwidth
      optimize_level: O0
    custom_op:
    """
    cfg = load_config(write(project, text))
    assert cfg.model.remove_node_type == () and cfg.model.output_nodes == ()
    assert cfg.custom_op is None
    assert cfg.inputs[0].cal_data_dir is None and not cfg.calibration.needs_data
    assert cfg.compiler.hbdk_pass_through_params == "--O0"


def test_semicolon_lists(project):
    doc = minimal()
    doc["model_parameters"].update(output_nodes="out_a; out_b;", remove_node_type="Quantize; Transpose;Softmax",
                                   remove_node_name="n1;n2")
    doc["calibration_parameters"].update(run_on_cpu="conv_0; conv_1; conv12", calibration_type="kl",
                                         optimization="set_Conv_input_int16; set_Add_output_int16; "
                                                      "set_Softmax_output_int8; asymmetric; bias_correction; lstm_batch_last")
    cfg = parse(doc, project)
    assert cfg.model.output_nodes == ("out_a", "out_b")
    assert cfg.model.remove_node_type == ("Quantize", "Transpose", "Softmax")
    assert cfg.model.remove_node_name == ("n1", "n2")
    assert list(cfg.model.node_info) == ["conv_0", "conv_1", "conv12"]
    o = cfg.calibration.optimization
    assert o.int16_input_kinds == {"Conv"} and o.int16_output_kinds == {"Add"}
    assert o.softmax_int8 and o.asymmetric and o.bias_correction and o.lstm_batch_last
    assert o.model_output_type is None


def test_two_inputs_are_split_in_input_name_order(project):
    cfg = parse(two_inputs(), project, check_files=False)
    img, feat = cfg.inputs
    assert cfg.input_names == ("img", "feat")
    assert (img.input_type_train, img.input_type_rt, img.input_layout_rt) == ("rgb", "nv12", None)
    assert (feat.input_type_train, feat.input_type_rt, feat.input_layout_rt) == ("featuremap", "featuremap", "NCHW")
    assert img.input_shape == (1, 3, 224, 224) and feat.input_shape == (1, 64, 7, 7)
    assert img.mean_value == (123.675, 116.28, 103.53) and img.scale_value == (0.0171,)
    assert feat.mean_value is None and feat.scale_value is None
    assert img.cal_data_dir == str(project / "cal_img")
    assert (img.calibration_data_type, feat.calibration_data_type) == ("uint8", "float32")
    assert (img.input_source, feat.input_source) == ("pyramid", "ddr")
    assert cfg.input("feat") is feat
    with pytest.raises(KeyError):
        cfg.input("nope")


def test_input_source_overrides_the_default(project):
    doc = two_inputs()
    doc["compiler_parameters"]["input_source"] = {"img": "ddr"}
    cfg = parse(doc, project, check_files=False)
    assert [i.input_source for i in cfg.inputs] == ["ddr", "ddr"]
    assert cfg.compiler.input_source == {"img": "ddr"}


def test_node_info_dict_form(project):
    text = """\
    model_parameters:
      onnx_model: mobilenetv1.onnx
      march: bayes-e
      output_model_file_prefix: m
      node_info: {"conv1": {'ON': 'BPU', 'InputType': 'int16', 'OutputType': 'int16'},
                  "add_3": {'InputType0': 'int16', InputType1: int16},
                  softmax: {ON: CPU}}
      set_node_data_type: 'sigmoid_2:int16'
    input_parameters: {input_type_train: rgb, input_layout_train: NCHW, input_type_rt: nv12, norm_type: no_preprocess}
    calibration_parameters: {cal_data_dir: calibration_data, run_on_bpu: 'relu_5'}
    compiler_parameters: {compile_mode: latency, optimize_level: O3}
    """
    info = load_config(write(project, text)).model.node_info
    assert info["conv1"] == NodeInfo(on="BPU", input_types={"all": "int16"}, output_type="int16")
    assert info["add_3"] == NodeInfo(on=None, input_types={0: "int16", 1: "int16"}, output_type=None)
    assert info["add_3"].input_type(1) == "int16" and info["add_3"].input_type(2) is None
    assert info["conv1"].input_type(5) == "int16"
    assert info["softmax"].on == "CPU"  # a bare yaml ON (read as true) is the ON key
    assert info["sigmoid_2"] == NodeInfo(output_type="int16")  # set_node_data_type merged
    assert info["relu_5"].on == "BPU"  # run_on_bpu merged


def test_node_info_string_form(project):
    doc = minimal()
    doc["model_parameters"]["node_info"] = "node1:int16;node2:int16"
    doc["calibration_parameters"]["run_on_cpu"] = "node2"
    info = parse(doc, project).model.node_info
    assert info == {"node1": NodeInfo(output_type="int16"), "node2": NodeInfo(on="CPU", output_type="int16")}


@pytest.mark.parametrize(
    "node_info, fragment",
    [
        ({"conv1": {"OutputType0": "int16"}}, "node 'conv1': 'OutputType0' is not supported: OutputType applies to every output"),
        ({"conv1": {"ON": "GPU"}}, "node 'conv1': ON 'GPU' is not one of BPU, CPU"),
        ({"conv1": {"ON": "bpu"}}, "(did you mean 'BPU'?)"),
        ({"conv1": {"Inputtype": "int16"}}, "unknown setting 'Inputtype' (did you mean 'InputType'?)"),
        ({"conv1": {"InputType": "int32"}}, "data type 'int32' is not one of int16"),
        ({"conv1": "BPU"}, "node 'conv1': 'BPU' should be a mapping like"),
        ("node1:int16;node2", "'node2' should be node_name:int16"),
    ],
)
def test_node_info_errors(project, node_info, fragment):
    doc = minimal()
    doc["model_parameters"]["node_info"] = node_info
    e = error_of(doc, project)
    assert str(e).startswith("Key 'model_parameters' error:\nnode_info: ")
    assert fragment in str(e)


def test_node_placed_on_both_units_is_refused(project):
    doc = minimal()
    doc["model_parameters"]["node_info"] = {"conv1": {"ON": "BPU"}}
    doc["calibration_parameters"]["run_on_cpu"] = "conv1"
    e = error_of(doc, project)
    assert "node 'conv1' cannot run on both BPU and CPU: node_info puts it on BPU, run_on_cpu on CPU" in str(e)


def test_optimization_decoding(project):
    doc = minimal()
    doc["calibration_parameters"].update(optimization="set_model_output_int16")
    assert parse(doc, project).calibration.optimization.model_output_type == "int16"


# --- errors -------------------------------------------------------------------------------------------------


def _set(group, **values):
    def mutate(doc):
        doc[group].update(values)
    return mutate


def _del(group, key=None):
    def mutate(doc):
        if key is None:
            del doc[group]
        else:
            del doc[group][key]
    return mutate


ERROR_CASES = {
    "missing group": (_del("compiler_parameters"), "Missing key: 'compiler_parameters'"),
    "missing required key": (_del("compiler_parameters", "optimize_level"),
                             "Key 'compiler_parameters' error:\nMissing key: 'optimize_level'"),
    "missing model file key": (_del("model_parameters", "onnx_model"), "Key 'model_parameters' error:\nMissing key: 'onnx_model'"),
    "bad enum": (_set("input_parameters", input_type_rt="nv21"),
                 "Key 'input_parameters' error:\ninput_type_rt: 'nv21' is not one of rgb, bgr, yuv444, nv12, gray, "
                 "featuremap (did you mean 'nv12'?)"),
    "bad enum in a list": (_set("model_parameters", remove_node_type="Quantize; Dequantise"),
                           "remove_node_type: 'Dequantise' is not one of Quantize, Transpose, Dequantize, Cast, "
                           "Reshape, Softmax (did you mean 'Dequantize'?)"),
    "the template's lateency": (_set("compiler_parameters", compile_mode="lateency"),
                                "Key 'compiler_parameters' error:\ncompile_mode: 'lateency' is not one of latency, "
                                "bandwidth, balance (did you mean 'latency'?)"),
    "unknown key": (_set("calibration_parameters", calibraton_type="kl"),
                    "Key 'calibration_parameters' error:\nunknown key 'calibraton_type' (did you mean 'calibration_type'?)"),
    "key in the wrong group": (_set("input_parameters", cal_data_type="uint8"),
                               "Key 'input_parameters' error:\nunknown key 'cal_data_type': it belongs to 'calibration_parameters'"),
    "march": (_set("model_parameters", march="bernoulli2"), "march: 'bernoulli2' is not one of bayes-e"),
    "bad combination": (_set("input_parameters", input_type_train="gray", input_type_rt="nv12"),
                        "the input: input_type_rt 'nv12' with input_type_train 'gray' is not supported; "
                        "input_type_train gray allows input_type_rt gray"),
    "featuremap to rgb": (_set("input_parameters", input_type_train="featuremap", input_type_rt="rgb"),
                          "input_type_train featuremap allows input_type_rt featuremap"),
    "odd nv12 size": (_set("input_parameters", input_shape="1x3x223x224"),
                      "the input: input_type_rt nv12 needs an even height and width, but input_shape 1x3x223x224 "
                      "has H=223, W=224"),
    "odd yuv444 size": (_set("input_parameters", input_type_rt="yuv444", input_shape="1x3x224x225"), "H=224, W=225"),
    "count mismatch": (_set("input_parameters", input_name="a;b", input_type_train="rgb;rgb", input_type_rt="nv12;nv12",
                            norm_type="no_preprocess;no_preprocess"),
                       "Key 'input_parameters' error:\ninput_layout_train has 1 value but input_name has 2"),
    "per-input count in calibration": (_set("calibration_parameters", cal_data_type="uint8;float32"),
                                       "Key 'calibration_parameters' error:\ncal_data_type has 2 values "
                                       "but input_type_train has 1"),
    "several inputs without input_name": (
        _set("input_parameters", input_type_train="rgb;rgb", input_layout_train="NCHW;NCHW", input_type_rt="nv12;nv12",
             norm_type="no_preprocess;no_preprocess"),
        "input_name is required when there is more than one input (input_type_train has 2 values)"),
    "asymmetric with default": (_set("calibration_parameters", optimization="asymmetric"),
                                "optimization: 'asymmetric' cannot be set when calibration_type is default"),
    "both output types": (_set("calibration_parameters", optimization="set_model_output_int8;set_model_output_int16"),
                          "set_model_output_int8 and set_model_output_int16 cannot both be set"),
    "bad optimization": (_set("calibration_parameters", optimization="set_conv_input_int16"),
                         "'set_conv_input_int16' is not one of set_model_output_int8, set_model_output_int16, "
                         "set_{NodeKind}_input_int16"),
    "core_num 2": (_set("compiler_parameters", core_num=2), "core_num: 2 is not supported: X5 supports only core_num 1"),
    "core_num 3": (_set("compiler_parameters", core_num=3), "core_num: 3 is not one of 1, 2"),
    "balance without factor": (_set("compiler_parameters", compile_mode="balance"),
                               "Key 'compiler_parameters' error:\nMissing key: 'balance_factor'"),
    "balance_factor range": (_set("compiler_parameters", compile_mode="balance", balance_factor=101),
                             "balance_factor: 101 is out of range (0-100)"),
    "max_time_per_fc gap": (_set("compiler_parameters", max_time_per_fc=500),
                            "max_time_per_fc: 500 is out of range (0 or 1000-4294967295)"),
    "max_percentile range": (_set("calibration_parameters", calibration_type="max", max_percentile=0.3),
                             "max_percentile: 0.3 is out of range (0.5-1)"),
    "input_batch range": (_set("input_parameters", input_batch=4097), "input_batch: 4097 is out of range (1-4096)"),
    "input_batch with batch-4 shape": (_set("input_parameters", input_batch=2, input_shape="4x3x224x224"),
                                       "input_batch: input_batch 2 can only be used when the first dimension of "
                                       "input_shape is 1, but the input has 4x3x224x224"),
    "not a bool": (_set("model_parameters", layer_out_dump="yes please"), "layer_out_dump: 'yes please' is not True or False"),
    "not an int": (_set("compiler_parameters", jobs="many"), "jobs: 'many' is not an integer"),
    "bad shape": (_set("input_parameters", input_shape="1x3x?x224"), "input_shape: '1x3x?x224' is not a shape like 1x3x224x224"),
    "not 4-d image": (_set("input_parameters", input_shape="1x3x224"), "input_shape 1x3x224 is not 4-dimensional"),
    "wrong layout for shape": (_set("input_parameters", input_shape="1x224x224x3"),
                               "input_shape 1x224x224x3 has 224 channels in input_layout_train NCHW, but input_type_train "
                               "rgb has 3"),
    "mean needed": (_set("input_parameters", norm_type="data_mean_and_scale", scale_value=0.5),
                    "the input has norm_type data_mean_and_scale, which needs mean_value"),
    "scale needed": (_set("input_parameters", norm_type="data_scale"), "which needs scale_value"),
    "mean count": (_set("input_parameters", norm_type="data_mean", mean_value="1 2", input_shape="1x3x224x224"),
                   "mean_value: the input has 2 values, but takes 1 or one per channel (3)"),
    "mean not numbers": (_set("input_parameters", norm_type="data_mean", mean_value="12 abc"),
                         "mean_value: '12 abc' is not a list of numbers separated by spaces"),
    "bt601 on rgb": (_set("input_parameters", input_type_rt="rgb", input_space_and_range="bt601_video"),
                     "input_space_and_range: the input: bt601_video only applies to input_type_rt nv12/yuv444, not rgb"),
    "pyramid for rgb": (lambda d: (d["input_parameters"].update(input_type_rt="rgb", input_name="data"),
                                   d["compiler_parameters"].update(input_source={"data": "pyramid"})),
                        "input_source: input 'data': pyramid delivers nv12/gray data only, but input_type_rt is rgb"),
    "resizer too large": (lambda d: (d["input_parameters"].update(input_shape="1x3x224x224", input_name="data"),
                                     d["compiler_parameters"].update(input_source={"data": "resizer"})),
                          "resizer needs H*W below 18432, but 224x224 is 50176"),
    "input_source of an unknown input": (lambda d: (d["input_parameters"].update(input_name="data"),
                                                    d["compiler_parameters"].update(input_source={"dat": "ddr"})),
                                         "input_source: 'dat' is not an input name (input_name: data) (did you mean 'data'?)"),
    "bad input_source value": (_set("compiler_parameters", input_source={"data": "camera"}),
                               "input_source: input 'data': 'camera' is not one of ddr, pyramid, resizer"),
    "prefix is a path": (_set("model_parameters", output_model_file_prefix="out/m"),
                         "output_model_file_prefix: 'out/m' is a path, not a file name prefix"),
    "caffe and onnx": (_set("model_parameters", caffe_model="m.caffemodel", prototxt="m.prototxt"),
                       "give either onnx_model or caffe_model + prototxt, not both"),
    "caffe file missing": (lambda d: (d["model_parameters"].pop("onnx_model"),
                                      d["model_parameters"].update(caffe_model="m.caffemodel", prototxt="m.prototxt")),
                           "Key 'model_parameters' error:\nprototxt: file '"),
    "caffe without prototxt": (lambda d: (d["model_parameters"].pop("onnx_model"),
                                          d["model_parameters"].update(caffe_model="m.caffemodel")),
                               "Key 'model_parameters' error:\nMissing key: 'prototxt'"),
    "no cal_data_dir": (_del("calibration_parameters", "cal_data_dir"),
                        "Key 'calibration_parameters' error:\nMissing key: 'cal_data_dir'"),
    "missing onnx file": (_set("model_parameters", onnx_model="nope.onnx"), "onnx_model: file '"),
    "missing cal dir": (_set("calibration_parameters", cal_data_dir="nope"), "cal_data_dir: directory '"),
    "unknown group": (lambda d: d.update(calibration_parameter={}), "unknown parameter group 'calibration_parameter' "
                                                                    "(did you mean 'calibration_parameters'?)"),
    "parameter outside its group": (lambda d: d.update(march="bayes-e"), "'march' must be inside the 'model_parameters' group"),
    "group not a mapping": (lambda d: d.update(input_parameters="rgb"), "Key 'input_parameters' error:\nexpected a mapping"),
    "duplicate input names": (_set("input_parameters", input_name="a;a", input_type_train="rgb;rgb",
                                   input_layout_train="NCHW;NCHW", input_type_rt="nv12;nv12",
                                   norm_type="no_preprocess;no_preprocess"),
                              "input_name: 'a' is given twice"),
}


@pytest.mark.parametrize("mutate, expected", ERROR_CASES.values(), ids=ERROR_CASES.keys())
def test_errors_are_worded_like_the_seed(project, mutate, expected):
    doc = minimal()
    mutate(doc)
    e = error_of(doc, project)
    text = str(e)
    assert expected in text
    assert text.split("\nHint:")[0].endswith(PARSE_FAILED)
    # never a raw schema message or a traceback
    for raw in ("should evaluate to True", "Wrong key", ".validate(", "Traceback", "raised"):
        assert raw not in text
    assert isinstance(e, InvalidInput)


def test_seed_caffe_message_is_exact(project):
    doc = minimal()
    del doc["model_parameters"]["onnx_model"]
    e = error_of(doc, project, model_type="caffe")
    assert e.message == f"Key 'model_parameters' error:\nMissing keys: 'caffe_model', 'prototxt'\n{PARSE_FAILED}"
    assert e.hint == "--model-type caffe needs caffe_model and prototxt"
    assert (e.group, e.detail) == ("model_parameters", "Missing keys: 'caffe_model', 'prototxt'")


def test_caffe_model_type_with_caffe_keys_is_a_caffe_model(project):
    doc = minimal()
    del doc["model_parameters"]["onnx_model"]
    doc["model_parameters"].update(caffe_model="m.caffemodel", prototxt="m.prototxt")
    for name in ("m.caffemodel", "m.prototxt"):
        (project / name).write_bytes(b"")
    from bpuemu.host.config import parse_config

    cfg = parse_config(doc, str(project), model_type="caffe")
    m = cfg.model
    assert (m.model_type, m.onnx_model) == ("caffe", None)
    assert (m.caffe_model, m.prototxt) == (str(project / "m.caffemodel"), str(project / "m.prototxt"))
    assert m.model_file == m.caffe_model


def test_model_type_onnx_needs_onnx_model(project):
    doc = minimal()
    del doc["model_parameters"]["onnx_model"]
    e = error_of(doc, project, model_type="onnx")
    assert e.detail == "Missing key: 'onnx_model'"
    assert e.hint == "--model-type onnx needs onnx_model"


def test_unknown_model_type(project):
    assert "--model-type 'tflite' is not one of onnx, caffe" in str(error_of(minimal(), project, model_type="tflite"))


def test_hint_for_missing_groups(project):
    doc = minimal()
    del doc["calibration_parameters"], doc["compiler_parameters"]
    e = error_of(doc, project)
    assert e.detail == "Missing keys: 'calibration_parameters', 'compiler_parameters'"
    assert "all four parameter groups must be present" in e.hint


def test_seed_template_indentation_slip_is_explained(project):
    """The seed's own template indents 'calibration_parameters' under input_parameters."""
    text = SEED_TEMPLATE.replace("\ncalibration_parameters:", "\n  calibration_parameters:")
    with pytest.raises(ConfigError) as info:
        load_config(write(project, text))
    e = info.value
    assert e.detail == "unknown key 'calibration_parameters': it is a parameter group"
    assert e.group == "input_parameters"
    assert "must start at the beginning of its line" in e.hint


def test_march_error_explains_the_emulated_platform(project):
    doc = minimal()
    doc["model_parameters"]["march"] = "bernoulli2"
    e = error_of(doc, project)
    assert (e.group, e.key) == ("model_parameters", "march")
    assert e.hint == ("hb_mapper converts for the X5, whose BPU micro-architecture is bayes-e; "
                      "the J6 marches (nash-e/m/b/h/p) convert with hb_compile")
    assert str(e).endswith("\nHint: " + e.hint)


def test_yaml_lists_work_like_semicolons(project):
    doc = two_inputs()
    doc["input_parameters"].update(input_name=["img", "feat"], norm_type=["data_scale", "no_preprocess"],
                                   mean_value=None, scale_value=[0.5, "None"])
    img, feat = parse(doc, project, check_files=False).inputs
    assert (img.name, feat.name, img.scale_value, feat.scale_value) == ("img", "feat", (0.5,), None)


def test_optimization_kind_case_suggestion(project):
    doc = minimal()
    doc["calibration_parameters"]["optimization"] = "set_conv_input_int16"
    assert "(did you mean 'set_Conv_input_int16'?)" in str(error_of(doc, project))


def test_per_input_count_names_the_key_and_counts(project):
    doc = two_inputs()
    doc["input_parameters"]["mean_value"] = "123.675 116.28 103.53"
    e = error_of(doc, project, check_files=False)
    assert e.group == "input_parameters"
    assert e.detail == "mean_value has 1 value but input_name has 2"
    assert "one value per input, separated by ';'" in e.hint


# --- reading the file ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("model_parameters:\n  march: 'bayes-e\n", "is not valid YAML: found unexpected end of stream"),
        ("model_parameters:\n  march: bayes-e\n   onnx_model: m.onnx\n", "is not valid YAML: mapping values are not allowed here (line 3"),
        ("- model_parameters\n- input_parameters\n", "the config holds a list, not a mapping of parameter groups"),
        ("just text\n", "the config holds text, not a mapping of parameter groups"),
        ("", "the config is empty, not a mapping of parameter groups"),
        ("model_parameters:\n  march: bayes-e\n  march: bayes-e\n", "found duplicate key 'march' (line 3, column 3)"),
    ],
    ids=["unterminated", "bad indent", "list", "scalar", "empty", "duplicate key"],
)
def test_unreadable_yaml(project, text, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(write(project, text, "bad.yaml"))
    assert fragment in str(info.value)
    assert PARSE_FAILED in str(info.value)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="config file '.*nope.yaml' does not exist"):
        load_config(tmp_path / "nope.yaml")


# --- paths -------------------------------------------------------------------------------------------------


def test_paths_resolve_against_the_yaml_directory(project, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("cwd")
    monkeypatch.chdir(elsewhere)  # must not matter
    sub = project / "configs"
    sub.mkdir()
    text = SEED_TEMPLATE.replace("'mobilenetv1.onnx'", "'../mobilenetv1.onnx'").replace(
        "'./calibration_data'", f"'{project / 'calibration_data'}'").replace("./custom_op", "../custom_op")
    cfg = load_config(write(sub, text))
    assert cfg.model.onnx_model == str(project / "mobilenetv1.onnx")
    assert cfg.model.working_dir == str(sub / "model_output_dir")
    assert cfg.inputs[0].cal_data_dir == str(project / "calibration_data")  # absolute kept
    assert cfg.custom_op.custom_op_dir == str(project / "custom_op")


def test_check_files_off_accepts_missing_files(tmp_path):
    cfg = parse(minimal(), tmp_path, check_files=False)
    assert cfg.model.onnx_model == str(tmp_path / "mobilenetv1.onnx")
    assert not os.path.exists(cfg.model.onnx_model)


def test_load_and_skip_need_no_calibration_data(project):
    for ctype in ("load", "skip"):
        doc = minimal()
        doc["calibration_parameters"] = {"calibration_type": ctype}
        cfg = parse(doc, project)
        assert cfg.inputs[0].cal_data_dir is None and cfg.inputs[0].calibration_data_type is None
        # a directory given anyway is not checked: it is not read
        doc["calibration_parameters"]["cal_data_dir"] = "does_not_exist"
        assert parse(doc, project).inputs[0].cal_data_dir == str(project / "does_not_exist")


# --- the _f32 rule -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "directory, dtype",
    [("calibration_data_rgb_f32", "float32"), ("/data/cal_f32/", "float32"), ("cal_f32x", "uint8"),
     ("calibration_data_rgb", "uint8"), ("f32/calibration", "uint8"), ("data_F32", "uint8"), ("dataf32", "uint8")],
)
def test_f32_folder_suffix_rule(directory, dtype):
    assert cal_data_type_from_dir(directory) == dtype


def test_cal_data_type_wins_over_the_suffix(project):
    (project / "cal_f32").mkdir()
    doc = minimal()
    doc["calibration_parameters"].update(cal_data_dir="cal_f32")
    assert parse(doc, project).inputs[0].calibration_data_type == "float32"
    doc["calibration_parameters"].update(cal_data_type="int8")
    assert parse(doc, project).inputs[0].calibration_data_type == "int8"


# --- warnings for settings without effect --------------------------------------------------------------


def test_settings_without_effect_are_warned_about(project, caplog):
    doc = minimal()
    doc["calibration_parameters"].update(calibration_type="kl", max_percentile=0.9999)
    doc["compiler_parameters"].update(balance_factor=50)
    doc["input_parameters"].update(mean_value="128")
    with caplog.at_level(logging.WARNING, logger="bpuemu.host.config.loader"):
        cfg = parse(doc, project)
    text = caplog.text
    assert "max_percentile is only used by calibration_type max; it is ignored with kl" in text
    assert "balance_factor is only used by compile_mode balance" in text
    assert "mean_value is ignored with norm_type no_preprocess" in text
    assert cfg.compiler.balance_factor is None and cfg.inputs[0].mean_value is None


def test_balance_mode(project):
    doc = minimal()
    doc["compiler_parameters"].update(compile_mode="balance", balance_factor="30", debug="True")
    k = parse(doc, project).compiler
    assert (k.balance_factor, k.debug) == (30, True)
    assert k.hbdk_pass_through_params == "--balance 30 --O3 --debug"


# --- hb_model_info's view -------------------------------------------------------------------------------


def test_config_info_matches_the_seed_layout(project):
    text = """\
    model_parameters:
      onnx_model: mobilenetv1.onnx
      march: bayes-e
      output_model_file_prefix: efficient_det_512x512_nv12
      working_dir: model_output
    input_parameters:
      input_name: data
      input_type_train: rgb
      input_layout_train: NCHW
      input_type_rt: nv12
      input_shape: 1x3x512x512
      norm_type: data_mean_and_scale
      mean_value: 123.68 116.779 103.939
      scale_value: 0.017
    calibration_parameters:
      cal_data_dir: calibration_data_rgb_f32
      calibration_type: max
    compiler_parameters:
      compile_mode: latency
      optimize_level: O3
      input_source: {"data": "pyramid"}
    """
    cfg = load_config(write(project, text), check_files=False)
    info = config_info(cfg)
    assert info.model_parameters[:5] == (
        ("onnx_model", str(project / "mobilenetv1.onnx")),
        ("BPU march", "bayes-e"),
        ("layer_out_dump", "False"),
        ("working dir", str(project / "model_output")),
        ("output_model_file_prefix", "efficient_det_512x512_nv12"),
    )
    assert info.calibration_parameters == (("preprocess_on", "False"), ("calibration_type", "max"), ("max_percentile", "1"))
    assert info.compiler_parameters == (
        ("hbdk_pass_through_params", "--fast --O3"),
        ("input-source", "{'data': 'pyramid', '_default_value': 'ddr'}"),
    )
    expected = f"""\
############# model_parameters info #############
onnx_model          : {project / 'mobilenetv1.onnx'}
BPU march           : bayes-e
layer_out_dump      : False
working dir         : {project / 'model_output'}
output_model_file_prefix: efficient_det_512x512_nv12
############# input_parameters info #############
------
---------input info : data ---------
input_name          : data
input_type_rt       : nv12
input_space&range   : regular
input_layout_rt     : None
input_type_train    : rgb
input_layout_train  : NCHW
norm_type           : data_mean_and_scale
input_shape         : 1x3x512x512
mean_value          : 123.68,116.779,103.939,
scale_value         : 0.017,
cal_data_dir        : {project / 'calibration_data_rgb_f32'}
---------input info : data end -------
------
############# calibration_parameters info #############
preprocess_on       : False
calibration_type    : max
max_percentile      : 1
############# compiler_parameters info #############
hbdk_pass_through_params: --fast --O3
input-source        : {{'data': 'pyramid', '_default_value': 'ddr'}}"""
    assert info.render() == expected


def test_config_info_lists_each_input(project):
    doc = two_inputs()
    doc["model_parameters"]["node_info"] = {"conv1": {"ON": "CPU", "InputType0": "int16"}}
    info = config_info(parse(doc, project, check_files=False))
    assert [name for name, _ in info.input_parameters] == ["img", "feat"]
    feat = dict(info.input_parameters[1][1])
    assert (feat["input_type_rt"], feat["mean_value"], feat["input_shape"]) == ("featuremap", "None", "1x64x7x7")
    assert dict(info.model_parameters)["node_info"] == "{'conv1': {'ON': 'CPU', 'InputType0': 'int16'}}"


# --- completing the config from the model ------------------------------------------------------------


def _onnx_with_inputs(path, inputs):
    import onnx
    from onnx import TensorProto, helper

    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Identity", [inputs[0][0]], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", values, [out]), opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    loaded = onnx.load(str(path))
    return [(v.name, [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim])
            for v in loaded.graph.input]


def test_complete_fills_name_and_shape_from_the_model(project):
    model_inputs = _onnx_with_inputs(project / "mobilenetv1.onnx", [("images", [1, 3, 64, 64])])
    cfg = parse(minimal(), project)
    assert cfg.inputs[0].name is None and cfg.inputs[0].input_shape is None
    done = complete_config(cfg, model_inputs)
    assert (done.inputs[0].name, done.inputs[0].input_shape) == ("images", (1, 3, 64, 64))
    assert done.inputs[0].height_width == (64, 64)
    assert cfg.inputs[0].name is None  # frozen: the original is unchanged


def test_complete_runs_the_shape_rules(project):
    model_inputs = _onnx_with_inputs(project / "mobilenetv1.onnx", [("images", [1, 3, 63, 64])])
    with pytest.raises(ConfigError, match="input 'images': input_type_rt nv12 needs an even height and width"):
        complete_config(parse(minimal(), project), model_inputs)


def test_complete_needs_input_shape_for_dynamic_inputs(project):
    model_inputs = _onnx_with_inputs(project / "mobilenetv1.onnx", [("images", [None, 3, 64, 64])])
    with pytest.raises(ConfigError, match="input 'images' has the dynamic shape \\?x3x64x64") as info:
        complete_config(parse(minimal(), project), model_inputs)
    assert info.value.hint == "set input_shape for this input"
    doc = minimal()
    doc["input_parameters"]["input_shape"] = "8x3x64x64"
    assert complete_config(parse(doc, project), model_inputs).inputs[0].input_shape == (8, 3, 64, 64)
    doc["input_parameters"]["input_shape"] = "8x3x32x64"
    with pytest.raises(ConfigError, match="input_shape 8x3x32x64 does not fit the model's \\?x3x64x64"):
        complete_config(parse(doc, project), model_inputs)


def test_complete_checks_names(project):
    multi = [("img", (1, 3, 224, 224)), ("feat", (1, 64, 7, 7))]
    cfg = parse(two_inputs(), project, check_files=False)
    assert [i.input_shape for i in complete_config(cfg, multi).inputs] == [(1, 3, 224, 224), (1, 64, 7, 7)]
    with pytest.raises(ConfigError, match="'feat' is not an input of the model \\(did you mean 'feats'\\?\\)"):
        complete_config(cfg, [("img", (1, 3, 224, 224)), ("feats", (1, 64, 7, 7))])
    with pytest.raises(ConfigError, match="the model input\\(s\\) extra are not configured"):
        complete_config(cfg, multi + [("extra", (1, 1))])
    with pytest.raises(ConfigError, match="input_name is required: the model has 2 inputs \\(img, feat\\)"):
        complete_config(parse(minimal(), project), multi)


def test_complete_checks_an_unnamed_inputs_input_source(project):
    doc = minimal()
    doc["compiler_parameters"]["input_source"] = {"data": "ddr"}
    cfg = parse(doc, project)
    assert cfg.inputs[0].input_source == "ddr"
    assert complete_config(cfg, [("data", (1, 3, 64, 64))]).inputs[0].name == "data"
    with pytest.raises(ConfigError, match="input_source: 'data' is not an input of the model \\(its input is 'images'\\)"):
        complete_config(cfg, [("images", (1, 3, 64, 64))])


# --- the tables agree with the rest of bpuemu -----------------------------------------------------------


def test_tables_agree_with_common_input_types():
    assert set(T.INPUT_TYPES_RT) == set(INPUT_TYPES_RT) == set(INTERMEDIATE_TYPE)
    assert set(T.RT_TYPES_FOR_TRAIN) == set(T.INPUT_TYPES_TRAIN)
    assert all(set(rts) <= set(T.INPUT_TYPES_RT) for rts in T.RT_TYPES_FOR_TRAIN.values())
    # every key belongs to exactly one group
    keys = [p.key for params in T.GROUPS.values() for p in params]
    assert len(keys) == len(set(keys)) == len(T.GROUP_OF_KEY)
    assert set(T.PER_INPUT_KEYS) == {
        "input_type_train", "input_layout_train", "input_type_rt", "input_layout_rt", "input_shape", "norm_type",
        "mean_value", "scale_value", "input_space_and_range", "cal_data_dir", "cal_data_type"}


def test_parse_does_not_modify_its_input(project):
    doc = two_inputs()
    before = copy.deepcopy(doc)
    parse(doc, project, check_files=False)
    assert doc == before
