"""The J6 flow's import path of the host inference class (ptq_faq_j6), as a thin alias of bpuemu.host.

    from horizon_tc_ui.hb_runtime import HBRuntime
    sess = HBRuntime("model_output/tiny.hbm")     # .onnx, .bc or .hbm
    outputs = sess.run(None, {sess.input_names[0]: x})

Host-only (onnx, onnxruntime): installed with ``pip install 'bpuemu[host]'``.
"""
from bpuemu.host.hb_runtime import HBRuntime

__all__ = ["HBRuntime"]
