"""Read a Caffe 1.0 model: the deploy prototxt (text format) and the caffemodel (binary).

No Caffe install is needed: both files are decoded with the schema subset in
proto/bpuemu/caffe/caffe.proto (generated into ``caffe_pb2``). The prototxt
gives the structure, the caffemodel the weights; they are matched by layer
name, as Caffe's ``Net::CopyTrainedLayersFrom`` does. Caffe's older V1 layer
format (``layers { type: CONVOLUTION }``) is read too and turned into the
current one. Layers excluded from the TEST phase are dropped, like Caffe does
for a deploy net.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np
from google.protobuf import message as pb_message
from google.protobuf import text_format

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.caffe import caffe_pb2

log = logging.getLogger("bpuemu.host.caffe")

#: V1LayerParameter.LayerType -> the current type string.
_V1_TYPES = {
    "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL", "CONCAT": "Concat",
    "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution", "DATA": "Data",
    "DECONVOLUTION": "Deconvolution", "DROPOUT": "Dropout", "DUMMY_DATA": "DummyData",
    "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise", "EXP": "Exp", "FLATTEN": "Flatten",
    "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output", "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col",
    "IMAGE_DATA": "ImageData", "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss", "MVN": "MVN",
    "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence", "SOFTMAX": "Softmax",
    "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice", "TANH": "TanH",
    "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}
#: Parameter fields V1 and the current LayerParameter share by name.
_V1_PARAMS = ("argmax_param", "concat_param", "convolution_param", "dropout_param", "eltwise_param",
              "inner_product_param", "lrn_param", "pooling_param", "power_param", "relu_param",
              "softmax_param", "slice_param")


@dataclass
class CaffeNet:
    """A deploy net: its name, declared inputs (name -> shape) and layers with their weights."""

    name: str
    inputs: Dict[str, Tuple[int, ...]]
    layers: List[caffe_pb2.LayerParameter]
    #: layer name -> its weight blobs as float32 arrays.
    blobs: Dict[str, List[np.ndarray]] = field(default_factory=dict)


def _upgrade_v1(v1: caffe_pb2.V1LayerParameter) -> caffe_pb2.LayerParameter:
    layer = caffe_pb2.LayerParameter(name=v1.name, bottom=v1.bottom, top=v1.top)
    layer.type = _V1_TYPES.get(caffe_pb2.V1LayerParameter.LayerType.Name(v1.type), "NONE")
    layer.blobs.extend(v1.blobs)
    layer.include.extend(v1.include)
    layer.exclude.extend(v1.exclude)
    for name in _V1_PARAMS:
        if v1.HasField(name):
            getattr(layer, name).CopyFrom(getattr(v1, name))
    return layer


def layers_of(net: caffe_pb2.NetParameter) -> List[caffe_pb2.LayerParameter]:
    return list(net.layer) + [_upgrade_v1(v1) for v1 in net.layers]


def in_test_phase(layer: caffe_pb2.LayerParameter) -> bool:
    """Caffe's NetStateRule check for a TEST-phase net (phase is the only rule a deploy net uses)."""
    test = caffe_pb2.TEST
    if layer.include:
        return any(not r.HasField("phase") or r.phase == test for r in layer.include)
    return not any(not r.HasField("phase") or r.phase == test for r in layer.exclude)


def blob_array(blob: caffe_pb2.BlobProto) -> np.ndarray:
    """A weight blob as a float32 array of its declared shape."""
    if blob.HasField("shape"):
        shape = tuple(blob.shape.dim)
    else:
        shape = tuple(d for d in (blob.num, blob.channels, blob.height, blob.width))
    data = np.asarray(blob.data if len(blob.data) else blob.double_data, dtype=np.float32)
    if int(np.prod(shape)) != data.size:
        shape = (data.size,)  # legacy files with 1x1x1xN shapes and the like
    return data.reshape(shape)


def declared_inputs(net: caffe_pb2.NetParameter) -> Dict[str, Tuple[int, ...]]:
    """Inputs declared the legacy way (``input:`` with ``input_shape`` or ``input_dim``)."""
    shapes = {}
    for i, name in enumerate(net.input):
        if i < len(net.input_shape):
            shapes[name] = tuple(net.input_shape[i].dim)
        elif len(net.input_dim) >= 4 * (i + 1):
            shapes[name] = tuple(net.input_dim[4 * i: 4 * i + 4])
        else:
            shapes[name] = ()
    return shapes


def read_prototxt(path: str) -> caffe_pb2.NetParameter:
    if not os.path.isfile(path):
        raise NotFound(f"prototxt not found: {path}")
    net = caffe_pb2.NetParameter()
    try:
        with open(path, encoding="utf-8") as f:
            # Fields outside the subset (fillers, lr_mult, engine...) do not matter for inference.
            text_format.Parse(f.read(), net, allow_unknown_field=True)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not a Caffe prototxt: {str(exc).splitlines()[0]}") from None
    return net


def read_caffemodel(path: str) -> caffe_pb2.NetParameter:
    if not os.path.isfile(path):
        raise NotFound(f"caffemodel not found: {path}")
    net = caffe_pb2.NetParameter()
    try:
        with open(path, "rb") as f:
            net.ParseFromString(f.read())
    except pb_message.DecodeError as exc:
        raise InvalidInput(f"{path} is not a Caffe caffemodel: {exc}") from None
    return net


def load_net(prototxt: str, caffemodel: str) -> CaffeNet:
    """The deploy net of ``prototxt`` with the weights of ``caffemodel``."""
    structure = read_prototxt(prototxt)
    weights = read_caffemodel(caffemodel)
    if not structure.layer and not structure.layers:
        raise InvalidInput(f"{prototxt} defines no layers")
    layers = [layer for layer in layers_of(structure) if in_test_phase(layer)]
    trained = {layer.name: layer for layer in layers_of(weights) if layer.blobs}
    blobs = {}
    for layer in layers:
        source = layer if layer.blobs else trained.get(layer.name)
        if source is not None:
            blobs[layer.name] = [blob_array(b) for b in source.blobs]
    unused = sorted(set(trained) - {layer.name for layer in layers})
    if unused:
        log.warning("caffemodel layers without a prototxt layer of the same name are ignored: %s", ", ".join(unused))
    return CaffeNet(structure.name, declared_inputs(structure), layers, blobs)
