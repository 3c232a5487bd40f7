"""plot_distribution and get_channelwise_data_distribution: what the values look like.

* weight calibration node: the float weights and the calibrated (fake-quantized) weights;
* activation calibration node: its input data over the calibration samples;
* ordinary node: its output in the float and in the calibrated model, and the error.

Files: ``distribution_<node>.png`` and ``channelwise_<node>.png`` in save_dir.
"""
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.host.debugger import plots
from bpuemu.host.debugger.data import CalibratedModel, CalibrationNode, Sample, load_data, load_model
from bpuemu.host.debugger.engine import progress
from bpuemu.host.onnxgraph import GraphIndex, feed_for, open_session, with_outputs


def _names(nodes_list) -> List[str]:
    if nodes_list is None or nodes_list == []:
        raise InvalidInput("nodes_list is required: the nodes to plot")
    return [nodes_list] if isinstance(nodes_list, str) else [str(n) for n in nodes_list]


def fake_quantize(c: CalibrationNode, x: np.ndarray, scales: np.ndarray, zero_points: np.ndarray) -> np.ndarray:
    """x quantized and dequantized the way the calibration node does (per tensor or along its axis)."""
    shape = [1] * x.ndim
    if scales.size > 1 and c.axis is not None:
        shape[c.axis % x.ndim] = scales.size
    s, z = scales.reshape(shape if scales.size > 1 else ()), zero_points.reshape(shape if zero_points.size > 1 else ())
    lo, hi = -(1 << (c.bit - 1)), (1 << (c.bit - 1)) - 1
    return ((np.clip(np.rint(x / s) + z, lo, hi) - z) * s).astype(np.float32)


def _calib_params(cm: CalibratedModel, name: str):
    from onnx import helper

    node = next(n for n in cm.model.graph.node if n.name == name)
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    return np.asarray(a["scales"], np.float64), np.asarray(a["zero_points"], np.float64)


def weight_value(cm: CalibratedModel, c: CalibrationNode) -> np.ndarray:
    idx = GraphIndex(cm.model)
    if c.input not in idx.inits:
        raise InvalidInput(f"weight calibration node '{c.name}' reads '{c.input}', which is not an initializer")
    return idx.const(c.input).astype(np.float32)


def collect(cm: CalibratedModel, samples: Sequence[Sample], float_tensors: Sequence[str],
            quant_tensors: Sequence[str]) -> Dict[str, Dict[str, List[np.ndarray]]]:
    """{'float': {tensor: [per sample]}, 'quantized': {...}}: one run of each model per sample."""
    out: Dict[str, Dict[str, List[np.ndarray]]] = {"float": {}, "quantized": {}}
    runs = [("float", (), list(dict.fromkeys(float_tensors))), ("quantized", None, list(dict.fromkeys(quant_tensors)))]
    sessions = [(key, open_session(with_outputs(cm.fakequant(en), names, cm.infos)), names) for key, en, names in runs if names]
    for s in progress(samples, "samples"):
        for key, sess, names in sessions:
            feed = feed_for(sess, s)
            computed = [t for t in names if t not in feed]   # a model input is read from the feed
            values = dict(zip(computed, sess.run(computed, feed))) if computed else {}
            for t in names:
                out[key].setdefault(t, []).append(feed[t] if t in feed else values[t])
    return out


def distributions(cm: CalibratedModel, samples: Sequence[Sample], nodes: Sequence[str], save_dir: str) -> Dict[str, str]:
    """node -> PNG path."""
    cm.check_names(nodes, "node")
    acts = [cm.calibrations[n] for n in nodes if n in cm.calibrations and cm.calibrations[n].kind == "activation"]
    ordinary = [n for n in nodes if n not in cm.calibrations]
    bad = [n for n in ordinary if n not in cm.observed or not cm.is_float(cm.observed[n])]
    if bad:
        raise InvalidInput(f"node '{bad[0]}' has no float output to plot")
    data = collect(cm, samples, [c.input for c in acts] + [cm.observed[n] for n in ordinary],
                   [cm.observed[n] for n in ordinary])
    out = {}
    for name in progress(nodes, "distribution plots"):
        path = os.path.join(save_dir, f"distribution_{plots.safe_name(name)}.png")
        if name in cm.calibrations and cm.calibrations[name].kind == "weight":
            c = cm.calibrations[name]
            w = weight_value(cm, c)
            q = fake_quantize(c, w, *_calib_params(cm, name))
            plots.distribution(path, f"weight {name} ({c.node})", {"float weight": w, "calibrated weight": q},
                               float(np.min(np.abs(c.thresholds))))
        elif name in cm.calibrations:
            c = cm.calibrations[name]
            x = np.concatenate([v.reshape(-1) for v in data["float"][c.input]])
            plots.distribution(path, f"activation {name}: input of {c.node} ({c.bit} bit)", {"input data": x},
                               float(np.min(np.abs(c.thresholds))))
        else:
            t = cm.observed[name]
            f = np.concatenate([v.reshape(-1) for v in data["float"][t]])
            q = np.concatenate([v.reshape(-1) for v in data["quantized"][t]])
            plots.distribution(path, f"node {name}: output", {"float model": f, "calibrated model": q}, error=q - f)
        out[name] = path
    return out


def channelwise(cm: CalibratedModel, samples: Sequence[Sample], nodes: Sequence[str], save_dir: str,
                axis: Optional[int] = None) -> Dict[str, str]:
    """Calibration node -> PNG path of its per-channel box plot."""
    cm.check_names(nodes, "calibration node", calibration_only=True)
    calibs = [cm.calibrations[n] for n in nodes]
    acts = [c for c in calibs if c.kind == "activation"]
    data = collect(cm, samples, [c.input for c in acts], []) if acts else {"float": {}}
    out = {}
    for c in progress(calibs, "channel-wise plots"):
        if c.kind == "weight":
            x = weight_value(cm, c)
            ax = axis if axis is not None else (c.axis if c.axis is not None else 0)
        else:
            x = np.concatenate(data["float"][c.input], axis=0)
            ax = axis if axis is not None else 1
        if not -x.ndim <= ax < x.ndim:
            raise InvalidInput(f"axis {ax} is out of range for '{c.name}' whose input has {x.ndim} dimension(s)")
        per_channel = list(np.moveaxis(x, ax, 0).reshape(x.shape[ax], -1))
        path = os.path.join(save_dir, f"channelwise_{plots.safe_name(c.name)}.png")
        plots.channel_boxes(path, f"{c.kind} {c.name} ({c.node}), axis {ax}", per_channel, c.threshold)
        out[c.name] = path
    return out


def plot_distribution(save_dir: Optional[str] = None, model_or_file=None, calibrated_data=None, nodes_list=None) -> Dict[str, str]:
    """Float vs quantized value distributions per node; returns {node: PNG path}."""
    cm = load_model(model_or_file)
    names = _names(nodes_list)
    data = load_data(calibrated_data, cm)
    return distributions(cm, data.first(None), names, save_dir if save_dir is not None else ".")


def get_channelwise_data_distribution(save_dir: Optional[str] = None, model_or_file=None, calibrated_data=None,
                                      nodes_list=None, axis: Optional[int] = None) -> Dict[str, str]:
    """Per-channel box plots of calibration nodes' inputs; returns {node: PNG path}."""
    cm = load_model(model_or_file)
    names = _names(nodes_list)
    data = load_data(calibrated_data, cm)
    return channelwise(cm, data.first(None), names, save_dir if save_dir is not None else ".", axis)
