"""The accuracy debug tool (ptq_guide, "Accuracy Debug Tool"): bpuemu.host.debugger.

Also importable as ``horizon_nn.quantizer.debugger``, the seed's path::

    import horizon_nn.quantizer.debugger as dbg
    dbg.get_sensitivity_of_nodes(model_or_file='calibrated_model.onnx', metrics=['cosine-similarity', 'mse'],
                                 calibrated_data='calibration_data', verbose=True)

It reads what makertbin writes with ``debug_mode: dump_calibration_data``:
``*_calibrated_model.onnx`` (HzCalibration nodes) and ``calibration_data/``.
Every analysis toggles calibration nodes between quantizing and passing the
float value through (``engine``), and compares with the float model.

Modules: ``data`` (loading and checking inputs), ``engine`` (running
candidates), ``sensitivity``, ``acc_error``, ``distribution``, ``analysis``
(sensitivity_analysis), ``runall``, ``plots`` (matplotlib), ``cli`` (hmct-debugger).
"""
from bpuemu.common.compare import Metric
from bpuemu.host.debugger.acc_error import plot_acc_error
from bpuemu.host.debugger.analysis import sensitivity_analysis
from bpuemu.host.debugger.data import CalibratedModel, CalibrationDataSet, load_data, load_model
from bpuemu.host.debugger.distribution import get_channelwise_data_distribution, plot_distribution
from bpuemu.host.debugger.runall import RunallResult, runall
from bpuemu.host.debugger.sensitivity import get_sensitivity_of_nodes

__all__ = [
    "CalibratedModel", "CalibrationDataSet", "Metric", "RunallResult", "get_channelwise_data_distribution",
    "get_sensitivity_of_nodes", "load_data", "load_model", "plot_acc_error", "plot_distribution", "runall",
    "sensitivity_analysis",
]
