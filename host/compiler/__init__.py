"""The compile step: a QDQ quantized ONNX model -> partitioned execution plan -> ``.bin``."""
