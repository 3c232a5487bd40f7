"""The OCR sample's workflow folder (``mapper/``): copied out for a user, with the models beside it.

``copy(dest)`` copies the scripts (01_check.sh .. 05_evaluate.sh), preprocess.py,
inference.py, postprocess.py and the three yaml configs into an empty or new folder;
``copy_models(dest)`` puts the three ONNX models there (fetched once, cached).
"""
import os
import shutil
from typing import List

from bpuemu.common.errors import InvalidInput
from bpuemu.host.samples.ocr import models

MAPPER = os.path.join(os.path.dirname(__file__), "mapper")


def files() -> List[str]:
    """The workflow's file names, in mapper/."""
    return sorted(f for f in os.listdir(MAPPER)
                  if f.endswith((".sh", ".py", ".yaml", ".md")) and f != "__init__.py" and not f.startswith("."))


def copy(dest: str) -> List[str]:
    """Copy the workflow into ``dest`` (new or empty); returns the files written."""
    if os.path.exists(dest) and (not os.path.isdir(dest) or os.listdir(dest)):
        raise InvalidInput(f"{dest} exists and is not an empty folder", hint="give a new or empty folder")
    os.makedirs(dest, exist_ok=True)
    written = []
    for name in files():
        target = os.path.join(dest, name)
        shutil.copyfile(os.path.join(MAPPER, name), target)
        if name.endswith((".sh", ".py")):
            os.chmod(target, 0o755)
        written.append(target)
    return written


def copy_models(dest: str) -> dict:
    """The three models (fetched and cached once) copied into ``dest``; {"det", "cls", "rec"} -> path."""
    os.makedirs(dest, exist_ok=True)
    out = {}
    for name, src in models.fetch().items():
        target = os.path.join(dest, os.path.basename(src))
        if not (os.path.isfile(target) and os.path.getsize(target) == os.path.getsize(src)):
            shutil.copyfile(src, target + ".part")
            os.replace(target + ".part", target)
        out[name] = target
    return out


__all__ = ["MAPPER", "copy", "copy_models", "files"]
