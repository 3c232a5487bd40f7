"""Every yaml key of the schema either changes what it says it changes, or is answered.

The probe table below has an entry for every key of bpuemu.host.config.tables
(a test fails when the schema gains a key without one). Each probe runs the
real hb_mapper makertbin (in-process, on a tiny model) on a baseline config
and on the config with the key set, and checks the specific output the key
is documented to change -- an artifact, the `.bin`, hb_perf's estimate, a log
line -- or, for a key bpuemu cannot act on, that exactly one WARNING names the
key and says what bpuemu does instead; a value bpuemu cannot take at all must
fail with one error that names the key.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bpuemu.common.container import read_bin
from bpuemu.common.errors import BpuEmuError
from bpuemu.common.proto import model_pb2
from bpuemu.host.config import tables as T
from bpuemu.host.mapper.makertbin import makertbin_from_config
from bpuemu.host.tools import static_perf as perf

from caffe_nets import CaffeNetBuilder
from makertbin_helpers import write_cal_dir

Kind = model_pb2.PlanStep.Kind
SIZE = 8


# --- the project ---------------------------------------------------------------------------

def float_model(seed: int = 0) -> onnx.ModelProto:
    """data -> conv1 -> relu1 -> conv2 -> softmax -> conv3 -> out (a CPU Softmax between two BPU subgraphs)."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def conv(name, x, cin, cout, k):
        inits.append(numpy_helper.from_array((rng.standard_normal((cout, cin, k, k)) * 0.3).astype(np.float32), f"{name}_w"))
        inits.append(numpy_helper.from_array((rng.standard_normal(cout) * 0.1).astype(np.float32), f"{name}_b"))
        nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_out"], name=name,
                                      kernel_shape=[k, k], pads=[k // 2] * 4))
        return f"{name}_out"

    x = conv("conv1", "data", 3, 4, 3)
    nodes.append(helper.make_node("Relu", [x], ["relu1_out"], name="relu1"))
    x = conv("conv2", "relu1_out", 4, 6, 1)
    nodes.append(helper.make_node("Softmax", [x], ["softmax_out"], name="softmax", axis=1))
    conv("conv3", "softmax_out", 6, 5, 1)
    graph = helper.make_graph(nodes, "keys", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("conv3_out", TensorProto.FLOAT, [1, 5, SIZE, SIZE])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("yaml_keys")
    onnx.save(float_model(0), str(d / "float.onnx"))
    onnx.save(float_model(1), str(d / "other.onnx"))
    rng = np.random.default_rng(0)
    write_cal_dir(str(d / "cal"), [rng.integers(0, 256, (1, 3, SIZE, SIZE), dtype=np.uint8) for _ in range(2)])
    write_cal_dir(str(d / "cal_dark"), [rng.integers(0, 64, (1, 3, SIZE, SIZE), dtype=np.uint8) for _ in range(2)])
    # KL needs more values than histogram bins (2048): 12 samples give conv1 3072
    outliers = [rng.integers(118, 138, (1, 3, SIZE, SIZE), dtype=np.uint8) for _ in range(12)]
    for a in outliers:
        a[0, :, 0, 0] = 255                           # one bright pixel: max keeps it, kl clips it
    write_cal_dir(str(d / "cal_outlier"), outliers)
    (d / "images").mkdir()
    for i in range(2):
        Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(d / "images" / f"{i}.png")
    (d / "custom_op").mkdir()
    (d / "custom_op" / "sample_custom.py").write_text("")
    net = CaffeNetBuilder("caffe_keys").input("data", (1, 3, SIZE, SIZE))
    net.layer("caffe_conv", "Convolution", "data", blobs=[net.randn(4, 3, 3, 3), net.randn(4)],
              convolution_param={"num_output": 4, "kernel_size": [3], "pad": [1]})
    net.write(str(d), "m")
    return d


def base_config() -> Dict[str, dict]:
    return {
        "model_parameters": {"onnx_model": "float.onnx", "march": "bayes-e", "output_model_file_prefix": "keys"},
        "input_parameters": {"input_name": "data", "input_type_train": "rgb", "input_layout_train": "NCHW",
                             "input_type_rt": "rgb", "input_layout_rt": "NHWC", "input_shape": f"1x3x{SIZE}x{SIZE}",
                             "norm_type": "data_mean_and_scale", "mean_value": "128 128 128", "scale_value": "0.0078125"},
        "calibration_parameters": {"cal_data_dir": "cal", "cal_data_type": "uint8", "calibration_type": "max"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }


# --- one makertbin run, and what it left behind -------------------------------------------------

@dataclass
class Run:
    directory: str
    error: Optional[BpuEmuError] = None
    records: List[logging.LogRecord] = field(default_factory=list)
    bin_path: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def error_text(self) -> str:
        return f"{self.error} {getattr(self.error, 'hint', '') or ''}" if self.error else ""

    def warnings(self, word: str) -> List[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING and word in r.getMessage()]

    def logged(self, text: str) -> bool:
        return any(text in r.getMessage() for r in self.records)

    @property
    def model(self) -> model_pb2.Model:
        return read_bin(self.bin_path).model()

    def artifact(self, suffix: str) -> onnx.ModelProto:
        base = self.bin_path[: -len(".bin")]
        return onnx.load(base + suffix)

    def quantized(self) -> onnx.ModelProto:
        return self.artifact("_quantized_model.onnx")

    def init(self, suffix: str, name: str) -> np.ndarray:
        return next(numpy_helper.to_array(t) for t in self.artifact(suffix).graph.initializer if t.name == name)

    def estimate(self):
        b = read_bin(self.bin_path)
        return perf.estimate_model(b.model(), b.blobs)

    def step_kind_of(self, node: str):
        return next(s.kind for s in self.model.plan if node in s.source_nodes or s.name == node)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: List[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def makertbin(project, name: str, doc: Dict[str, dict], model_type: str = "onnx") -> Run:
    import yaml

    d = project / name
    d.mkdir()
    doc = {g: dict(v) for g, v in doc.items()}
    doc["model_parameters"].setdefault("working_dir", str(d / "model_output"))
    for key in ("onnx_model", "prototxt", "caffe_model"):
        if key in doc["model_parameters"]:
            doc["model_parameters"][key] = str(project / doc["model_parameters"][key])
    cal = doc["calibration_parameters"]
    if "cal_data_dir" in cal:
        cal["cal_data_dir"] = str(project / cal["cal_data_dir"])
    if "custom_op_dir" in doc.get("custom_op", {}):
        doc["custom_op"]["custom_op_dir"] = str(project / doc["custom_op"]["custom_op_dir"])
    path = d / "config.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    run = Run(str(d))
    handler = _Collect()
    root = logging.getLogger("bpuemu")
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        run.bin_path = makertbin_from_config(str(path), model_type).bin
    except BpuEmuError as exc:
        run.error = exc
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    run.records = handler.records
    return run


# --- the probes ------------------------------------------------------------------------------

Doc = Dict[str, dict]


def setting(**groups) -> Callable[[Doc], None]:
    """A change to the config: {group: {key: value}}; a value None removes the key."""
    def apply(doc: Doc) -> None:
        for group, values in groups.items():
            body = doc.setdefault(group, {})
            for k, v in values.items():
                if v is None:
                    body.pop(k, None)
                else:
                    body[k] = v
    return apply


def model(**kw):
    return setting(model_parameters=kw)


def inputs(**kw):
    return setting(input_parameters=kw)


def calibration(**kw):
    return setting(calibration_parameters=kw)


def compiler(**kw):
    return setting(compiler_parameters=kw)


@dataclass
class Probe:
    """``variant`` sets the key (on top of ``base``); ``check(base_run, variant_run)`` asserts its effect.

    ``warns``: instead of a check, exactly one WARNING must name this text (the key) and say what bpuemu
    does; ``rejects``: the variant must fail with an error naming it.
    """

    variant: Callable[[Doc], None]
    check: Optional[Callable[[Run, Run], None]] = None
    base: Callable[[Doc], None] = lambda doc: None
    warns: str = ""
    rejects: str = ""
    model_type: str = "onnx"


def _differs(a, b) -> bool:
    return a.shape != b.shape or not np.array_equal(a, b)


def _hz(run: Run, which: str) -> np.ndarray:
    return run.init("_original_float_model.onnx", f"HzPreprocess_{which}")


def _scales(run: Run) -> Dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in run.quantized().graph.initializer if t.name.endswith("_scale")}


def _activation_scales_differ(base: Run, run: Run) -> bool:
    a, b = _scales(base), _scales(run)
    return any(_differs(a[k], b[k]) for k in a if k.endswith("_out_scale"))


def _zero_point_types(run: Run) -> set:
    return {t.data_type for t in run.quantized().graph.initializer if t.name.endswith("_zero_point")}


def _on_bpu(run: Run, node: str) -> bool:
    return run.step_kind_of(node) == Kind.BPU_SUBGRAPH


def _check_caffe(base: Run, run: Run) -> None:
    # the Caffe net (prototxt + caffemodel) is what was converted
    assert run.ok, run.error_text
    assert [o.name for o in run.model.outputs] == ["caffe_conv"]


def _check_strategy(mode: str, level: str = "O3"):
    def check(base: Run, run: Run) -> None:
        est, ref = run.estimate(), base.estimate()
        assert (est.strategy.compile_mode, est.strategy.optimize_level) == (mode, level)
        assert (est.latency_us, est.ddr_bytes) != (ref.latency_us, ref.ddr_bytes)
        assert run.logged(f"static performance estimate, compile_mode {mode}")
    return check


def _check_balance(base: Run, run: Run) -> None:
    est, ref = run.estimate(), base.estimate()      # balance_factor 0 vs 100
    assert est.strategy.balance_factor == 0 and ref.strategy.balance_factor == 100
    assert est.ddr_bytes < ref.ddr_bytes


def _dequantize_step(run: Run) -> str:
    return next(s.name for s in run.model.plan if s.kind == Kind.DEQUANTIZE)


def _check_removed(base: Run, run: Run) -> None:
    assert any(s.kind == Kind.DEQUANTIZE for s in base.model.plan)
    assert not any(s.kind == Kind.DEQUANTIZE for s in run.model.plan)
    assert list(run.model.build_info.deleted_nodes)


def _check_image_calibration(base: Run, run: Run) -> None:
    assert not base.ok and "preprocess_on" in base.error_text     # the same images without it
    assert run.ok, run.error_text


def _output_type(run: Run) -> int:
    return run.model.outputs[0].tensor_type


PROBES: Dict[str, List[Probe]] = {
    # model_parameters
    "prototxt": [Probe(model(onnx_model=None, prototxt="m.prototxt", caffe_model="m.caffemodel"), _check_caffe,
                       model_type="caffe")],
    "caffe_model": [Probe(model(onnx_model=None, prototxt="m.prototxt", caffe_model="m.caffemodel"), _check_caffe,
                          model_type="caffe")],
    "onnx_model": [Probe(model(onnx_model="other.onnx"),
                         lambda b, r: _differs(b.init("_quantized_model.onnx", "conv1_w_quantized"),
                                               r.init("_quantized_model.onnx", "conv1_w_quantized")))],
    "march": [Probe(model(march="bayes"), rejects="march"),
              Probe(model(march="bayes-e"), lambda b, r: r.model.march == "bayes-e")],
    "output_model_file_prefix": [Probe(model(output_model_file_prefix="renamed"),
                                       lambda b, r: os.path.basename(r.bin_path) == "renamed.bin")],
    "working_dir": [Probe(model(working_dir="/nonexistent-placeholder"), None)],   # replaced below
    "layer_out_dump": [Probe(model(layer_out_dump=True), lambda b, r: len(r.model.outputs) > len(b.model.outputs))],
    "output_nodes": [Probe(model(output_nodes="conv2"),
                           lambda b, r: [o.name for o in r.model.outputs] != [o.name for o in b.model.outputs]
                           and not any("conv3" in n for s in r.model.plan for n in s.source_nodes))],
    "remove_node_type": [Probe(model(remove_node_type="Dequantize"), _check_removed)],
    "remove_node_name": [],   # needs the base's node name: added in the test
    "set_node_data_type": [Probe(model(set_node_data_type="conv2:int16"),
                                 lambda b, r: TensorProto.INT16 in _zero_point_types(r)
                                 and TensorProto.INT16 not in _zero_point_types(b))],
    "debug_mode": [Probe(model(debug_mode="dump_calibration_data"),
                         lambda b, r: os.path.isdir(os.path.join(os.path.dirname(r.bin_path), "calibration_data")))],
    "node_info": [Probe(model(node_info={"relu1": {"ON": "CPU"}}),
                        lambda b, r: _on_bpu(b, "relu1") and r.step_kind_of("relu1") == Kind.CPU_OP)],
    # input_parameters
    "input_name": [Probe(inputs(input_name="image"), rejects="input_name")],
    "input_type_train": [Probe(inputs(input_type_train="bgr"), lambda b, r: _differs(_hz(b, "w"), _hz(r, "w")))],
    "input_layout_train": [Probe(inputs(input_layout_train="NHWC"), rejects="input_layout_train")],
    "input_type_rt": [Probe(inputs(input_type_rt="bgr"),
                            lambda b, r: r.model.inputs[0].tensor_type == model_pb2.HB_DNN_IMG_TYPE_BGR
                            and b.model.inputs[0].tensor_type == model_pb2.HB_DNN_IMG_TYPE_RGB)],
    "input_layout_rt": [Probe(inputs(input_layout_rt="NCHW"),
                              lambda b, r: r.model.inputs[0].tensor_layout != b.model.inputs[0].tensor_layout)],
    "input_space_and_range": [Probe(inputs(input_space_and_range="bt601_video"),
                                    lambda b, r: _differs(_hz(b, "w"), _hz(r, "w"))
                                    and r.model.input_specs[0].input_space_and_range == "bt601_video",
                                    base=inputs(input_type_rt="nv12", input_layout_rt=None))],
    "input_shape": [Probe(inputs(input_shape=f"1x3x{SIZE * 2}x{SIZE * 2}"), rejects="input_shape")],
    "input_batch": [Probe(inputs(input_batch=2), lambda b, r: r.model.inputs[0].valid_shape[0] == 2
                          and b.model.inputs[0].valid_shape[0] == 1)],
    "norm_type": [Probe(inputs(norm_type="no_preprocess", mean_value=None, scale_value=None),
                        lambda b, r: _differs(_hz(b, "w"), _hz(r, "w")))],
    "mean_value": [Probe(inputs(mean_value="0 0 0"), lambda b, r: _differs(_hz(b, "b"), _hz(r, "b")))],
    "scale_value": [Probe(inputs(scale_value="0.5"), lambda b, r: _differs(_hz(b, "w"), _hz(r, "w")))],
    # calibration_parameters
    "cal_data_dir": [Probe(calibration(cal_data_dir="cal_dark"),
                           lambda b, r: _scales(b)["conv1_out_scale"] != _scales(r)["conv1_out_scale"])],
    "cal_data_type": [Probe(calibration(cal_data_type="float32"), rejects="cal_data_type")],
    "preprocess_on": [Probe(calibration(preprocess_on=True), _check_image_calibration,
                            base=calibration(cal_data_dir="images", cal_data_type=None))],
    "calibration_type": [Probe(calibration(calibration_type="kl"), lambda b, r: _activation_scales_differ(b, r),
                               base=calibration(cal_data_dir="cal_outlier"))],
    "max_percentile": [Probe(calibration(max_percentile=0.6),
                             lambda b, r: _scales(r)["conv1_out_scale"] < _scales(b)["conv1_out_scale"])],
    "per_channel": [Probe(calibration(per_channel=True),   # per-channel featuremaps (weights are per channel anyway)
                          lambda b, r: _scales(r)["conv1_out_scale"].size == 4 and _scales(b)["conv1_out_scale"].size == 1)],
    "run_on_cpu": [Probe(calibration(run_on_cpu="relu1"), lambda b, r: r.step_kind_of("relu1") == Kind.CPU_OP)],
    "run_on_bpu": [Probe(calibration(run_on_bpu="softmax"), lambda b, r: not _on_bpu(b, "softmax") and _on_bpu(r, "softmax"))],
    "optimization": [
        Probe(calibration(optimization="set_model_output_int8"),
              lambda b, r: _output_type(r) == model_pb2.HB_DNN_TENSOR_TYPE_S8 != _output_type(b)),
        Probe(calibration(optimization="set_model_output_int16"),
              lambda b, r: _output_type(r) == model_pb2.HB_DNN_TENSOR_TYPE_S16),
        Probe(calibration(optimization="set_Conv_input_int16"), lambda b, r: TensorProto.INT16 in _zero_point_types(r)),
        Probe(calibration(optimization="set_Conv_output_int16"), lambda b, r: TensorProto.INT16 in _zero_point_types(r)),
        Probe(calibration(optimization="set_Softmax_input_int8"), lambda b, r: _on_bpu(r, "softmax")),
        Probe(calibration(optimization="set_Softmax_output_int8"), lambda b, r: _on_bpu(r, "softmax")),
        Probe(calibration(optimization="asymmetric"),
              lambda b, r: any(np.any(numpy_helper.to_array(t) != 0) for t in r.quantized().graph.initializer
                               if t.name.endswith("_zero_point") and t.name != "data_zero_point")),
        Probe(calibration(optimization="bias_correction"),
              lambda b, r: _differs(b.init("_quantized_model.onnx", "conv1_b_quantized"),
                                    r.init("_quantized_model.onnx", "conv1_b_quantized"))),
        Probe(calibration(optimization="lstm_batch_last"), warns="lstm_batch_last"),
    ],
    # compiler_parameters
    "compile_mode": [Probe(compiler(compile_mode="bandwidth"), _check_strategy("bandwidth"))],
    "balance_factor": [Probe(compiler(balance_factor=0), _check_balance,
                             base=compiler(compile_mode="balance", balance_factor=100))],
    "debug": [Probe(compiler(debug=True), lambda b, r: perf.is_debug_build(r.model) and not perf.is_debug_build(b.model))],
    "core_num": [Probe(compiler(core_num=2), rejects="core_num")],
    "optimize_level": [Probe(compiler(optimize_level="O0"), _check_strategy("latency", "O0"))],
    "input_source": [Probe(compiler(input_source={"data": "ddr"}),
                           lambda b, r: b.model.inputs[0].input_source == model_pb2.HB_DNN_INPUT_FROM_PYRAMID
                           and r.model.inputs[0].input_source == model_pb2.HB_DNN_INPUT_FROM_DDR,
                           base=inputs(input_type_rt="nv12", input_layout_rt=None))],
    "max_time_per_fc": [Probe(compiler(max_time_per_fc=1000), warns="max_time_per_fc")],
    "jobs": [Probe(compiler(jobs=2), warns="jobs")],
    "advice": [Probe(compiler(advice=1), lambda b, r: r.logged("advice: ") and not b.logged("advice: "))],
    # custom_op
    "custom_op_method": [Probe(setting(custom_op={"custom_op_method": "register"}), warns="custom_op_method")],
    "op_register_files": [Probe(setting(custom_op={"op_register_files": "sample_custom.py", "custom_op_dir": "custom_op"}),
                                warns="op_register_files")],
    "custom_op_dir": [Probe(setting(custom_op={"op_register_files": "sample_custom.py", "custom_op_dir": "custom_op"}),
                            warns="custom_op_dir")],
}


def test_every_key_of_the_schema_has_a_probe():
    schema = {p.key for params in T.GROUPS.values() for p in params}
    assert set(PROBES) == schema


def _working_dir_probe(project) -> Probe:
    elsewhere = str(project / "elsewhere_output")
    return Probe(model(working_dir=elsewhere), lambda b, r: os.path.dirname(r.bin_path) == elsewhere)


def _remove_node_name_probe(base: Run) -> Probe:
    return Probe(model(remove_node_name=_dequantize_step(base)), _check_removed)


def test_every_key_changes_its_output_or_warns(project):
    runs: Dict[str, Run] = {}

    def run_of(name, change, model_type="onnx") -> Run:
        doc = base_config()
        change(doc)
        return makertbin(project, name, doc, model_type)

    base = run_of("base", lambda doc: None)
    assert base.ok, base.error_text
    assert not [r for r in base.records if r.levelno >= logging.WARNING], "the baseline config warns"
    probes = dict(PROBES)
    probes["working_dir"] = [_working_dir_probe(project)]
    probes["remove_node_name"] = [_remove_node_name_probe(base)]
    failures = []
    for key, key_probes in probes.items():
        assert key_probes, key
        for i, probe in enumerate(key_probes):
            label = f"{key}[{i}]"
            ref = run_of(f"{label}_base", probe.base) if probe.base is not Probe.base else base
            if probe.base is not Probe.base and probe.check is not _check_image_calibration:
                assert ref.ok, f"{label} baseline: {ref.error_text}"

            def both(doc, probe=probe):
                probe.base(doc)
                probe.variant(doc)

            run = run_of(label, both, probe.model_type)
            runs[label] = run
            try:
                if probe.rejects:
                    assert not run.ok, f"{label}: accepted"
                    assert probe.rejects in run.error_text, run.error_text
                    continue
                assert run.ok, run.error_text
                if probe.warns:
                    warned = run.warnings(probe.warns)
                    assert len(warned) == 1, f"{label}: warnings naming {probe.warns}: {warned}"
                    assert "bpuemu" in warned[0], warned[0]
                else:
                    result = probe.check(ref, run)
                    assert result is None or result, f"{label}: no change"
            except AssertionError as exc:
                failures.append(f"{label}: {exc}")
    assert not failures, "\n".join(failures)


def test_a_custom_operator_is_one_clear_error(project, tmp_path):
    m = float_model(0)
    m.graph.node[1].domain = "horizon.custom"
    m.opset_import.append(helper.make_opsetid("horizon.custom", 1))
    path = project / "custom.onnx"
    onnx.save(m, str(path))
    doc = base_config()
    doc["model_parameters"]["onnx_model"] = "custom.onnx"
    doc["custom_op"] = {"custom_op_method": "register", "op_register_files": "sample_custom.py", "custom_op_dir": "custom_op"}
    run = makertbin(project, "custom", doc)
    assert not run.ok and not run.bin_path
    assert "node 'relu1' (type Relu, domain 'horizon.custom') is a custom operator" in str(run.error)
    assert "standard ONNX operators" in run.error_text
