"""A J6 board: hrt_boardd --march nash-e runs `.hbm` models, refuses another march's, and aligns nv12 rows.

Real daemons on loopback, the real hrt_model_exec, a tiny model compiled by hb_compile (tests/helpers/j6.py).
"""
import numpy as np
import pytest
from boardd_harness import assert_ok, assert_one_error, run_cli

from bpuemu.board.runtime import Runtime, WrongMarch
from bpuemu.common.container import read_bin
from bpuemu.common.input_types import nv12_rows_at_stride, rt_byte_size
from helpers.j6 import compile_tiny


@pytest.fixture(scope="module")
def hbm(tmp_path_factory):
    """The tiny model compiled for nash-e with an nv12 input 12 pixels wide (rows pad to 32 bytes)."""
    return compile_tiny(tmp_path_factory.mktemp("j6_nv12"), "nash-e", "nv12").bin


@pytest.fixture(scope="module")
def nash_board(tmp_path_factory):
    from boardd_harness import Daemon

    daemon = Daemon(tmp_path_factory.mktemp("hrt_boardd_nash"), "--march", "nash-e").start()
    yield daemon
    assert daemon.stop() == 0, daemon.log()


def _dense_frame(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, 8 * 12 * 3 // 2, dtype=np.uint8)


def test_a_nash_board_runs_the_hbm_as_the_simulator_does(hbm, nash_board, tmp_path):
    spec = read_bin(hbm).model().input_specs[0]
    x = nv12_rows_at_stride(_dense_frame(), 8, 12, 32)
    assert x.size == rt_byte_size(spec) == 384
    np.save(tmp_path / "x.npy", x)
    res = run_cli(["infer", "--model_file", hbm, "--board", nash_board.target, "--input_file", tmp_path / "x.npy",
                   "--enable_dump", "True", "--dump_path", tmp_path], tmp_path)
    assert_ok(res)
    dumped, = tmp_path.glob("*output*c2*.bin")
    board = np.fromfile(dumped, dtype=np.float32)
    rt = Runtime(march="nash-e")
    rt.load([hbm])
    assert np.array_equal(board, rt.model().run([x])[0].reshape(-1))


def test_a_model_of_another_march_is_refused_at_load_with_one_line(hbm, nash_board, board, sample_models, tmp_path):
    """The X5 board (the default march) refuses the nash-e .hbm; the nash-e board refuses the X5 .bin."""
    line = assert_one_error(run_cli(["model_info", "--model_file", hbm, "--board", board.target], tmp_path),
                            "nash-e", "bayes-e")
    assert "compiled for march nash-e; this board is bayes-e" in line
    line = assert_one_error(run_cli(["infer", "--model_file", sample_models["rgb"].path, "--board", nash_board.target],
                                    tmp_path), "nash-e", "bayes-e")
    assert "compiled for march bayes-e; this board is nash-e" in line
    # in-process: the board's march is --march (default bayes-e)
    assert_one_error(run_cli(["infer", "--model_file", hbm], tmp_path), "compiled for march nash-e; this board is bayes-e")
    assert_ok(run_cli(["infer", "--model_file", hbm, "--march", "nash-e"], tmp_path))
    with pytest.raises(WrongMarch):
        Runtime(march="nash-h").load([hbm])


def test_tensor_properties_show_the_march_nv12_stride_and_the_x5_ones_stay(hbm, nash_board, board, sample_models,
                                                                         tmp_path):
    res = run_cli(["model_info", "--model_file", hbm, "--board", nash_board.target], tmp_path)
    assert_ok(res)
    assert "valid shape: (1,3,8,12,)" in res.stdout
    assert "aligned shape: (1,3,8,32,)" in res.stdout and "stride: (384,0,32,1,)" in res.stdout
    assert "aligned byte size: 384" in res.stdout
    x5 = sample_models["nv12"].model.inputs[0]   # the X5's nv12: dense rows, as before marches had strides
    assert list(x5.aligned_shape) == list(x5.valid_shape) and list(x5.stride) == [0, 0, 0, 0]
    assert x5.aligned_byte_size == 32 * 32 * 3 // 2
    assert not sample_models["nv12"].model.input_specs[0].row_stride


def test_an_nv12_frame_with_unaligned_rows_gets_one_error_and_the_padding_is_ignored(hbm, nash_board, tmp_path):
    dense = _dense_frame()
    dense.tofile(tmp_path / "dense.bin")
    line = assert_one_error(run_cli(["infer", "--model_file", hbm, "--board", nash_board.target,
                                     "--input_file", tmp_path / "dense.bin"], tmp_path), "12 bytes apart", "32")
    assert "give 384 bytes" in line
    client = nash_board.client()
    with client:
        sha = client.ensure_model(hbm)
        client.load(sha)
        zeros = client.infer(sha, "tiny", [nv12_rows_at_stride(dense, 8, 12, 32)]).outputs
        noisy = nv12_rows_at_stride(dense, 8, 12, 32).reshape(12, 32).copy()
        noisy[:, 12:] = 255   # what lies in the padding is not the picture
        assert np.array_equal(client.infer(sha, "tiny", [noisy.reshape(-1)]).outputs["c2"], zeros["c2"])


def test_perf_on_a_nash_board_scales_the_x5_model_per_the_march_and_says_it_is_modeled_and_assumed(hbm, nash_board,
                                                                                                  tmp_path):
    import json

    from bpuemu.common import x5_timing
    from bpuemu.common.march import march

    res = run_cli(["perf", "--model_file", hbm, "--board", nash_board.target, "--frame_count", "5"], tmp_path)
    assert_ok(res)
    header = next(line for line in res.stdout.splitlines() if line.startswith("nash-e model"))
    assert "modeled" in header and "assumed" in header and "no board measurements" in header
    assert "X5 model (" not in res.stdout
    host = next(line for line in res.stdout.splitlines() if line.startswith("Host figures"))
    assert "not the modeled nash-e's (J6E; the X5 model scaled, assumed)" in host and "X5's" not in host, host
    res = run_cli(["perf", "--model_file", hbm, "--march", "nash-e", "--timing", "x5", "--frame_count", "2"], tmp_path)
    assert_ok(res)
    host = next(line for line in res.stdout.splitlines() if line.startswith("Host figures"))
    assert "paced to the modeled nash-e (J6E; the X5 model scaled, assumed) by --timing x5" in host, host
    res = run_cli(["perf", "--model_file", hbm, "--board", nash_board.target, "--frame_count", "5", "--json"], tmp_path)
    assert_ok(res)
    modeled = json.loads(res.stdout)["x5"]
    x5 = x5_timing.plan_steps(read_bin(hbm).model())   # the X5 model's times the .hbm carries
    t = march("nash-e").timing
    assert modeled["bpu_ms"] == pytest.approx(x5.bpu_us / 1e3 / (t.bpu_int8_tops / 10.0))
    assert modeled["cpu_ms"] == pytest.approx(x5.cpu_us / 1e3 / t.cpu_speed_vs_x5)
    assert modeled["modeled"].startswith("nash-e model") and "assumed" in modeled["modeled"]


def test_a_farm_of_nash_boards_runs_the_hbm_and_a_bayes_board_in_it_is_named(hbm, nash_board, board, start_daemon,
                                                                            tmp_path):
    second = start_daemon("--march", "nash-e")
    res = run_cli(["infer", "--model_file", hbm, "--board", f"{nash_board.target},{second.target}"], tmp_path)
    assert_ok(res)
    assert "outputs identical on all 2 boards" in res.stdout
    res = run_cli(["infer", "--model_file", hbm, "--board", f"{nash_board.target},{board.target}"], tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.output
    assert "this board is bayes-e" in res.output and board.target in res.output, res.output


@pytest.mark.parametrize("row_stride", [4, 12 + 64, 1 << 40])
def test_a_model_file_with_an_unusable_nv12_row_stride_is_refused_at_load(hbm, row_stride):
    from bpuemu.common.container import encode_bin
    from bpuemu.common.errors import InvalidModelFile

    binfile = read_bin(hbm)
    model = binfile.model()
    model.input_specs[0].row_stride = row_stride
    with pytest.raises(InvalidModelFile, match="unusable row_stride"):
        Runtime(march="nash-e").load([read_bin_bytes(encode_bin([model], binfile.blobs, kind="hbm"))])


def read_bin_bytes(data: bytes):
    from bpuemu.common.container import decode_bin

    return decode_bin(data)


@pytest.mark.parametrize("march, stride", [("nash-b", 32), ("nash-h", 64)])
def test_the_nv12_stride_is_the_march_alignment(march, stride, tmp_path):
    model = read_bin(compile_tiny(tmp_path, march, "nv12").bin).model()
    props = model.inputs[0]
    assert list(props.aligned_shape) == [1, 3, 8, stride] and props.stride[2] == stride
    assert props.aligned_byte_size == rt_byte_size(model.input_specs[0]) == 8 * stride * 3 // 2


def test_an_unknown_march_and_march_with_a_remote_board_are_refused_in_one_line(hbm, tmp_path):
    line = assert_one_error(run_cli(["--march", "nash-q", "--listen", "127.0.0.1:0", "--model-dir", tmp_path / "m"],
                                    tmp_path, module="bpuemu.board.daemon"), "unknown march 'nash-q'")
    assert "listening" not in line
    res = run_cli(["infer", "--model_file", hbm, "--march", "nash-e", "--board", "127.0.0.1:1"], tmp_path)
    assert res.returncode == 2 and "start it with hrt_boardd --march" in res.stderr and "Traceback" not in res.output


def test_the_boards_environment_names_its_march(hbm, tmp_path):
    """BPUEMU_BOARD_MARCH: how a board says its march without a flag (hrt_boardd, and the in-process
    hrt_model_exec a board runs for a client over SSH); --march wins; without either the board is the X5."""
    from boardd_harness import Daemon, clean_env

    nash = clean_env(BPUEMU_BOARD_MARCH="nash-e")
    daemon = Daemon(tmp_path / "d", env=nash).start()
    try:
        assert_ok(run_cli(["model_info", "--model_file", hbm, "--board", daemon.target], tmp_path))
    finally:
        assert daemon.stop() == 0, daemon.log()
    assert_ok(run_cli(["model_info", "--model_file", hbm], tmp_path, env=nash))
    res = run_cli(["model_info", "--model_file", hbm, "--march", "bayes-e"], tmp_path, env=nash)
    assert res.returncode != 0 and "this board is bayes-e" in res.output, res.output
    res = run_cli(["model_info", "--model_file", hbm], tmp_path)
    assert res.returncode != 0 and "BPUEMU_BOARD_MARCH=nash-e" in res.output, res.output
