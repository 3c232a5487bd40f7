"""Caffe 1.0 models (prototxt + caffemodel) for hb_mapper --model-type caffe.

``caffe_to_onnx`` turns a deploy net into the float ONNX model that the rest of
the conversion pipeline works on; no Caffe install is involved. Modules:

* ``caffe_pb2``  generated from proto/bpuemu/caffe/caffe.proto (scripts/gen_proto.py)
* ``reader``     prototxt (text format) + caffemodel (binary) -> CaffeNet
* ``graph``      the ONNX graph under construction, blob -> tensor bookkeeping
* ``layers``     one converter per Caffe layer type (the registry)
* ``convert``    the driver: support check, output_nodes cut, outputs
"""
from bpuemu.host.caffe.convert import UnsupportedLayers, caffe_inputs, caffe_to_onnx

__all__ = ["UnsupportedLayers", "caffe_inputs", "caffe_to_onnx"]
