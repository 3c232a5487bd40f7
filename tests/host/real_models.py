"""The RapidOCR wheel's PP-OCR models the real-model tests convert, and their makertbin projects."""
import numpy as np

from makertbin_helpers import text_image, write_cal_dir, write_config

MODELS = {
    # name: (file in the wheel, input H, W)
    "cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", 48, 192),
    "det": ("ch_PP-OCRv4_det_infer.onnx", 160, 160),
}


def project_config(tmp_path, rapidocr_models, name: str) -> str:
    """A makertbin yaml for the sample CNN or a wheel model, 20 calibration pages; returns its path."""
    from bpuemu.host.samples import write_sample_project

    if name == "sample":
        return write_sample_project(str(tmp_path / "sample"), 64, "rgb", samples=20)
    _, h, w = MODELS[name]
    rng = np.random.default_rng(7)
    cal = write_cal_dir(str(tmp_path / "cal"), [text_image(h, w, rng)[..., ::-1].transpose(2, 0, 1)[None] for _ in range(20)])
    return write_config(
        str(tmp_path / f"{name}.yaml"), rapidocr_models[name], name, str(tmp_path / "out"),
        {"x": {"input_type_train": "bgr", "input_layout_train": "NCHW", "input_type_rt": "bgr", "input_layout_rt": "NCHW",
               "norm_type": "data_mean_and_scale", "mean_value": "127.5 127.5 127.5", "scale_value": "0.007843137",
               "input_shape": f"1x3x{h}x{w}", "cal_data_dir": cal, "cal_data_type": "uint8"}})
