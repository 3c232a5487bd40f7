"""hb_eval_preprocess: one input_type_rt binary per image, the same bytes calibration uses, and the board agrees.

Images are synthetic text pages (bpuemu.host.samples.text_image: dark text on
a light page, real edges and flat areas) at sizes other than the model's, so
the resize matters; they are written as PNG and JPEG files.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from bpuemu.common.container import read_bin
from bpuemu.common.input_types import to_model_input
from bpuemu.host.convert.caldata import CalInput, read_sample, train_to_rt
from bpuemu.host.samples import text_image, write_sample_project
from bpuemu.host.tools.eval_preprocess import load_table, preprocess

SIZE = 32


def _tool(name, *args, cwd):
    exe = os.path.join(os.path.dirname(sys.executable), name)
    return subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)


def _images(directory, n=4, seed=3):
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = []
    for i in range(n):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        name = f"img{i}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(text_image(h, w, rng)).save(os.path.join(directory, name))
        names.append(name)
    return names


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A sample model converted by makertbin from images with preprocess_on, calibration feeds dumped."""
    d = tmp_path_factory.mktemp("evalpre")
    config = write_sample_project(str(d), size=SIZE, input_type_rt="nv12", samples=4)
    doc = yaml.safe_load(open(config))
    doc["calibration_parameters"].update(cal_data_dir="images", preprocess_on=True, calibration_type="max")
    doc["calibration_parameters"].pop("cal_data_type")
    doc["model_parameters"]["debug_mode"] = "dump_calibration_data"
    with open(config, "w") as f:
        yaml.safe_dump(doc, f)
    names = _images(str(d / "images"))
    proc = _tool("hb_mapper", "makertbin", "--config", config, "--model-type", "onnx", cwd=d)
    assert proc.returncode == 0, proc.stderr
    prefix = doc["model_parameters"]["output_model_file_prefix"]
    (d / "table.yaml").write_text(yaml.safe_dump({"sample_nv12": {"size": f"{SIZE}x{SIZE}", "resize": "stretch",
                                                                  "input_type_rt": "nv12"}}))
    return d, config, names, d / "model_output" / f"{prefix}.bin", d / "model_output" / f"{prefix}_quantized_model.onnx"


def test_bytes_equal_what_makertbin_calibration_feeds(project, tmp_path):
    """One implementation: the .bin files, turned into model input by the board's Preprocess, equal the
    calibration feeds makertbin dumped, bit for bit; and the bytes equal caldata's own input_type_rt data."""
    d, config, names, bin_path, _ = project
    proc = _tool("hb_eval_preprocess", "-m", "sample_nv12", "-i", d / "images", "-o", tmp_path / "out",
                 "--model_table", d / "table.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    spec = read_bin(str(bin_path)).model().input_specs[0]
    for i, name in enumerate(sorted(names)):
        data = np.fromfile(tmp_path / "out" / (os.path.splitext(name)[0] + ".bin"), np.uint8)
        assert data.size == SIZE * SIZE * 3 // 2  # nv12
        fed = np.load(d / "model_output" / "calibration_data" / "data" / f"{i}.npy")
        assert np.array_equal(to_model_input(data, spec).astype(np.float32), fed), name
        ci = CalInput("data", str(d / "images"), (1, 3, SIZE, SIZE), preprocess_on=True, input_type_train="rgb")
        rt = train_to_rt(read_sample(str(d / "images" / name), ci), "rgb", "NCHW", spec)
        assert data.tobytes() == rt.tobytes()


def test_board_infer_on_its_output_equals_hb_mapper_infer(project, tmp_path):
    """The done-check: hb_eval_preprocess -> hrt_model_exec infer --board == hb_mapper infer on the image."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "board"))
    from boardd_harness import Daemon

    d, config, names, bin_path, quantized = project
    image = d / "images" / names[0]
    proc = _tool("hb_eval_preprocess", "-m", "sample_nv12", "-i", d / "images", "-o", tmp_path / "pre",
                 "--model_table", d / "table.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    proc = _tool("hb_mapper", "infer", "--config", config, "--model-file", quantized, "--model-type", "onnx",
                 "--image-file", "data", image, "--output-dir", tmp_path / "host", cwd=d)
    assert proc.returncode == 0, proc.stderr
    host_out = [np.fromfile(tmp_path / "host" / f, np.float32) for f in sorted(os.listdir(tmp_path / "host"))]
    daemon = Daemon(tmp_path / "board").start()
    try:
        proc = _tool("hrt_model_exec", "infer", "--model_file", bin_path, "--board", daemon.target,
                     "--input_file", tmp_path / "pre" / (os.path.splitext(names[0])[0] + ".bin"),
                     "--enable_dump", "true", "--dump_path", tmp_path / "dump", cwd=tmp_path)
    finally:
        daemon.stop()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    board_out = [np.fromfile(tmp_path / "dump" / f, np.float32) for f in sorted(os.listdir(tmp_path / "dump"))]
    assert len(board_out) == len(host_out) >= 1
    for b, h in zip(board_out, host_out):
        assert b.shape == h.shape and np.array_equal(b, h), np.abs(b - h).max()


def test_every_builtin_entry_writes_its_input_layout(tmp_path):
    src = tmp_path / "images"
    _images(str(src), n=1)
    table = load_table()
    assert {"resnet50", "mobilenetv2", "yolov5s", "ssd_mobilenetv1", "mtcnn_onet", "ppocr_rec"} <= set(table)
    for name, model in table.items():
        t = model.transforms
        data = preprocess(str(src / "img0.jpg"), model)
        per_pixel = {"nv12": 1.5, "gray": 1}.get(model.input_type_rt, 3)
        assert len(data) == int(t.height * t.width * per_pixel), name


def test_geometry_letterbox_crop_and_layout(tmp_path):
    """A wide red image: letterbox pads top and bottom, short_side+crop fills, NCHW puts planes first."""
    Image.new("RGB", (200, 100), (255, 0, 0)).save(tmp_path / "wide.png")
    table = load_table(str(_table(tmp_path, {
        "box": {"size": "64x64", "resize": "fit", "pad": "center", "pad_value": 114, "input_type_rt": "rgb"},
        "crop": {"size": "64x64", "resize": "short_side", "resize_to": 80, "crop": "center", "input_type_rt": "bgr",
                 "input_layout_rt": "NCHW"},
    })))
    box = np.frombuffer(preprocess(str(tmp_path / "wide.png"), table["box"]), np.uint8).reshape(64, 64, 3)
    assert (box[:16] == 114).all() and (box[48:] == 114).all() and (box[16:48] == [255, 0, 0]).all()
    crop = np.frombuffer(preprocess(str(tmp_path / "wide.png"), table["crop"]), np.uint8).reshape(3, 64, 64)
    assert (crop[2] == 255).all() and (crop[:2] == 0).all()  # BGR planes: red is the last one


def _table(tmp_path, entries):
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(entries))
    return path


def test_val_txt_orders_and_bad_inputs_are_one_line_each(tmp_path):
    src = tmp_path / "images"
    _images(str(src), n=3)
    (src / "broken.jpg").write_bytes(b"not a jpeg")
    (tmp_path / "val.txt").write_text("img2.jpg 7\nmissing.jpg 3\nbroken.jpg 1\nimg1.png 0\n")
    proc = _tool("hb_eval_preprocess", "-m", "resnet50", "-i", src, "-o", tmp_path / "out", "-v", tmp_path / "val.txt",
                 cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 2, proc.stderr
    assert "missing.jpg: listed in val.txt but not found" in errors[0]
    assert "broken.jpg: not a readable image" in errors[1]
    assert sorted(os.listdir(tmp_path / "out")) == ["img1.bin", "img2.bin"]  # img0 is not listed
    proc = _tool("hb_eval_preprocess", "-m", "resnet5", "-i", src, "-o", tmp_path / "o2", cwd=tmp_path)
    assert proc.returncode != 0 and proc.stderr.startswith("ERROR unknown model name 'resnet5'")
    assert "resnet50" in proc.stderr and "Traceback" not in proc.stderr
    bad = _table(tmp_path, {"x": {"size": "31x31", "input_type_rt": "nv12"}})
    proc = _tool("hb_eval_preprocess", "-m", "x", "-i", src, "-o", tmp_path / "o3", "--model_table", bad, cwd=tmp_path)
    assert proc.returncode != 0 and "nv12 needs an even height and width" in proc.stderr
    for entry, words in (({"size": "8x8", "resize": "zoom"}, "resize 'zoom' is not one of stretch, short_side, fit"),
                         ({"size": "8x8", "resize_to": "256"}, "resize_to '256' is not a whole number"),
                         ({"size": "8x8", "colour": "rgb"}, "unknown key(s) colour"),
                         ({"resize": "fit"}, "size (HxW) is missing"),
                         ({"size": "8x8", "resize": "short_side", "resize_to": 10}, "without crop gives")):
        bad = _table(tmp_path, {"x": entry})
        proc = _tool("hb_eval_preprocess", "-m", "x", "-i", src, "-o", tmp_path / "o4", "--model_table", bad,
                     cwd=tmp_path)
        assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, (entry, proc.stderr)


def test_help_lists_models_and_version():
    proc = _tool("hb_eval_preprocess", "--help", cwd=".")
    assert proc.returncode == 0 and "resnet50" in proc.stdout and "yolov5s" in proc.stdout and "--val_txt" in proc.stdout
    proc = _tool("hb_eval_preprocess", "--version", cwd=".")
    assert proc.returncode == 0 and "hb_eval_preprocess" in proc.stdout
