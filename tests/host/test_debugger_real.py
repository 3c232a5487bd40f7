"""``hmct-debugger runall`` on the PP-OCR cls and det conversions.

The issue's "done when": runall on real conversions writes the tables, the
plots and the index page. cls (about a minute) runs in CI; det takes a few
minutes on a 2-core machine, so it is opt-in (BPUEMU_SLOW_TESTS=1);
bench/debugger.py measures what its advice is worth on the detector.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from bpuemu.host.mapper.makertbin import makertbin_from_config

from makertbin_helpers import text_image, write_cal_dir, write_config
from real_models import MODELS

SLOW = pytest.mark.skipif(os.environ.get("BPUEMU_SLOW_TESTS") != "1",
                          reason="slow: set BPUEMU_SLOW_TESTS=1 (runall on PP-OCR det)")


@pytest.mark.parametrize("name", [pytest.param(n, marks=SLOW) if n == "det" else n for n in sorted(MODELS)])
def test_runall_on_pp_ocr(tmp_path, rapidocr_models, name):  # noqa: F811
    _, h, w = MODELS[name]
    rng = np.random.default_rng(7)
    cal = write_cal_dir(str(tmp_path / "cal"), [text_image(h, w, rng)[..., ::-1].transpose(2, 0, 1)[None] for _ in range(4)])
    cfg = write_config(
        str(tmp_path / f"{name}.yaml"), rapidocr_models[name], name, str(tmp_path / "out"),
        {"x": {"input_type_train": "bgr", "input_layout_train": "NCHW", "input_type_rt": "bgr", "input_layout_rt": "NHWC",
               "norm_type": "data_mean_and_scale", "mean_value": "127.5 127.5 127.5", "scale_value": "0.007843137",
               "input_shape": f"1x3x{h}x{w}", "cal_data_dir": cal, "cal_data_type": "uint8"}},
        model_extra={"debug_mode": "dump_calibration_data"})
    art = makertbin_from_config(cfg)
    out = tmp_path / "debug_result"
    exe = os.path.join(os.path.dirname(sys.executable), "hmct-debugger")
    run = subprocess.run([exe, "runall", art.calibrated, str(tmp_path / "out" / "calibration_data"), "-s", str(out),
                          "-dn", "2"], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    files = os.listdir(out)
    assert {"index.html", "summary.txt", "node_sensitivity.txt", "weight_sensitivity.txt",
            "activation_sensitivity.txt", "acc_error_weight_activation.png"} <= set(files)
    pngs = [f for f in files if f.endswith(".png")]
    html = (out / "index.html").read_text()
    assert len(pngs) >= 10 and all(f"src='{p}'" in html for p in pngs)
    print(f"{name}: {len(pngs)} figures; " + run.stdout.strip().splitlines()[-1])
