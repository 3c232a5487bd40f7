"""The seed's import path of the x86 inference library, as a thin alias of bpuemu.host.

    from horizon_tc_ui import HB_ONNXRuntime
    sess = HB_ONNXRuntime(model_file="***_quantized_model.onnx")

Host-only (onnx, onnxruntime): installed with ``pip install 'bpuemu[host]'``.
"""
from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

__all__ = ["HB_ONNXRuntime"]
