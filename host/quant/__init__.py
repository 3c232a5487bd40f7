"""Calibration and quantization for ``hb_mapper makertbin`` (bpuemu.host.quant).

    params = calibrate(optimized, samples, placement.bpu_nodes, image_inputs, QuantOptions())
    calibrated = build_calibrated_model(optimized, params)      # *_calibrated_model.onnx
    quantized = build_quantized_model(optimized, params, image_inputs)   # *_quantized_model.onnx
    cosines = node_cosines(optimized, quantized, samples)      # the "Cosine Similarity" column
    sim = similarity(optimized, quantized, samples)            # node and output cosines in one run

Calibration is separate from quantization (onnxruntime's quantization tool is
the model): per-op quantizers in a registry *mark* the tensors of BPU nodes
(``marking``), statistics are collected once per model (``statistics``),
calibration methods turn them into thresholds (``calibrators``), a strategy
keyed by calibration_type picks among them (``search``, ``api``), and one pass
rewrites the model (``emit``).

Conventions of the quantized model (what the `.bin` compiler relies on):

* standard ONNX QDQ, opset >= 13 (21 when a tensor is int16); stock onnxruntime runs it;
* every BPU node reads its activations through DequantizeLinear and its outputs
  go only to QuantizeLinear; CPU nodes compute in float (reading the
  DequantizeLinear output of BPU-made tensors), and a QuantizeLinear sits
  between a CPU node and the BPU nodes it feeds;
* weights: int8 initializers, per-channel symmetric (axis 0 for Conv/Gemm
  transB=1, 1 for ConvTranspose/Gemm transB=0, the last axis for MatMul);
  biases: int32 initializers, scale s_x * s_w per channel;
* activations: int8 symmetric (scale = threshold / 127, zero point 0) unless
  asymmetric is chosen; int16 where configured; passive ops share one scale
  with their input;
* an X_128 image input is an int8 graph input read through DequantizeLinear
  with scale 1 / zero point 0; featuremap inputs stay float32 with a
  QuantizeLinear (the runtime's ``_HzQuantize``);
* a model output made by a BPU node ends in QuantizeLinear -> DequantizeLinear
  (the runtime's ``_HzDequantize``), or in the QuantizeLinear alone with
  set_model_output_int8/int16.

Evaluation (searches, cosines) uses the board runtime's session options (QDQ
fusion off), as the runtime runs the `.bin`.
"""
from bpuemu.host.quant.api import (
    STRATEGIES, Similarity, build_calibrated_model, build_quantized_model, calibrate, fused_activations, node_cosines,
    output_cosines, qdq_wrapped_nodes, random_samples, similarity,
)
from bpuemu.host.quant.calibrators import THRESHOLD_METHODS, Calibration, Method, kl_threshold, max_threshold
from bpuemu.host.quant.emit import CALIBRATION_OP, HORIZON_DOMAIN, calibrated_to_fakequant, calibration_nodes
from bpuemu.common.compare import cosine_similarity as cosine
from bpuemu.host.quant.graph import strip_qdq
from bpuemu.host.quant.marking import OP_QUANTIZERS, QuantPlan
from bpuemu.host.quant.options import CALIBRATION_TYPES, Int16Spec, QuantOptions
from bpuemu.host.quant.params import Candidate, QuantParams, TensorQuant, WeightQuant
from bpuemu.host.quant.search import sensitivity_of_nodes
from bpuemu.host.quant.statistics import StatisticsCollector, TensorStats

__all__ = [
    "CALIBRATION_OP", "CALIBRATION_TYPES", "HORIZON_DOMAIN", "OP_QUANTIZERS", "STRATEGIES", "THRESHOLD_METHODS",
    "Calibration", "Candidate", "Int16Spec", "Method", "QuantOptions", "QuantParams", "QuantPlan", "Similarity",
    "StatisticsCollector", "TensorQuant", "TensorStats", "WeightQuant",
    "build_calibrated_model", "build_quantized_model", "calibrate", "calibrated_to_fakequant", "calibration_nodes",
    "cosine", "fused_activations", "kl_threshold", "max_threshold", "node_cosines", "output_cosines",
    "qdq_wrapped_nodes", "random_samples", "sensitivity_of_nodes", "similarity", "strip_qdq",
]
