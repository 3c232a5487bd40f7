"""The X5 flow's artifacts of two fixed conversions, hashed: the J6 flow must not change them.

Two conversions with fixed configs and calibration data: the sample CNN (``bpuemu.host.samples``,
the demo's model, 64x64 rgb) and PP-OCR cls (``bpuemu.host.samples.ocr.models.fetch``). Each of the
five artifacts is hashed with SHA-256; the `.bin`'s manifest holds the absolute paths of the run
(onnx_model, working dir, cal_data_dir), which are replaced by ``<DIR>`` before hashing.

The pinned hashes live in ``tests/data/x5_artifact_hashes.json``. A deliberate change of the X5
artifacts (a calibration fix, say) regenerates them with:

    .venv/bin/python tests/host/x5_artifact_hashes.py --write
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
from typing import Dict

import numpy as np

HASH_FILE = os.path.join(os.path.dirname(__file__), "..", "data", "x5_artifact_hashes.json")
ARTIFACTS = ("original", "optimized", "calibrated", "quantized", "bin")
CAL_SAMPLES = 4


def _bin_hash(path: str, directory: str) -> str:
    """SHA-256 of a `.bin` with the run's directory in its manifest replaced by <DIR>."""
    from bpuemu.common.container import encode_bin, read_bin

    binfile = read_bin(path)
    for model in binfile.manifest.models:
        info = model.build_info
        pairs = list(info.model_parameters) + list(info.calibration_parameters) + list(info.compiler_parameters)
        pairs += [kv for ip in info.input_parameters for kv in ip.params]
        for kv in pairs:
            kv.value = kv.value.replace(directory, "<DIR>")
    data = encode_bin(binfile.manifest.models, binfile.blobs, packed=binfile.manifest.packed)
    return hashlib.sha256(data).hexdigest()


def _hashes(artifacts, directory: str) -> Dict[str, str]:
    out = {}
    for key in ARTIFACTS:
        path = getattr(artifacts, key)
        if key == "bin":
            out[os.path.basename(path)] = _bin_hash(path, directory)
        else:
            with open(path, "rb") as f:
                out[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def convert_sample(directory: str) -> Dict[str, str]:
    """The sample CNN at 64x64 (rgb at runtime), 4 calibration samples, default calibration."""
    from bpuemu.host.mapper.makertbin import makertbin_from_config
    from bpuemu.host.samples import write_sample_project

    cfg = write_sample_project(directory, size=64, input_type_rt="rgb", samples=CAL_SAMPLES, seed=0, prefix="sample")
    return _hashes(makertbin_from_config(cfg), directory)


def convert_cls(directory: str) -> Dict[str, str]:
    """PP-OCR cls with the OCR sample's yaml (ppocr_cls_config.yaml) and 4 text-line crops as calibration data."""
    from bpuemu.host.mapper.makertbin import makertbin_from_config
    from bpuemu.host.samples import text_image
    from bpuemu.host.samples.ocr.models import fetch

    os.makedirs(os.path.join(directory, "model"), exist_ok=True)
    shutil.copy(fetch()["cls"], os.path.join(directory, "model"))
    cal = os.path.join(directory, "calibration_data_bgr_cls")
    os.makedirs(cal, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(CAL_SAMPLES):
        bgr = text_image(48, 192, rng)[:, :, ::-1]
        np.ascontiguousarray(bgr.transpose(2, 0, 1)[None]).tofile(os.path.join(cal, f"{i:04d}.bgr"))
    import bpuemu.host.samples.ocr as ocr_pkg

    cfg = os.path.join(directory, "ppocr_cls_config.yaml")
    shutil.copy(os.path.join(os.path.dirname(ocr_pkg.__file__), "mapper", "ppocr_cls_config.yaml"), cfg)
    return _hashes(makertbin_from_config(cfg), directory)


CONVERSIONS = {"sample_cnn": convert_sample, "ppocr_cls": convert_cls}


def measure(base: str) -> Dict[str, Dict[str, str]]:
    out = {}
    for name, conv in CONVERSIONS.items():
        d = os.path.join(base, name)
        out[name] = conv(d)
    return out


def pinned() -> Dict[str, Dict[str, str]]:
    with open(HASH_FILE) as f:
        return json.load(f)["hashes"]


def main(argv) -> int:
    os.environ.setdefault("BPUEMU_CALIBRATION_CACHE", tempfile.mkdtemp(prefix="bpuemu-calibration-cache-"))
    with tempfile.TemporaryDirectory() as base:
        got = measure(base)
    if "--write" in argv:
        doc = {"regenerate": "python tests/host/x5_artifact_hashes.py --write", "hashes": got}
        with open(HASH_FILE, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.write("\n")
        print(f"wrote {os.path.normpath(HASH_FILE)}")
    else:
        print(json.dumps(got, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
