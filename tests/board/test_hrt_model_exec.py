"""hrt_model_exec against a real hrt_boardd: the same command line, local or --board.

Every command runs as the user would run it (``python -m
bpuemu.board.cli.hrt_model_exec`` in a subprocess, from a scratch directory).
Outputs dumped locally and through the board must be identical byte for byte;
errors must be one ``ERROR`` line (plus an optional ``Hint:``), never a
traceback, and must leave the daemon serving with a clean model store.
"""
import csv
import json
import os
import re

import numpy as np
import pytest
from PIL import Image

from bpuemu.board.backends import LocalBackend
from bpuemu.board.runtime.inputs import read_input
from bpuemu.common.container import file_sha256
from bpuemu.common.input_types import image_to_rt

from boardd_harness import (
    assert_daemon_serves,
    assert_ok,
    assert_one_error,
    assert_store_clean,
    damaged_copies,
    run_cli,
)


def _board(board):
    return ["--board", board.target]


# --- infer: local and remote outputs are identical bit for bit ---------------

def _write_input(model, fmt: str, directory) -> tuple:
    """Write an input file for ``model`` as ``fmt``; returns (path, the input_type_rt array it holds or None)."""
    path = os.path.join(os.fspath(directory), f"input.{fmt}")
    if fmt == "bin":
        model.x.tofile(path)
        return path, model.x
    if fmt == "npy":
        np.save(path, model.x)
        return path, model.x
    rgb = np.random.default_rng(7).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    # PNG is lossless (and 32x32 needs no resize), so we know exactly what the tool must feed.
    return path, image_to_rt(rgb, model.spec) if fmt == "png" else None


def _dumped(directory) -> dict:
    files = sorted(os.listdir(directory))
    out = {}
    for name in files:
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest.mark.parametrize(
    "kind, fmt",
    [("rgb", "bin"), ("rgb", "npy"), ("rgb", "png"), ("rgb", "jpg"),
     ("nv12", "bin"), ("nv12", "png"), ("featuremap", "bin"), ("featuremap", "npy")],
)
def test_infer_dump_local_and_board_identical(board, sample_models, scratch, tmp_path, kind, fmt):
    model = sample_models[kind]
    input_path, fed = _write_input(model, fmt, tmp_path)
    dumps = {}
    for where, extra in (("local", []), ("board", _board(board))):
        dump_dir = tmp_path / f"dump_{where}"
        result = run_cli(["infer", "--model_file", model.path, "--input_file", input_path, "--enable_dump", "true",
                          "--dump_format", "bin", "--dump_intermediate", "1", "--dump_path", dump_dir, *extra], scratch)
        assert_ok(result)
        assert f"infer success: model {model.name}" in result.stdout
        dumps[where] = _dumped(dump_dir)

    output_file = f"{model.name}_output_0_prob.bin"
    assert output_file in dumps["local"]
    assert any(n.startswith("layer-") for n in dumps["local"]), sorted(dumps["local"])
    assert sorted(dumps["board"]) == sorted(dumps["local"])
    for name, data in dumps["local"].items():
        assert dumps["board"][name] == data, f"{name} differs between local and board"

    # And the tool fed what the file holds: compare with the runtime run directly.
    if fed is None:
        fed = read_input(input_path, model.spec)
    with LocalBackend([model.path]) as local:
        expected = local.model().infer([fed]).outputs["prob"]
    assert np.fromfile(tmp_path / "dump_board" / output_file, dtype=np.float32).tobytes() == expected.astype(np.float32).tobytes()
    assert not os.listdir(scratch), "the tool wrote into its working directory"


def test_infer_txt_dump_and_random_inputs_through_board(board, rgb_model, scratch, tmp_path):
    """No --input_file: both sides use the same seeded random input, so even that matches."""
    texts = {}
    for where, extra in (("local", []), ("board", _board(board))):
        dump_dir = tmp_path / where
        result = run_cli(["infer", "--model_file", rgb_model.path, "--enable_dump", "true", "--dump_format", "txt",
                          "--dump_path", dump_dir, *extra], scratch)
        assert_ok(result)
        assert "using random inputs" in result.stderr
        texts[where] = (dump_dir / f"{rgb_model.name}_output_0_prob.txt").read_text()
    assert texts["board"] == texts["local"]
    values = np.array(texts["board"].split(), dtype=np.float64)
    assert values.shape == (10,) and abs(values.sum() - 1.0) < 1e-3  # a softmax


@pytest.fixture(scope="module")
def int8_output_model(tmp_path_factory) -> str:
    """A sample CNN without its Softmax, compiled with set_model_output_int8: its logits leave the BPU as int8."""
    from onnx import TensorProto, helper

    from bpuemu.common.container import write_bin
    from bpuemu.host import quant
    from bpuemu.host.compiler.partition import compile_model, featuremap_specs
    from bpuemu.host.compiler.placement import place
    from bpuemu.host.samples import calibration_samples, sample_float_model

    f = sample_float_model(16, 16, image_input=False)
    gemm = f.graph.node[-2]
    f.graph.node.pop()
    f.graph.output.pop()
    f.graph.output.append(helper.make_tensor_value_info(gemm.output[0], TensorProto.FLOAT, [1, 10]))
    params = quant.calibrate(f, calibration_samples(f, image_input=False), place(f).bpu_nodes, [],
                             quant.QuantOptions(calibration_type="max", model_output_type="int8"))
    q = quant.build_quantized_model(f, params, [])
    compiled = compile_model(q, "int8out", featuremap_specs(q))
    path = str(tmp_path_factory.mktemp("int8out") / "int8out.bin")
    write_bin(path, [compiled.model], compiled.blobs)
    return path


def test_infer_prints_the_top5_of_an_int8_output_as_integers(board, int8_output_model, scratch):
    for extra in ([], _board(board)):
        result = run_cli(["infer", "--model_file", int8_output_model, *extra], scratch)
        assert_ok(result)
        assert re.search(r"output\[0\]: name: \S+, shape: \[1, 10\], dtype: int8, min: -?\d+, max: (-?\d+)", result.stdout)
        top = re.search(r"top5: (.*)", result.stdout).group(1).split(", ")
        values = [v.split(":")[1] for v in top]
        assert len(values) == 5 and all(re.fullmatch(r"-?\d+", v) for v in values), top   # 89, not 89.000000
        maximum = re.search(r"max: (-?\d+)", result.stdout).group(1)
        assert values[0] == maximum and [int(v) for v in values] == sorted(map(int, values), reverse=True)


# --- model_info ----------------------------------------------------------------

def _tensor_blocks(text: str) -> dict:
    """'input[0]' / 'output[0]' -> {field: value} from model_info output."""
    blocks, current = {}, None
    for line in text.splitlines():
        m = re.match(r"^((?:input|output)\[\d+\]): $", line)
        if m:
            current = blocks.setdefault(m.group(1), {})
            continue
        if current is not None:
            if not line.strip() or line.startswith("---"):
                current = None
                continue
            key, sep, value = line.partition(": ")
            if not sep and line.endswith(":"):
                key, value = line[:-1], ""
            current[key] = value.strip()
    return blocks


FIELDS = ["name", "valid shape", "aligned shape", "aligned byte size", "tensor type", "tensor layout",
          "quanti type", "stride", "scale data", "quantizeAxis"]

EXPECTED_INPUT = {
    "rgb": {"input source": "HB_DNN_INPUT_FROM_DDR", "valid shape": "(1,32,32,3,)", "aligned byte size": "3072",
            "tensor type": "HB_DNN_IMG_TYPE_RGB", "tensor layout": "HB_DNN_LAYOUT_NHWC", "stride": "(3072,96,3,1,)"},
    "nv12": {"input source": "HB_DNN_INPUT_FROM_PYRAMID", "valid shape": "(1,3,32,32,)",
             "aligned byte size": str(32 * 32 * 3 // 2), "tensor type": "HB_DNN_IMG_TYPE_NV12"},
    "featuremap": {"input source": "HB_DNN_INPUT_FROM_DDR", "valid shape": "(1,3,32,32,)",
                   "aligned byte size": str(3 * 32 * 32 * 4), "tensor type": "HB_DNN_TENSOR_TYPE_F32",
                   "tensor layout": "HB_DNN_LAYOUT_NCHW", "stride": "(12288,4096,128,4,)"},
}


@pytest.mark.parametrize("kind", ["rgb", "nv12", "featuremap"])
def test_model_info_local_and_board(board, sample_models, scratch, kind):
    model = sample_models[kind]
    texts = {}
    for where, extra in (("local", []), ("board", _board(board))):
        result = run_cli(["model_info", "--model_file", model.path, *extra], scratch)
        assert_ok(result)
        texts[where] = result.stdout
    assert texts["local"].splitlines()[0].startswith("Load model on local runtime")
    assert texts["board"].splitlines()[0].startswith(f"Load model on board {board.target}")
    # Everything after the load line is the same wherever the model runs.
    assert texts["board"].splitlines()[1:] == texts["local"].splitlines()[1:]
    assert f"[model name]: {model.name}" in texts["board"]

    blocks = _tensor_blocks(texts["board"])
    assert set(blocks) == {"input[0]", "output[0]"}
    inp, out = blocks["input[0]"], blocks["output[0]"]
    for field in FIELDS + ["input source"]:
        assert field in inp, f"input[0] lacks '{field}': {inp}"
    for field in FIELDS:
        assert field in out, f"output[0] lacks '{field}': {out}"
    assert "input source" not in out
    assert inp["name"] == "data"
    for field, value in EXPECTED_INPUT[kind].items():
        assert inp[field] == value, (field, inp)
    assert inp["aligned shape"] == inp["valid shape"]
    assert out == {"name": "prob", "valid shape": "(1,10,)", "aligned shape": "(1,10,)", "aligned byte size": "40",
                   "tensor type": "HB_DNN_TENSOR_TYPE_F32", "tensor layout": "HB_DNN_LAYOUT_NONE",
                   "quanti type": "NONE", "stride": "(40,4,)", "scale data": "", "quantizeAxis": "-1"}


# --- perf -------------------------------------------------------------------------

def _two_json_docs(text: str) -> tuple:
    parts = re.split(r"^\s*\*\*\*\s*$", text, flags=re.M)
    assert len(parts) == 2, text
    return json.loads(parts[0]), json.loads(parts[1])


def _check_stat(stat: dict, what: str) -> None:
    assert set(stat) - {"x5_time"} == {"avg_time", "max_time", "min_time"}, (what, stat)   # x5_time: the modeled X5 time
    assert 0 <= stat["min_time"] <= stat["avg_time"] <= stat["max_time"], (what, stat)


def test_perf_on_board_with_profile(board, rgb_model, scratch, tmp_path):
    profile_dir = tmp_path / "profile"
    result = run_cli(["perf", "--model_file", rgb_model.path, "--profile_path", profile_dir,
                      "--thread_num", "2", "--frame_count", "20", *_board(board)], scratch)
    assert_ok(result)
    out = result.stdout
    assert "Running condition:" in out
    assert "Thread number is: 2" in out
    assert "Frame count   is: 20" in out
    fps = re.search(r"^\s*Frame      rate       is: (\d+(?:\.\d+)?) FPS$", out, flags=re.M)
    assert fps and float(fps.group(1)) > 0, out
    avg = re.search(r"Average    latency    is: (\d+\.\d+) ms", out)
    assert avg and float(avg.group(1)) > 0, out

    summary, detail = _two_json_docs((profile_dir / "profiler.log").read_text())
    assert set(summary) == {"perf_result", "running_condition", "x5_model"}
    assert summary["x5_model"]["thread_num"] == 2 and summary["x5_model"]["fps"] > 0
    assert set(summary["perf_result"]) == {"FPS", "average_latency"}
    assert summary["perf_result"]["FPS"] == pytest.approx(float(fps.group(1)), rel=1e-5)
    assert summary["perf_result"]["average_latency"] > 0
    rc = summary["running_condition"]
    assert set(rc) == {"core_id", "frame_count", "model_name", "run_time", "thread_num"}
    assert (rc["core_id"], rc["frame_count"], rc["model_name"], rc["thread_num"]) == (0, 20, rgb_model.name, 2)
    assert rc["run_time"] > 0

    assert set(detail) == {"processor_latency", "model_latency", "task_latency"}
    assert set(detail["processor_latency"]) == {"BPU_inference_time_cost", "CPU_inference_time_cost"}
    assert set(detail["task_latency"]) == {"TaskPendingTime", "TaskRunningTime"}
    assert "Preprocess" in detail["model_latency"]
    assert f"BPU_{rgb_model.name}_subgraph_0" in detail["model_latency"]
    for group in ("processor_latency", "model_latency", "task_latency"):
        for name, stat in detail[group].items():
            _check_stat(stat, name)

    with open(profile_dir / "profiler.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) >= {"Preprocess", f"BPU_{rgb_model.name}_subgraph_0", "BPU_inference_time_cost",
                            "CPU_inference_time_cost", "TaskPendingTime", "TaskRunningTime"}
    assert by_name[f"BPU_{rgb_model.name}_subgraph_0"]["processor"] == "BPU"
    assert int(by_name["Preprocess"]["count"]) == 20
    for name in detail["model_latency"]:
        assert float(by_name[name]["avg_time_ms"]) == pytest.approx(detail["model_latency"][name]["avg_time"], abs=1e-5)


def test_perf_time_bound_on_board(board, rgb_model, scratch):
    result = run_cli(["perf", "--model_file", rgb_model.path, "--perf_time", "0.005", *_board(board)], scratch)
    assert_ok(result)
    frames = int(re.search(r"Frame count   is: (\d+)", result.stdout).group(1))
    run_ms = float(re.search(r"Program run time: (\d+\.\d+) ms", result.stdout).group(1))
    assert frames > 1
    assert 0.005 * 60e3 <= run_ms < 10 * 0.005 * 60e3, result.stdout  # ran about 300 ms, not frame_count frames
    assert frames != 200  # the frame_count default played no part


def test_upload_is_content_addressed(board, tmp_path, scratch):
    """The first --board run uploads the model; the second finds it by SHA-256 and sends nothing."""
    from bpuemu.host.samples import sample_bin

    path = str(tmp_path / "fresh.bin")
    sha = sample_bin(path, input_type_rt="rgb", height=32, width=32, seed=11)
    stored = os.path.join(board.model_dir, f"{sha}.bin")
    with board.client() as c:
        assert not c.has_model(sha).present
        before = len(c.list_models())

    assert_ok(run_cli(["model_info", "--model_file", path, *_board(board)], scratch))
    st = os.stat(stored)
    with board.client() as c:
        assert c.has_model(sha).present
        models = {m.sha256: m for m in c.list_models()}
    assert len(models) == before + 1
    assert models[sha].size == os.path.getsize(path) and models[sha].file_name == "fresh.bin"

    assert_ok(run_cli(["infer", "--model_file", path, *_board(board)], scratch))
    again = os.stat(stored)
    assert (again.st_ino, again.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), "the model was stored again"
    with board.client() as c:
        assert len(c.list_models()) == before + 1
        assert c.upload(path).already_present
    assert "stored model" in board.log() and board.log().count(f"stored model {sha[:12]}") == 1


# --- errors: one line, the daemon keeps serving --------------------------------

def _bad_input_files(model, directory) -> dict:
    d = os.fspath(directory)
    paths = {"short": os.path.join(d, "short.bin"), "float": os.path.join(d, "float.npy")}
    np.zeros(100, np.uint8).tofile(paths["short"])
    np.save(paths["float"], model.x.astype(np.float32))
    return paths


BAD_REQUESTS = {
    # id: (extra args given the files, words the ERROR line must hold)
    "unknown_model_name": (lambda m, f: ["--model_name", "nope"], ["'nope'", "not in"]),
    "wrong_input_size": (lambda m, f: ["--input_file", f["short"]], ["3072 bytes", "got 100"]),
    "wrong_dtype": (lambda m, f: ["--input_file", f["float"]], ["must be uint8", "float32"]),
    "wrong_input_count": (lambda m, f: ["--input_file", f"{f['short']},{f['short']}"], ["1 input(s)", "2 input file(s)"]),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_infer_request_is_one_line(board, rgb_model, scratch, tmp_path, case):
    extra, words = BAD_REQUESTS[case]
    args = ["infer", "--model_file", rgb_model.path, *extra(rgb_model, _bad_input_files(rgb_model, tmp_path)), *_board(board)]
    assert_one_error(run_cli(args, scratch), *words, exit_code=1)
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


@pytest.mark.parametrize("kind, words", [
    ("corrupt", ["corrupt", "checksum mismatch"]),
    ("truncated", ["truncated"]),
    ("wrong_magic", ["not a bpuemu .bin model", "magic"]),
    ("newer_major", ["format 99.", "newer"]),
])
def test_damaged_model_file_is_one_line(board, rgb_model, scratch, tmp_path, kind, words):
    path = damaged_copies(rgb_model.path, tmp_path)[kind]
    line = assert_one_error(run_cli(["infer", "--model_file", path, *_board(board)], scratch), *words, exit_code=1)
    assert f"{kind}.bin" in line and board.target in line
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)
    assert_store_clean(board)
    assert f"{file_sha256(path)}.bin" not in board.store_files()


def test_missing_model_file_is_one_line(board, rgb_model, scratch, tmp_path):
    missing = tmp_path / "nowhere.bin"
    assert_one_error(run_cli(["model_info", "--model_file", missing, *_board(board)], scratch),
                     "model file not found", "nowhere.bin", exit_code=1)
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


def test_unreachable_board_is_one_line(rgb_model, scratch):
    result = run_cli(["infer", "--model_file", rgb_model.path, "--board", "127.0.0.1:1"], scratch)
    assert_one_error(result, "127.0.0.1:1", "unreachable", exit_code=1)


def test_thread_num_out_of_range_is_a_usage_error(board, rgb_model, scratch):
    result = run_cli(["perf", "--model_file", rgb_model.path, "--thread_num", "9", *_board(board)], scratch)
    assert result.returncode == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--thread_num" in errors[0] and "9" in errors[0], result.stderr
    assert "Running condition" not in result.stdout
    assert_daemon_serves(board, rgb_model.path, rgb_model.x)


# --- --json: the machine-readable output (bpuemu.common.exec_json) -------------------------

def test_json_infer_on_board_names_every_dump(board, rgb_model, scratch, tmp_path):
    from bpuemu.common.exec_json import dump_file, entry_dtype_shape, read_document

    np.save(tmp_path / "x.npy", rgb_model.x)
    result = run_cli(["infer", "--model_file", rgb_model.path, "--input_file", tmp_path / "x.npy", "--frame_count", "3",
                      "--enable_dump", "--dump_intermediate", "1", "--dump_path", "out", "--json", *_board(board)], scratch)
    assert_ok(result)
    doc = read_document(result.stdout, "infer")
    assert doc["model"] == rgb_model.model.name and len(doc["latency_ms"]) == 3 and doc["load_ms"] >= 0
    assert doc["board"]["arch"] and doc["board"]["onnxruntime_version"]
    expected = LocalBackend([rgb_model.path]).model().infer([rgb_model.x], dump_intermediate=True)
    assert [e["name"] for e in doc["outputs"]] == list(expected.outputs)
    assert {e["name"] for e in doc["intermediates"]} == set(expected.intermediates)
    for entry in doc["outputs"] + doc["intermediates"]:
        dtype, shape = entry_dtype_shape(entry)
        got = np.fromfile(scratch / "out" / dump_file(entry), dtype=dtype).reshape(shape)
        want = expected.outputs.get(entry["name"], expected.intermediates.get(entry["name"]))
        assert got.dtype == want.dtype and np.array_equal(got, want), entry["name"]


def test_json_model_info_and_perf(rgb_model, scratch):
    from bpuemu.common.exec_json import read_document

    info = read_document(run_cli(["model_info", "--model_file", rgb_model.path, "--json"], scratch).stdout, "model_info")
    m = rgb_model.model
    assert info["models"] == [{"name": m.name, "inputs": [p.name for p in m.inputs], "outputs": [p.name for p in m.outputs]}]
    result = run_cli(["perf", "--model_file", rgb_model.path, "--frame_count", "10", "--profile_path", "prof", "--json"], scratch)
    assert_ok(result)
    doc = read_document(result.stdout, "perf")
    assert doc["result"]["frame_count"] == 10 and doc["result"]["fps"] > 0
    assert doc["profiler_files"] == ["profiler.log", "profiler.csv"]
    assert all((scratch / "prof" / f).stat().st_size > 0 for f in doc["profiler_files"])


def test_json_takes_one_board(rgb_model, scratch):
    result = run_cli(["perf", "--model_file", rgb_model.path, "--board", "127.0.0.1:1,127.0.0.1:2", "--json"], scratch)
    assert result.returncode == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "--json takes one board" in errors[0], result.stderr
