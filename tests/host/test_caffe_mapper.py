"""hb_mapper with small Caffe nets: --fast-perf, the output_nodes recipe for SSD's post-processing, yaml messages.

SSD's PriorBox converts (its boxes are a constant for a fixed input size);
DetectionOutput (decoding + NMS) is the application's and is refused by name.
"""
import os
import subprocess
import sys

import onnx
import yaml

from caffe_nets import CaffeNetBuilder


def _hb_mapper(cwd, *args):
    exe = os.path.join(os.path.dirname(sys.executable), "hb_mapper")
    proc = subprocess.run([exe, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def _ssd_like(directory):
    """conv -> (loc, conf) heads and SSD's post-processing layers, which the BPU does not run."""
    b = CaffeNetBuilder("ssd_like")
    b.input("data", (1, 3, 16, 16))
    b.layer("conv1", "Convolution", "data", blobs=[b.randn(8, 3, 3, 3), b.randn(8)],
            convolution_param={"num_output": 8, "kernel_size": [3], "pad": [1], "stride": [2]})
    b.layer("relu1", "ReLU", "conv1", "conv1")
    b.layer("mbox_loc", "Convolution", "conv1", blobs=[b.randn(8, 8, 3, 3), b.randn(8)],
            convolution_param={"num_output": 8, "kernel_size": [3], "pad": [1]})
    b.layer("mbox_loc_perm", "Permute", "mbox_loc", permute_param={"order": [0, 2, 3, 1]})
    b.layer("mbox_loc_flat", "Flatten", "mbox_loc_perm")
    b.layer("mbox_conf", "Convolution", "conv1", blobs=[b.randn(6, 8, 3, 3), b.randn(6)],
            convolution_param={"num_output": 6, "kernel_size": [3], "pad": [1]})
    b.layer("mbox_conf_flat", "Flatten", "mbox_conf")
    b.layer("mbox_priorbox", "PriorBox", ["conv1", "data"], prior_box_param={"min_size": [4.0], "max_size": [8.0],
                                                                          "variance": [0.1, 0.1, 0.2, 0.2]})
    b.layer("detection_out", "DetectionOutput", ["mbox_loc_flat", "mbox_conf_flat", "mbox_priorbox"])
    return b.write(str(directory), "ssd_like")


def _config(tmp_path, proto, weights, **model_extra):
    doc = {
        "model_parameters": {"prototxt": proto, "caffe_model": weights, "march": "bayes-e",
                             "output_model_file_prefix": "ssd_like", "working_dir": "model_output", **model_extra},
        "input_parameters": {"input_type_train": "bgr", "input_layout_train": "NCHW", "input_type_rt": "nv12",
                             "norm_type": "data_mean", "mean_value": "104 117 123"},
        "calibration_parameters": {"calibration_type": "skip"},
        "compiler_parameters": {"compile_mode": "latency", "optimize_level": "O3"},
    }
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(doc))
    return "model.yaml"


def test_ssd_post_processing_is_refused_by_name_then_cut_with_output_nodes(tmp_path):
    proto, weights = _ssd_like(tmp_path)
    proc = _hb_mapper(tmp_path, "makertbin", "--config", _config(tmp_path, proto, weights), "--model-type", "caffe")
    assert proc.returncode != 0
    assert "ERROR Not support layer name=detection_out type=DetectionOutput" in proc.stderr
    assert "PriorBox" not in proc.stderr
    assert "output_nodes" in proc.stderr  # the hint names the recipe
    # The recipe: keep the heads and the priors; DetectionOutput runs in the application.
    config = _config(tmp_path, proto, weights, output_nodes="mbox_loc_flat;mbox_conf_flat;mbox_priorbox")
    proc = _hb_mapper(tmp_path, "makertbin", "--config", config, "--model-type", "caffe")
    assert proc.returncode == 0, proc.stderr
    original = onnx.load(str(tmp_path / "model_output" / "ssd_like_original_float_model.onnx"))
    assert [o.name for o in original.graph.output] == ["mbox_loc_flat", "mbox_conf_flat"]
    assert "HzPreprocess" in [n.name for n in original.graph.node]
    assert "output mbox_priorbox is a constant" in proc.stderr  # the application computes the priors


def test_fast_perf_and_missing_yaml_keys(tmp_path):
    proto, weights = _ssd_like(tmp_path)
    proc = _hb_mapper(tmp_path, "makertbin", "--fast-perf", "--model", weights, "--model-type", "caffe", "--proto", proto,
                      "--march", "bayes-e")
    # fast-perf converts the whole net: the post-processing layers are named
    assert proc.returncode != 0 and "Not support layer name=detection_out type=DetectionOutput" in proc.stderr
    b = CaffeNetBuilder("small")
    b.input("data", (1, 3, 8, 8))
    b.layer("conv", "Convolution", "data", blobs=[b.randn(4, 3, 3, 3), b.randn(4)],
            convolution_param={"num_output": 4, "kernel_size": [3]})
    small_proto, small_weights = b.write(str(tmp_path), "small")
    proc = _hb_mapper(tmp_path, "makertbin", "--fast-perf", "--model", small_weights, "--model-type", "caffe",
                      "--proto", small_proto, "--march", "bayes-e")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "model_output" / "small.bin").is_file()
    # The seed's message when the yaml has neither caffe key.
    doc = yaml.safe_load((tmp_path / _config(tmp_path, proto, weights)).read_text())
    del doc["model_parameters"]["prototxt"], doc["model_parameters"]["caffe_model"]
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(doc))
    proc = _hb_mapper(tmp_path, "makertbin", "--config", "model.yaml", "--model-type", "caffe")
    assert proc.returncode != 0
    assert "ERROR Key 'model_parameters' error:" in proc.stderr and "Missing keys: 'caffe_model', 'prototxt'" in proc.stderr
    assert "yaml file parse failed. Please double check your input" in proc.stderr
    doc["model_parameters"].update(prototxt=small_proto, caffe_model=small_weights, onnx_model="x.onnx")
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(doc))
    proc = _hb_mapper(tmp_path, "makertbin", "--config", "model.yaml", "--model-type", "caffe")
    assert proc.returncode != 0 and "give either onnx_model or caffe_model + prototxt, not both" in proc.stderr
