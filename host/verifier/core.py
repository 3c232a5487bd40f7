"""hb_verifier, the library: run one model three ways and compare every pair.

    report = verify(VerifyOptions(bin_model="m.bin", quanti_model="m_quantized_model.onnx",
                                  run_sim=True, boards=["192.168.1.10"]))
    print(report.text())
    sys.exit(0 if report.passed else 1)

Sides (ptq_guide, "hb_verifier Tool"): the quantized model (quanti.onnx, by
HB_ONNXRuntime on the host), the `.bin` in the x86 simulator (the board runtime
in this process, ``run_sim``), and the `.bin` on each board (gRPC to
hrt_boardd, or SSH running the board's hrt_model_exec). Every pair is compared
output by output (bpuemu.common.compare): "Quanti.onnx VS Arm", "Quanti.onnx VS
Sim", "Arm VS Sim".

What the numbers should be (DESIGN.md, "Numerical contract"): the simulator
and a board agree bit for bit; quanti.onnx and the `.bin` agree bit for bit on
integer tensors and within 1 LSB of the output scale on dequantized outputs
(``lsb=1`` checks exactly that; the output's scale is its ``_HzDequantize``
step's).
"""
import contextlib
import dataclasses
import json
import re
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from bpuemu.common.compare import DEFAULT_DIGITS, TensorComparison, compare_tensors, is_integer
from bpuemu.common.container import read_bin
from bpuemu.common.errors import InvalidInput
from bpuemu.common.march import march as march_of
from bpuemu.common.numerics import dequantize
from bpuemu.common.proto import model_pb2
from bpuemu.board.security import TlsConfig
from bpuemu.board.backends import Backend, LocalBackend, Platform, local_platform
from bpuemu.board.connect import open_backend
from bpuemu.board.runtime import FOLLOW_MODEL
from bpuemu.host.clients.ssh_options import SshOptions
from bpuemu.host.verifier.inputs import load_inputs, random_inputs
from bpuemu.host.verifier.report import NodeDivergence, PairResult, VerifyReport, pair_body, pair_header
from bpuemu.host.verifier.sides import QuantiGraph, SideRun, run_bin, run_quanti

Kind = model_pb2.PlanStep

SIM = "Sim"
QUANTI = "Quanti.onnx"


def board_facts(backend) -> Dict[str, str]:
    """What a board side ran on: its bpuemu, runtime, arch, onnxruntime and timing mode (a gRPC board's handshake);
    the description alone for another backend."""
    client = getattr(backend, "client", None)
    info = getattr(client, "info", None) if client is not None else None
    facts = {"description": getattr(backend, "description", "")}
    if info is not None:
        facts.update(address=client.target, bpuemu=info.daemon_version, runtime=info.runtime_version, arch=info.arch,
                      onnxruntime=info.onnxruntime_version, timing=info.timing or "host", hostname=info.hostname)
    return facts


def _open_board(options: "VerifyOptions", target: str) -> Backend:
    """The .bin opened on one board: ``ssh://`` over SSH, ``grpc://`` on its hrt_boardd.

    A target without a scheme is SSH when ``options.ssh`` is set, else gRPC.
    """
    scheme, _, address = target.rpartition("://")
    if scheme == "ssh" or (not scheme and options.ssh is not None):
        from bpuemu.host.clients.ssh import SshBackend  # paramiko, only when SSH is used

        ssh = options.ssh if options.ssh is not None else SshOptions(target="")
        return SshBackend(dataclasses.replace(ssh, target=address), [options.bin_model])
    return open_backend([options.bin_model], board=address, token=options.token, tls=options.tls)


def _address(target: str) -> str:
    """A -b target as people write it, without the scheme."""
    return target.rpartition("://")[2]


@dataclass
class VerifyOptions:
    bin_model: str
    quanti_model: str = ""  # "": compare the .bin sides only
    model_name: str = ""  # which model of a packed .bin
    run_sim: bool = False  # -s: run the .bin in the x86 simulator
    boards: Sequence[str] = ()  # ssh://[USER@]HOST[:PORT], grpc://HOST[:PORT], or HOST[:PORT] (SSH with ssh, else gRPC)
    ssh: Optional[SshOptions] = None  # how to log in to SSH boards (the target is set per board)
    token: Optional[str] = None  # gRPC board token
    tls: Optional[TlsConfig] = None  # gRPC board TLS (None: $BPUEMU_TLS_*, else plain TCP)
    input_files: str = ""  # -i: "f1,f2" or "name1:f1,name2:f2"; "" = random data
    seed: int = 0  # random inputs
    digits: int = DEFAULT_DIGITS  # -c
    dump_all: bool = False  # -r
    lsb: Optional[float] = None  # --lsb


def board_label(target: str, count: int) -> str:
    return "Arm" if count == 1 else f"Arm({target})"


# --- the .bin facts the comparison needs -------------------------------------

def output_scales(model: model_pb2.Model) -> Dict[str, Tuple[List[float], int]]:
    """Quantization step of each dequantized tensor: (scale, axis), from its _HzDequantize step.

    An output whose Dequantize node was removed (hb_model_modifier) carries
    its scale in its tensor properties instead.
    """
    scales = {}
    for step in model.plan:
        if step.kind == Kind.DEQUANTIZE:
            scales[step.outputs[0]] = (list(step.scale), step.axis if len(step.scale) > 1 else -1)
    for p in model.outputs:
        if p.name not in scales and p.quanti_type == model_pb2.SCALE and p.scale_data:
            scales[p.name] = (list(p.scale_data), p.quantize_axis if len(p.scale_data) > 1 else -1)
    return scales


_DEQUANTIZE_WORD = re.compile(r"(?<![A-Za-z0-9_])Dequantize(?![A-Za-z0-9_])")


def _op_type(node: str, info: Sequence[str]) -> str:
    """The op type of removed node ``node`` as its deleted_nodes_info record gives it ("" if none does)."""
    for line in info:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("name") == node:
            return str(record.get("op_type", ""))
    return ""


def _is_dequantize(node: str, info: Sequence[str]) -> bool:
    """Whether removed node ``node`` was a Dequantize (by name, or its deleted_nodes_info line)."""
    if node.endswith("_HzDequantize"):
        return True
    op_type = _op_type(node, info)
    if op_type:
        return op_type == "Dequantize"
    return any(node in line and _DEQUANTIZE_WORD.search(line) for line in info)  # an older, free-text record


def _removed_at_build(model: model_pb2.Model, nodes: Sequence[str]) -> str:
    """How makertbin removed ``nodes`` ("" when it did not): --fast-perf or remove_node_type."""
    from bpuemu.host.mapper.makertbin import FAST_PERF_REMOVED_TYPES

    params = {kv.key: kv.value for kv in model.build_info.model_parameters}
    types = [t for t in params.get("remove_node_type", "").split(";") if t]
    if not types or not all(_op_type(n, model.build_info.deleted_nodes_info) in types for n in nodes):
        return ""
    if set(FAST_PERF_REMOVED_TYPES) <= set(types):
        return "hb_mapper makertbin --fast-perf"
    return f"makertbin with remove_node_type: {';'.join(types)}"


def check_deleted_nodes(model: model_pb2.Model) -> None:
    """Refuse a .bin whose removed nodes (other than Dequantize) make quanti.onnx incomparable."""
    deleted = list(model.build_info.deleted_nodes)
    bad = [n for n in deleted if not _is_dequantize(n, model.build_info.deleted_nodes_info)]
    how = _removed_at_build(model, bad) if bad else ""
    if how:
        raise InvalidInput(
            f"cannot compare '{model.name}' with quanti.onnx: it was built by {how}, which removed {', '.join(bad)} "
            f"at the model's beginning/end, so its inputs and outputs are no longer quanti.onnx's",
            hint="to verify against quanti.onnx, build without --fast-perf / remove_node_type; to check this .bin, "
                 "compare the simulator with the board: hb_verifier -m model.bin -s True -b BOARD",
        )
    if bad:
        raise InvalidInput(
            f"hb_verifier does not support comparing bin models (with node changes other than Dequantize nodes) with "
            f"quanti.onnx: nodes {', '.join(bad)} were removed from '{model.name}'",
            hint="avoid removing the last node before output if it is not a Dequantize node (hb_model_modifier, "
                 "remove_node_type); to check the .bin alone, compare the simulator with the board: -m model.bin -s True -b BOARD",
        )


def dequantize_removed(arr: np.ndarray, props: model_pb2.TensorProperties) -> np.ndarray:
    """An integer output whose Dequantize was removed, brought back to float as quanti.onnx computes it."""
    return dequantize(arr, props.scale_data, props.zero_point_data, props.quantize_axis)


def plan_order(model: model_pb2.Model) -> Tuple[List[str], Dict[str, model_pb2.PlanStep]]:
    """Tensor names in plan order, and the step that makes each."""
    order, maker = [], {}
    for step in model.plan:
        for name in step.outputs:
            if name not in maker:
                maker[name] = step
                order.append(name)
    return order, maker


# --- the run --------------------------------------------------------------------

Echo = Callable[[str], None]


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def verify(options: VerifyOptions, echo: Optional[Echo] = None,
           progress: Optional[Callable[[int], object]] = None) -> VerifyReport:
    """Run every side, compare every pair; ``progress(total)`` makes a bar with update()/close()."""
    echo = echo or (lambda line: None)
    progress = progress or (lambda total: _NoProgress())
    boards = [b for b in options.boards if b]
    if options.digits < 0:
        raise InvalidInput(f"-c must be 0 or more decimal digits, got {options.digits}")
    if options.lsb is not None and options.lsb < 0:
        raise InvalidInput(f"--lsb must be 0 or more, got {options.lsb}")
    n_sides = bool(options.quanti_model) + bool(options.run_sim) + len(boards)
    if n_sides < 2:
        raise InvalidInput("nothing to compare: a verification needs two of quanti.onnx, the simulator and a board",
                           subject="sides")

    binfile = read_bin(options.bin_model)
    model = binfile.model(options.model_name)
    graph = None
    if options.quanti_model:
        check_deleted_nodes(model)
        graph = QuantiGraph(options.quanti_model)

    inputs = load_inputs(options.input_files, model.input_specs) if options.input_files else \
        random_inputs(model.input_specs, options.seed)
    host = local_platform()
    report = VerifyReport(options.quanti_model, options.bin_model, model.name, options.digits, options.lsb, str(host),
                          inputs=[f"{x.name}: {x.source}" for x in inputs])
    for x in inputs:
        echo(f"INFO input {x.name}: {x.source}, {x.data.dtype.name} {list(x.data.shape)}")

    sides: List[SideRun] = []
    with contextlib.ExitStack() as stack:
        # Boards first: an unreachable board or a refused login fails before any other work.
        opened = []
        for target in boards:
            label = board_label(_address(target), len(boards))
            t0 = time.perf_counter()
            backend = stack.enter_context(_open_board(options, target))
            setup_ms = (time.perf_counter() - t0) * 1e3
            echo(f"INFO {label}: opened {_address(target)} ({setup_ms:.1f} ms)")
            opened.append((label, backend, setup_ms))
        if graph is not None:
            side = run_quanti(options.quanti_model, graph, model, inputs, options.dump_all, report.warnings)
            echo(f"INFO Quanti.onnx infer: {side.info.description}: {side.info.infer_ms:.3f} ms")
            sides.append(side)
        if options.run_sim:
            t0 = time.perf_counter()
            with LocalBackend([options.bin_model], march=FOLLOW_MODEL) as sim:   # the x86 simulator of its march
                sides.append(run_bin(sim, SIM, model.name, inputs, options.dump_all, (time.perf_counter() - t0) * 1e3))
            echo(f"INFO {SIM} infer: {sides[-1].info.description}: {sides[-1].info.infer_ms:.3f} ms")
        for label, backend, setup_ms in opened:
            sides.append(run_bin(backend, label, model.name, inputs, options.dump_all, setup_ms))
            echo(f"INFO {label} infer: {sides[-1].info.description}: {sides[-1].info.infer_ms:.3f} ms")
            report.board_facts[label] = board_facts(backend)
    report.sides = [s.info for s in sides]
    report.model, report.input_data, report.runs = model, list(inputs), list(sides)
    for w in report.warnings:
        echo(f"WARNING {w}")

    comparer = _Comparer(model, graph, options)
    for a, b in _pairs(sides):
        echo(pair_header(a.info.label, b.info.label, a.info.model_name, b.info.model_name))
        pair = comparer.pair(a, b, host, progress)
        echo(pair_body(pair))
        report.pairs.append(pair)
    return report


def _pairs(sides: Sequence[SideRun]) -> List[Tuple[SideRun, SideRun]]:
    """The seed's order: Quanti.onnx VS each board, Quanti.onnx VS Sim, each board VS Sim."""
    quanti = [s for s in sides if s.is_quanti]
    sim = [s for s in sides if s.info.label == SIM]
    boards = [s for s in sides if not s.is_quanti and s.info.label != SIM]
    pairs = [(q, b) for q in quanti for b in boards] + [(q, s) for q in quanti for s in sim]
    pairs += [(b, s) for b in boards for s in sim]
    if not sim:  # several boards and no simulator: compare the boards with each other
        pairs += [(boards[i], boards[j]) for i in range(len(boards)) for j in range(i + 1, len(boards))]
    return pairs


class _Comparer:
    def __init__(self, model: model_pb2.Model, graph: Optional[QuantiGraph], options: VerifyOptions):
        self.model = model
        self.suffix = march_of(model.march or None).flow.model_suffix   # .bin, or .hbm on J6
        self.graph = graph
        self.options = options
        self.scales = output_scales(model)
        self.props = {p.name: p for p in model.outputs}
        self.plan_order, self.step_of = plan_order(model)
        order = list(graph.order) if graph is not None else []
        seen = set(order)
        order += [n for n in self.plan_order if n not in seen]
        self.order = order

    def _compare(self, a: np.ndarray, b: np.ndarray, name_a: str, name_b: str, output: bool = False) -> TensorComparison:
        """``output``: a model output; an integer one without a scale (ArgMax indices) reports its agreement rate."""
        scale, axis = self.scales.get(name_b, (None, -1))
        labels = output and scale is None and is_integer(a) and is_integer(b)
        return compare_tensors(a, b, name_a, name_b, digits=self.options.digits, lsb=self.options.lsb,
                               scale=scale, axis=axis, labels=labels)

    def _output_pair(self, a: SideRun, b: SideRun, name: str) -> Tuple[np.ndarray, np.ndarray]:
        x, y = a.outputs[name], b.outputs[name]
        props = self.props[name]
        for quanti, other in ((a, y), (b, x)):
            if quanti.is_quanti and np.issubdtype(np.asarray(other).dtype, np.integer) \
                    and np.issubdtype(quanti.outputs[name].dtype, np.floating):
                if props.quanti_type != model_pb2.SCALE or not props.scale_data:
                    raise InvalidInput(f"output '{name}' of the .bin is {other.dtype.name} without a scale while quanti.onnx "
                                       f"gives floats: they cannot be compared")
                deq = dequantize_removed(np.asarray(other), props)
                x, y = (x, deq) if quanti is a else (deq, y)
        return x, y

    def pair(self, a: SideRun, b: SideRun, host: Platform, progress) -> PairResult:
        result = PairResult(f"{a.info.label} VS {b.info.label}", a.info.label, b.info.label, a.info.model_name,
                            b.info.model_name)
        shared = [n for n in self.order if n in a.tensors and n in b.tensors] if self.options.dump_all else []
        bar = progress(len(self.model.outputs) + len(shared))
        try:
            for p in self.model.outputs:
                x, y = self._output_pair(a, b, p.name)
                result.outputs.append(self._compare(x, y, p.name, p.name, output=True))
                bar.update(1)
            for name in shared:
                c = self._compare(a.tensors[name], b.tensors[name], name, name, output=name in self.props)
                result.layers.append(c)
                bar.update(1)
                if not c.passed and result.first_divergence is None:
                    result.first_divergence = self._divergence(name, c, a.is_quanti or b.is_quanti)
        finally:
            bar.close()
        if not result.passed:
            result.notes += self._notes(a, b, host)
        return result

    def _divergence(self, name: str, c: TensorComparison, with_quanti: bool) -> NodeDivergence:
        step = self.step_of.get(name)
        step_name = step.name if step is not None else ""
        step_nodes = list(step.source_nodes) if step is not None else []
        if with_quanti and self.graph is not None:
            node, op = self.graph.maker(name)
            if not node:  # a model input: the input preparation differs
                node, op = ("model input (Preprocess)", "") if name in self.graph.inputs else (step_name, "")
            return NodeDivergence(name, node, op, step_name, c, step_nodes, self.suffix)
        return NodeDivergence(name, step_name, "", step_name, c, step_nodes, self.suffix)

    def _notes(self, a: SideRun, b: SideRun, host: Platform) -> List[str]:
        return platform_notes(a, b, host)


def platform_notes(a: SideRun, b: SideRun, host: Platform) -> List[str]:
    """For a failed pair: say when the mismatch lines up with a platform or version difference (or cannot)."""
    notes = []
    boards = [s for s in (a, b) if not s.is_quanti and s.info.label != SIM]
    if not boards:
        if a.is_quanti or b.is_quanti:
            notes.append("quanti.onnx and the simulator both ran on this host, so no platform difference is involved: "
                         "the .bin does not compute what quanti.onnx computes; check that both files come from the "
                         "same hb_mapper makertbin run")
        return notes
    for board in boards:
        bp = board.platform
        if bp is None:
            continue
        if bp.arch != host.arch or bp.onnxruntime_version != host.onnxruntime_version:
            diffs = []
            if bp.arch != host.arch:
                diffs.append(f"CPU arch {bp.arch} vs {host.arch}")
            if bp.onnxruntime_version != host.onnxruntime_version:
                diffs.append(f"onnxruntime {bp.onnxruntime_version} vs {host.onnxruntime_version}")
            notes.append(f"platform difference: {board.info.label} runs {bp}, this host runs {host} "
                         f"({'; '.join(diffs)}): the mismatch lines up with it, since bit-exactness across CPU types and "
                         f"onnxruntime versions is not guaranteed")
        elif not (a.is_quanti or b.is_quanti):
            notes.append(f"{board.info.label} and this host report the same platform ({host}), so a platform "
                         f"difference does not explain this: suspect the transport, the board's copy of the model or "
                         f"its bpuemu version")
    return notes
