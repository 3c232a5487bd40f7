"""What a user sees, through the console scripts, when a command meets a mistake or an odd model.

Each case is one a user made while following README.md and the seed guide:
a missing input file, a wrong --input-shape, an image folder with no images,
hb_verifier against a --fast-perf .bin, and a model whose output is ArgMax
indices (makertbin and hb_verifier report the agreement rate there, not a
cosine of indices). A mistake must end in one clear ERROR line and a non-zero
exit, never a traceback.
"""
import os
import re
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

from helpers.console import assert_one_clear_error, run
from makertbin_helpers import sample_project, write_cal_dir, write_config
from quant_models import POW_ARGMAX_SIZE as ARGMAX_SIZE
from quant_models import pow_argmax_model

SIZE = 32




@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The sample project converted with makertbin (yaml) and with --fast-perf."""
    work = tmp_path_factory.mktemp("project")
    config, float_onnx = sample_project(work, size=SIZE, samples=4)
    code, text = run("hb_mapper", "makertbin", "--config", config, "--model-type", "onnx", cwd=work)
    assert code == 0, text
    code, text = run("hb_mapper", "makertbin", "--fast-perf", "--model", float_onnx, "--model-type", "onnx",
                     "--march", "bayes-e", "-i", "data", f"1x3x{SIZE}x{SIZE}", cwd=work)
    assert code == 0, text
    out = work / "model_output"
    return {"dir": work, "config": config, "float": float_onnx, "quanti": out / "sample_quantized_model.onnx",
            "bin": out / "sample.bin", "fast_quanti": out / "float_quantized_model.onnx", "fast_bin": out / "float.bin"}


def test_hb_mapper_infer_names_a_missing_image_file(project):
    code, text = run("hb_mapper", "infer", "--config", project["config"], "--model-file", project["quanti"],
                     "--model-type", "onnx", "--image-file", "data", "nofile.rgb", "--output-dir", "out",
                     cwd=project["dir"])
    assert_one_clear_error(code, text, "nofile.rgb", "not found")


def test_checker_says_when_input_shape_has_the_wrong_rank(project):
    code, text = run("hb_mapper", "checker", "--model-type", "onnx", "--march", "bayes-e", "--model", project["float"],
                     "--input-shape", "data", f"1x3x{SIZE}", cwd=project["dir"])
    assert_one_clear_error(code, text, f"1x3x{SIZE} has 3 dimensions", f"1x3x{SIZE}x{SIZE}")


def test_hb_eval_preprocess_refuses_a_folder_without_images(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "0000.rgb").write_bytes(bytes(12))
    code, text = run("hb_eval_preprocess", "-m", "resnet50", "-i", "raw", "-o", "out", cwd=tmp_path)
    assert_one_clear_error(code, text, "raw holds no images")


def test_hb_verifier_refuses_quanti_onnx_against_a_fast_perf_bin_and_says_why(project):
    code, text = run("hb_verifier", "-m", f"{project['fast_quanti']},{project['fast_bin']}", "-s", "True",
                     cwd=project["dir"])
    assert_one_clear_error(code, text, "--fast-perf", "no longer quanti.onnx's")
    assert "Hint: " in text and "-s True -b BOARD" in text


def test_hb_verifier_still_refuses_a_modifier_removed_softmax(project, tmp_path):
    # the seed's rule for hb_model_modifier: only removed Dequantize nodes keep quanti.onnx comparable
    import shutil

    shutil.copy(project["bin"], tmp_path / "m.bin")
    code, text = run("hb_model_modifier", "m.bin", "-r", "Softmax_prob", cwd=tmp_path)
    assert code == 0, text
    code, text = run("hb_verifier", "-m", f"{project['quanti']},m_modified.bin", "-s", "True", cwd=tmp_path)
    assert_one_clear_error(code, text, "does not support comparing bin models", "Softmax_prob")
    assert "--fast-perf" not in text


@pytest.fixture(scope="module")
def argmax_project(tmp_path_factory):
    """A model whose output is ArgMax indices over 8 channels, converted with makertbin."""
    work = tmp_path_factory.mktemp("argmax")
    onnx.save(pow_argmax_model(), str(work / "float.onnx"))
    rng = np.random.default_rng(1)
    cal = write_cal_dir(str(work / "cal"), [rng.integers(0, 256, (1, 3, ARGMAX_SIZE, ARGMAX_SIZE), dtype=np.uint8)
                                           for _ in range(4)])
    inp = {"input_type_train": "rgb", "input_layout_train": "NCHW", "input_type_rt": "rgb", "input_layout_rt": "NHWC",
           "norm_type": "data_mean_and_scale", "mean_value": "128 128 128", "scale_value": "0.0078125",
           "input_shape": f"1x3x{ARGMAX_SIZE}x{ARGMAX_SIZE}", "cal_data_dir": cal, "cal_data_type": "uint8"}
    config = write_config(str(work / "config.yaml"), str(work / "float.onnx"), "pa", str(work / "out"), {"data": inp},
                          calibration={"calibration_type": "max"},
                          model_extra={"debug_mode": "dump_calibration_data"})
    code, text = run("hb_mapper", "makertbin", "--config", config, "--model-type", "onnx", cwd=work)
    assert code == 0, text
    return {"dir": work, "log": text, "quanti": work / "out" / "pa_quantized_model.onnx", "bin": work / "out" / "pa.bin"}


def test_makertbin_reports_an_agreement_rate_for_argmax_indices(argmax_project):
    lines = [line for line in argmax_project["log"].splitlines() if "output idx" in line]
    assert len(lines) == 1, argmax_project["log"]
    assert "agreement rate" in lines[0] and "cosine" not in lines[0], lines[0]
    rate = float(lines[0].split("agreement rate ")[1].split()[0])
    assert 0.0 <= rate <= 1.0
    assert "cosine similarity" not in "\n".join(line for line in argmax_project["log"].splitlines() if "idx" in line)


def test_hb_verifier_reports_an_agreement_rate_for_argmax_indices(argmax_project):
    code, text = run("hb_verifier", "-m", f"{argmax_project['quanti']},{argmax_project['bin']}", "-s", "True",
                     cwd=argmax_project["dir"])
    assert code == 0, text
    block = text.split("Comparison results of original output is idx")[1]
    assert "agreement rate: 1.000000" in block and "cosine similarity" not in block.split("Strict check")[0], block


@pytest.mark.parametrize("listen,words", [
    ("127.0.0.1:99999", ("port 99999 is out of range",)),   # was: served on a random free port
    ("nonsense:9473", ("cannot resolve host 'nonsense'",)),   # was: "refusing to listen beyond loopback"
])
def test_hrt_boardd_refuses_a_bad_listen_address(tmp_path, listen, words):
    code, text = run("hrt_boardd", "--listen", listen, "--model-dir", "models", cwd=tmp_path, timeout=60)
    assert_one_clear_error(code, text, *words)


def test_hrt_model_exec_refuses_a_board_port_out_of_range(project):
    code, text = run("hrt_model_exec", "model_info", "--model_file", project["bin"], "--board", "127.0.0.1:70000",
                     cwd=project["dir"])
    assert_one_clear_error(code, text, "port 70000 is out of range")


def test_ctrl_c_stops_hrt_model_exec_perf_cleanly(project):
    """Ctrl-C during an in-process perf, at a terminal: "Aborted." and exit 130, not a C++ abort (SIGABRT).

    The command runs on a pseudo-terminal, as a user's does; the signal is sent once its progress bar
    counts frames (the model loaded and running), not after a guessed sleep."""
    import fcntl
    import pty
    import select
    import signal
    import struct
    import termios

    exe = os.path.join(os.path.dirname(sys.executable), "hrt_model_exec")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal's size: tqdm draws in it
    proc = subprocess.Popen([exe, "perf", "--model_file", str(project["bin"]), "--frame_count", "1000000",
                             "--thread_num", "2"], cwd=project["dir"], stdout=slave, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    screen = b""

    def read_screen(until, timeout: float) -> bool:
        nonlocal screen
        deadline = time.monotonic() + timeout
        while not until() and time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:   # the command exited and closed the terminal
                    chunk = b""
                if not chunk:
                    break
                screen += chunk
        return until()

    try:
        counting = re.compile(rb"perf:.*\| *[1-9]\d*/\d+ \[")
        assert read_screen(lambda: counting.search(screen), 120), screen.decode(errors="replace")[-2000:]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        read_screen(lambda: False, 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    text = screen.decode(errors="replace")
    lines = [line.strip() for line in re.split(r"[\r\n]+", text) if line.strip()]
    assert proc.returncode == 130 and lines[-1] == "Aborted.", (proc.returncode, text[-2000:])
    assert "terminate called" not in text and "Traceback" not in text, text[-2000:]


@pytest.mark.parametrize("command", [
    ["hrt_model_exec", "perf", "--model_file", "{bin}", "--frame_count", "2", "--profile_path", "{bad}"],
    ["hrt_model_exec", "infer", "--model_file", "{bin}", "--enable_dump", "true", "--dump_path", "{bad}"],
])
def test_an_output_folder_that_cannot_be_made_is_one_line(project, command):
    bad = "/proc/bpuemu-no-such-dir"   # cannot be created, even by root
    args = [a.format(bin=project["bin"], bad=bad) for a in command]
    code, text = run(*args, cwd=project["dir"])
    assert_one_clear_error(code, text, f"cannot use {bad}")


def test_makertbin_with_a_working_dir_that_cannot_be_made_is_one_line(project, tmp_path):
    text = open(project["config"]).read().replace(str(project["dir"] / "model_output"), "/proc/bpuemu-no-such-dir")
    config = tmp_path / "config.yaml"
    config.write_text(text)
    code, out = run("hb_mapper", "makertbin", "--config", config, "--model-type", "onnx", cwd=tmp_path)
    assert_one_clear_error(code, out, "/proc/bpuemu-no-such-dir")


def test_a_caffemodel_given_as_onnx_is_named_as_not_onnx(tmp_path):
    """It parses as an empty ModelProto; the checker said "opset 0 is not supported ... re-export with opset 11"."""
    from caffe_nets import CaffeNetBuilder

    net = CaffeNetBuilder().input("data", (1, 3, 8, 8))
    net.layer("conv", "Convolution", "data", blobs=[net.randn(4, 3, 3, 3)],
              convolution_param={"num_output": 4, "kernel_size": [3]})
    _, caffemodel = net.write(str(tmp_path))
    code, text = run("hb_mapper", "checker", "--model-type", "onnx", "--march", "bayes-e", "--model", caffemodel,
                     cwd=tmp_path)
    assert_one_clear_error(code, text, "is not an ONNX model")
    assert "--model-type caffe" in text and "opset" not in text.split("is not an ONNX model")[0]


def test_bpuemu_demo_refuses_an_odd_nv12_size_before_any_work(tmp_path):
    code, text = run("bpuemu-demo", "--size", "63", "--workdir", "demo", cwd=tmp_path, timeout=60)
    assert code == 2 and "63 is odd; nv12 needs an even height and width" in text, text
    assert not (tmp_path / "demo").exists()   # refused before writing the project


def test_hmct_debugger_on_an_argmax_model(argmax_project):
    """runall stopped with "node 'argmax' has no float output to plot" (then an onnxruntime error for the
    calibration on the model input); node sensitivity compared ArgMax indices with a cosine."""
    from bpuemu.host.debugger.data import load_data, load_model
    from bpuemu.host.debugger.engine import Evaluator

    out = argmax_project["dir"] / "out"
    code, text = run("hmct-debugger", "runall", out / "pa_calibrated_model.onnx", out / "calibration_data",
                     "-s", "debug_result", cwd=argmax_project["dir"])
    assert code == 0 and "Traceback" not in text and "ERROR" not in text, text
    assert (argmax_project["dir"] / "debug_result" / "index.html").exists()
    cm = load_model(str(out / "pa_calibrated_model.onnx"))
    ev = Evaluator(cm, load_data(str(out / "calibration_data"), cm)[:2])
    assert ev.tensors and all(cm.is_float(t) for t in ev.tensors), ev.tensors
