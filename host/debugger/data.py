"""The debugger's inputs: the calibrated model and the calibration data.

``load_model`` reads ``*_calibrated_model.onnx`` (a path or a ModelProto) and
indexes its ``HzCalibration`` nodes (bpuemu.host.quant.emit): their kind
(activation/weight), threshold, bit width, and the ordinary nodes they feed.

``load_data`` reads the ``calibration_data/`` directory that makertbin writes
with ``debug_mode: dump_calibration_data``::

    calibration_data/<input name>/0.npy, 1.npy, ...     (one folder per model input)

and checks it against the model's inputs (names, sample counts, shapes).
"""
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import onnx
from onnx import helper

from bpuemu.common.errors import InvalidInput, NotFound
from bpuemu.host.onnxgraph import GraphIndex, load_onnx, tensor_infos
from bpuemu.host.quant.emit import CALIBRATION_OP, calibrated_to_fakequant
from bpuemu.host.quant.graph import float_source

Sample = Dict[str, np.ndarray]
KINDS = ("node", "weight", "activation")


@dataclass
class CalibrationNode:
    """One HzCalibration node: what it quantizes and for whom."""

    name: str
    kind: str                 # "activation" | "weight"
    input: str                # the float tensor it quantizes
    output: str
    threshold: float          # the largest threshold (per-channel nodes hold one per channel)
    thresholds: np.ndarray
    bit: int
    axis: Optional[int]
    consumers: List[str] = field(default_factory=list)   # ordinary nodes reading its output

    @property
    def node(self) -> str:
        """The ordinary node the tables name beside it (its first reader)."""
        return self.consumers[0] if self.consumers else "--"


class CalibratedModel:
    """A calibrated model and the index the debugger needs.

    ``ordinary`` lists the ordinary (non-calibration) nodes in graph order,
    which ONNX keeps topological; ``input_calibrations[node]`` the calibration
    nodes feeding that node's inputs (what "quantizing the node" enables).
    """

    def __init__(self, model: onnx.ModelProto, source: str = "<ModelProto>"):
        self.model = model
        self.source = source
        self._idx = idx = GraphIndex(model)
        self.inputs = idx.inputs
        self.outputs = idx.outputs
        self._producer = idx.producer
        self.calibrations: Dict[str, CalibrationNode] = {}
        by_output: Dict[str, CalibrationNode] = {}
        for n in idx.nodes:
            if n.op_type != CALIBRATION_OP:
                continue
            a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
            kind = _text(a.get("kind", b"activation"))
            dtype = _text(a.get("quant_type", b"int8"))
            thresholds = np.asarray(a.get("thresholds", [0.0]), np.float64)
            c = CalibrationNode(n.name, kind, n.input[0], n.output[0], float(np.max(np.abs(thresholds))),
                                thresholds, int(re.sub(r"\D", "", dtype) or 8), a.get("axis"))
            self.calibrations[n.name] = c
            by_output[c.output] = c
        self.ordinary: List[onnx.NodeProto] = [n for n in idx.nodes if n.op_type != CALIBRATION_OP]
        self.by_name = {n.name: n for n in self.ordinary}
        self.input_calibrations: Dict[str, List[str]] = {}
        for n in self.ordinary:
            feeding = [by_output[i].name for i in n.input if i in by_output]
            for c in feeding:
                self.calibrations[c].consumers.append(n.name)
            if feeding:
                self.input_calibrations[n.name] = list(dict.fromkeys(feeding))
        #: tensor an ordinary node's first output is seen as by its readers (after its output calibration, if any)
        self.observed: Dict[str, str] = {}
        quantizes = {c.input: c for c in self.calibrations.values() if c.kind == "activation"}
        for n in self.ordinary:
            if n.output and n.output[0]:
                c = quantizes.get(n.output[0])
                self.observed[n.name] = c.output if c is not None else n.output[0]
        self._infos = None

    def readers(self, tensor: str) -> List[str]:
        """The ordinary nodes reading ``tensor``, in graph order."""
        return [n.name for n in self._idx.readers(tensor) if n.op_type != CALIBRATION_OP]

    def maker(self, tensor: str) -> Optional[str]:
        """The ordinary node making ``tensor`` (None for a model input or a calibration node's output)."""
        n = self._producer.get(tensor)
        return n.name if n is not None and n.op_type != CALIBRATION_OP else None

    # --- names ----------------------------------------------------------------------------------

    def of_kind(self, kind: str) -> List[str]:
        if kind == "node":
            return [n.name for n in self.ordinary if n.name in self.input_calibrations]
        return [c.name for c in self.calibrations.values() if c.kind == kind]

    def check_names(self, names: Sequence[str], what: str = "node", calibration_only: bool = False) -> None:
        """One clear error for a name the model does not have."""
        known = set(self.calibrations) | (set() if calibration_only else set(self.by_name))
        for name in names:
            if name not in known:
                kinds = "calibration node" if calibration_only else "node"
                close = _close(name, sorted(known))
                raise InvalidInput(f"{what} '{name}' is not a {kinds} of {os.path.basename(self.source)}",
                                   hint=f"did you mean {close}?" if close else
                                   f"the model has {len(self.by_name)} ordinary and {len(self.calibrations)} calibration nodes")

    def calibrations_of(self, name: str) -> List[str]:
        """The calibration nodes a name stands for: itself, or an ordinary node's input calibrations."""
        if name in self.calibrations:
            return [name]
        return list(self.input_calibrations.get(name, []))

    def output_calibrations(self, node: str) -> List[str]:
        """Calibration nodes quantizing a *model output* made by ``node`` (no ordinary node reads them)."""
        outs = set(self.by_name[node].output) if node in self.by_name else set()
        return [c.name for c in self.calibrations.values() if c.kind == "activation" and not c.consumers and c.input in outs]

    def int16_calibrations(self, node: str) -> List[str]:
        """What node_info InputType/OutputType int16 widens for ``node``: the activation calibrations
        of its inputs and of its outputs (weights stay int8 on X5)."""
        outs = set(self.by_name[node].output) if node in self.by_name else set()
        ins = [c for c in self.calibrations_of(node) if self.calibrations[c].kind == "activation"]
        return ins + [c.name for c in self.calibrations.values() if c.kind == "activation" and c.input in outs]

    def kind_of(self, name: str) -> str:
        return self.calibrations[name].kind if name in self.calibrations else "node"

    # --- models ---------------------------------------------------------------------------------

    def fakequant(self, enabled: Optional[Sequence[str]] = None) -> onnx.ModelProto:
        """The model with the ``enabled`` calibration nodes quantizing (None: all), the others float."""
        return calibrated_to_fakequant(self.model, enabled, keep_names=True)

    @property
    def infos(self):
        if self._infos is None:
            self._infos = tensor_infos(self.fakequant(()))
        return self._infos

    def is_float(self, tensor: str) -> bool:
        info = self.infos.get(tensor)
        return info is None or info.is_float

    def compared_outputs(self) -> List[str]:
        """The model outputs the metrics compare. An integer output (ArgMax indices, where a
        cosine of indices means nothing) is compared at the float tensor its producer reads."""
        return list(dict.fromkeys(float_source(t, self._producer, self.is_float) for t in self.outputs))


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _close(name: str, known: Sequence[str]) -> str:
    import difflib

    hits = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"'{hits[0]}'" if hits else ""


def load_model(model_or_file: Union[str, os.PathLike, onnx.ModelProto]) -> CalibratedModel:
    """A CalibratedModel from a path or a ModelProto; refuses anything that is not a calibrated model."""
    if isinstance(model_or_file, onnx.ModelProto):
        model, source = model_or_file, "<ModelProto>"
    else:
        source = os.fspath(model_or_file)
        model = load_onnx(source, "calibrated model")
    if not any(n.op_type == CALIBRATION_OP for n in model.graph.node):
        raise InvalidInput(f"{os.path.basename(source)} is not a calibrated model: it has no {CALIBRATION_OP} nodes",
                           hint="give the *_calibrated_model.onnx that hb_mapper makertbin writes")
    return CalibratedModel(model, source)


class CalibrationDataSet:
    """Calibration samples, each a dict input name -> array, in file order."""

    def __init__(self, samples: Sequence[Sample], source: str = "<memory>"):
        self.samples = list(samples)
        self.source = source

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]

    def __iter__(self):
        return iter(self.samples)

    def first(self, data_num: Optional[int]) -> List[Sample]:
        """The first ``data_num`` samples (None: all); refuses a count out of range."""
        if data_num is None:
            return list(self.samples)
        if not isinstance(data_num, int) or data_num < 1 or data_num > len(self.samples):
            raise InvalidInput(f"data_num {data_num} is out of range: the calibration data has {len(self.samples)} "
                               "sample(s); give 1.." + str(len(self.samples)))
        return list(self.samples[:data_num])

    @classmethod
    def from_dir(cls, path: str, input_names: Sequence[str]) -> "CalibrationDataSet":
        if not os.path.isdir(path):
            raise NotFound(f"calibration data directory not found: {path}")
        entries = sorted(os.listdir(path))
        folders = [e for e in entries if os.path.isdir(os.path.join(path, e))]
        loose = [e for e in entries if e.endswith(".npy")]
        if not folders and loose and len(input_names) == 1:
            per_input = {input_names[0]: [os.path.join(path, f) for f in _numeric(loose)]}
        else:
            missing = [n for n in input_names if n not in folders]
            if missing:
                raise InvalidInput(f"calibration data {path} does not match the model's inputs: no folder for "
                                   f"{', '.join(repr(m) for m in missing)} (it has {', '.join(map(repr, folders)) or 'none'})",
                                   hint="makertbin with debug_mode: dump_calibration_data writes calibration_data/<input>/N.npy")
            per_input = {n: [os.path.join(path, n, f) for f in _numeric(
                [e for e in os.listdir(os.path.join(path, n)) if e.endswith(".npy")])] for n in input_names}
        counts = {n: len(files) for n, files in per_input.items()}
        if not any(counts.values()):
            raise InvalidInput(f"calibration data {path} holds no .npy files")
        if len(set(counts.values())) != 1:
            raise InvalidInput(f"calibration data {path}: the inputs have different sample counts {counts}")
        samples = []
        for i in range(next(iter(counts.values()))):
            sample = {}
            for n, files in per_input.items():
                try:
                    sample[n] = np.load(files[i], allow_pickle=False)
                except (OSError, ValueError) as exc:
                    raise InvalidInput(f"{files[i]} is not a readable .npy file: {exc}") from None
            samples.append(sample)
        return cls(samples, path)


def _numeric(files: Sequence[str]) -> List[str]:
    """0.npy, 1.npy, ..., 10.npy in numeric order (others after, by name)."""
    def key(f):
        stem = f[:-4]
        return (0, int(stem), f) if stem.isdigit() else (1, 0, f)
    return sorted(files, key=key)


def load_data(calibrated_data, cm: CalibratedModel) -> CalibrationDataSet:
    """A CalibrationDataSet from a directory (or one already loaded), checked against the model's inputs."""
    if isinstance(calibrated_data, CalibrationDataSet):
        data = calibrated_data
    elif isinstance(calibrated_data, (list, tuple)):
        data = CalibrationDataSet(calibrated_data)
    elif calibrated_data is None:
        raise InvalidInput("calibrated_data is required (the calibration_data directory makertbin dumps)")
    else:
        data = CalibrationDataSet.from_dir(os.fspath(calibrated_data), cm.inputs)
    shapes = {vi.name: [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
              for vi in cm.model.graph.input if vi.name in cm.inputs}
    for i, s in enumerate(data.samples[:1]):
        missing = [n for n in cm.inputs if n not in s]
        if missing:
            raise InvalidInput(f"calibration data does not match the model's inputs: no data for {missing} "
                               f"(the data has {sorted(s)})")
        for n in cm.inputs:
            want, have = shapes.get(n), list(np.shape(s[n]))
            if want and (len(want) != len(have) or any(w > 0 and w != h for w, h in zip(want, have))):
                raise InvalidInput(f"calibration data for input '{n}' has shape {have}, the model wants "
                                   f"{['?' if w < 0 else w for w in want]}")
    return data
