"""The places hb_verifier runs a model: quanti.onnx on the host, the `.bin` anywhere.

``run_quanti`` runs the quantized ONNX model with HB_ONNXRuntime (the board
runtime's session options: QDQ fusion off). With ``dump_all`` it runs a copy of
the model that also exposes every activation tensor as a graph output -- with
the same session options, so exposing tensors cannot change fusion choices
(DESIGN.md, "Numerical contract"); the outputs of that run are checked against
the plain run anyway.

``run_bin`` runs the `.bin` through any Backend (the in-process x86 simulator,
a gRPC board, an SSH board) with the board's own intermediate dump.
"""
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.errors import InvalidInput
from bpuemu.common.input_types import to_model_input
from bpuemu.common.proto import model_pb2
from bpuemu.common.tensor import ORT_DTYPES
from bpuemu.board.backends import Backend, Platform, local_platform
from bpuemu.host.verifier.inputs import VerifyInput
from bpuemu.host.verifier.report import SideInfo


@dataclass
class SideRun:
    info: SideInfo
    outputs: Dict[str, np.ndarray]  # by .bin output name, in model output order
    tensors: Dict[str, np.ndarray] = field(default_factory=dict)  # -r: every dumped tensor by name
    platform: Optional[Platform] = None
    is_quanti: bool = False


class QuantiGraph:
    """The quanti.onnx graph facts the verifier needs: inputs, outputs, producers, order."""

    def __init__(self, path: str):
        from bpuemu.host.onnxgraph import GraphIndex, load_onnx, name_nodes

        self.model = load_fixed_point(path) if is_bc(path) else load_onnx(path, "quantized model")
        self.label = "Quantized.bc" if is_bc(path) else "Quanti.onnx"
        name_nodes(self.model)  # unnamed nodes get the names the rest of the toolchain gives them
        self.index = idx = GraphIndex(self.model)
        self.inputs, self.outputs = idx.inputs, idx.outputs
        constant = set(idx.inits)
        self.activations: List[str] = []  # node outputs that depend on model inputs, in graph order
        for n in idx.nodes:
            if all((not x) or x in constant for x in n.input):
                constant.update(o for o in n.output if o)  # weights and their DequantizeLinear
            else:
                self.activations.extend(o for o in n.output if o)
        self.order = self.inputs + self.activations

    def maker(self, tensor: str) -> Tuple[str, str]:
        """(name, op type) of the node that computes ``tensor``: for a QuantizeLinear output, the op it quantizes."""
        node = self.index.producer.get(tensor)
        if node is None:
            return "", ""
        if node.op_type == "QuantizeLinear":
            src = self.index.producer.get(node.input[0])
            if src is not None and src.op_type != "DequantizeLinear":
                node = src
        return node.name, node.op_type

    def with_all_outputs(self):
        """A copy of the model whose graph outputs include every activation tensor."""
        from bpuemu.host.onnxgraph import with_outputs

        return with_outputs(self.model, self.activations)


def is_bc(path: str) -> bool:
    """Whether ``path`` is a J6 `.bc` fixed-point model (by its magic bytes)."""
    from bpuemu.common.container import BC_MAGIC

    try:
        with open(path, "rb") as f:
            return f.read(8) == BC_MAGIC
    except OSError:
        return False   # load_onnx says what is wrong with it


def load_fixed_point(path: str):
    """The quantized ONNX model a `.bc` carries (hb_compile's *_quantized_model.bc, *_quantized_removed_model.bc)."""
    import onnx

    from bpuemu.common.container import read_bc

    return onnx.load_from_string(read_bc(path).onnx_bytes)


def align_outputs(quanti_outputs: Dict[str, np.ndarray], model: model_pb2.Model) -> Dict[str, np.ndarray]:
    """quanti.onnx outputs keyed by the `.bin` output they correspond to (by name, else by position)."""
    names = [p.name for p in model.outputs]
    if set(names) <= set(quanti_outputs):
        return {n: quanti_outputs[n] for n in names}
    if len(quanti_outputs) != len(names):
        raise InvalidInput(f"quanti.onnx has {len(quanti_outputs)} output(s) ({', '.join(quanti_outputs)}), the .bin model "
                           f"'{model.name}' has {len(names)} ({', '.join(names)}): they are not the same model",
                           hint="pass the *_quantized_model.onnx that hb_mapper makertbin wrote with this .bin")
    return dict(zip(names, quanti_outputs.values()))



def _check_same_inputs(sess, feed: Dict[str, np.ndarray], model: model_pb2.Model) -> None:
    """quanti.onnx must take exactly what the .bin's Preprocess makes (names, dtypes, shapes)."""
    want = {i.name: (ORT_DTYPES[i.type].name if i.type in ORT_DTYPES else i.type, list(i.shape)) for i in sess.get_inputs()}
    have = {n: (x.dtype.name, list(x.shape)) for n, x in feed.items()}
    same = want.keys() == have.keys() and all(
        want[n][0] == have[n][0] and len(want[n][1]) == len(have[n][1])
        and all(not isinstance(w, int) or w == h for w, h in zip(want[n][1], have[n][1])) for n in want)
    if not same:
        raise InvalidInput(f"quanti.onnx takes {want}, the .bin model '{model.name}' feeds its first piece {have}: "
                           f"they are not the same model",
                           hint="pass the *_quantized_model.onnx that hb_mapper makertbin wrote with this .bin")


def run_quanti(path: str, graph: QuantiGraph, model: model_pb2.Model, inputs: Sequence[VerifyInput],
               dump_all: bool, warnings: List[str]) -> SideRun:
    from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

    t0 = time.perf_counter()
    sess = HB_ONNXRuntime(onnx_model=graph.model)
    setup_ms = (time.perf_counter() - t0) * 1e3
    feed = {spec.plan_tensor: to_model_input(x.data, spec) for spec, x in zip(model.input_specs, inputs)}
    _check_same_inputs(sess, feed, model)
    t0 = time.perf_counter()
    raw = dict(zip(sess.output_names, sess.run(None, feed)))
    infer_ms = (time.perf_counter() - t0) * 1e3
    tensors: Dict[str, np.ndarray] = {}
    if dump_all:
        full = HB_ONNXRuntime(onnx_model=graph.with_all_outputs())
        tensors = dict(zip(full.output_names, full.run(None, feed)))
        changed = [n for n in raw if not np.array_equal(raw[n], tensors[n], equal_nan=True)]
        if changed:
            warnings.append(f"dumping every node changed quanti.onnx's output(s) {', '.join(changed)}: "
                            f"the node comparison may not reflect the plain run")
        tensors.update(feed)
    name = graph.model.graph.name or "quanti.onnx"
    info = SideInfo(graph.label, os.path.splitext(os.path.basename(path))[0], f"{path} (HB_ONNXRuntime, {name})",
                    str(local_platform()), setup_ms, infer_ms, infer_ms)
    return SideRun(info, align_outputs(raw, model), tensors, local_platform(), is_quanti=True)


def run_bin(backend: Backend, label: str, model_name: str, inputs: Sequence[VerifyInput], dump_all: bool,
            setup_ms: float) -> SideRun:
    handle = backend.model(model_name)
    t0 = time.perf_counter()
    result = handle.infer([x.data for x in inputs], dump_intermediate=dump_all)
    infer_ms = (time.perf_counter() - t0) * 1e3
    platform = backend.platform
    info = SideInfo(label, handle.name, backend.description, str(platform), setup_ms, infer_ms,
                    sum(result.latency_ms) if result.latency_ms else infer_ms)
    outputs = {n: result.outputs[n] for n in handle.output_names}
    return SideRun(info, outputs, dict(result.intermediates), platform)
