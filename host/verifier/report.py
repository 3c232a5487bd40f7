"""hb_verifier's report: dataclasses, and the text the seed's tool prints.

One block per compare source ("Quanti.onnx VS Arm", "Quanti.onnx VS Sim",
"Arm VS Sim"), each with the seed's figures per model output (mismatch result
num with line_miss / line_diff / line_nan, total result num, mismatch rate,
relative mismatch ratio, max abs error) plus cosine similarity (the agreement
rate for integer outputs without a scale, e.g. ArgMax indices), MSE and the
largest error in LSBs, then "raw output X and raw output Y result Strict check
PASSED/FAILED" per output and "<A> and <B> result Strict check PASSED/FAILED"
for the pair. With -r the block also lists every shared intermediate tensor
and names the first one, in topological order, where the two sides diverge.
"""
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from bpuemu.common.compare import TensorComparison

RULE = "*" * 63


@dataclass
class SideInfo:
    """One place the model ran: quanti.onnx on the host, the simulator, a board."""

    label: str  # "Quanti.onnx", "Sim", "Arm"
    model_name: str
    description: str
    platform: str
    setup_ms: float = 0.0  # session build, or backend open (upload + load on a board)
    infer_ms: float = 0.0  # wall time of the inference call
    compute_ms: float = 0.0  # what the runtime itself reports (board latency)

    @property
    def transfer_ms(self) -> float:
        """Wall time of the call beyond the runtime's own: the transport's share."""
        return max(0.0, self.infer_ms - self.compute_ms)


@dataclass
class NodeDivergence:
    """Where two sides first disagree (-r)."""

    tensor: str
    node: str  # the quanti.onnx node (or .bin plan step) that makes the tensor
    op_type: str
    step: str  # the .bin plan step that makes it
    comparison: TensorComparison
    step_nodes: List[str] = field(default_factory=list)  # the quanti.onnx nodes that step runs
    model_suffix: str = ".bin"  # the deployed model's file kind (".hbm" on J6): the step is its plan's

    def describe(self) -> str:
        where = f"node '{self.node}' ({self.op_type})" if self.op_type else f"step '{self.node}'"
        if self.step and self.step != self.node:
            where += f", in {self.model_suffix} step '{self.step}'"
        if self.step_nodes and self.step_nodes != [self.node]:
            shown = self.step_nodes[:6]
            more = f" and {len(self.step_nodes) - len(shown)} more" if len(self.step_nodes) > len(shown) else ""
            where += f" (which runs {', '.join(shown)}{more})"
        c = self.comparison
        return (f"first divergence: tensor '{self.tensor}' made by {where}: "
                f"{c.mismatch.total}/{c.total} mismatched, max abs error {c.max_abs_error:.6g}")


@dataclass
class PairResult:
    source: str  # "Quanti.onnx VS Arm"
    side_a: str
    side_b: str
    model_a: str
    model_b: str
    outputs: List[TensorComparison] = field(default_factory=list)
    layers: List[TensorComparison] = field(default_factory=list)
    first_divergence: Optional[NodeDivergence] = None
    notes: List[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.outputs) and all(c.passed for c in self.layers)

    def to_dict(self) -> dict:
        return {
            "source": self.source, "side_a": self.side_a, "side_b": self.side_b,
            "model_a": self.model_a, "model_b": self.model_b, "passed": self.passed,
            "outputs": [c.to_dict() for c in self.outputs], "layers": [c.to_dict() for c in self.layers],
            "first_divergence": None if self.first_divergence is None else {
                "tensor": self.first_divergence.tensor, "node": self.first_divergence.node,
                "op_type": self.first_divergence.op_type, "step": self.first_divergence.step,
                "step_nodes": list(self.first_divergence.step_nodes),
                "comparison": self.first_divergence.comparison.to_dict()},
            "notes": list(self.notes),
        }


@dataclass
class VerifyReport:
    quanti_model: str
    bin_model: str
    model_name: str
    digits: int
    lsb: Optional[float]
    host_platform: str
    inputs: List[str] = field(default_factory=list)  # "name: source"
    sides: List[SideInfo] = field(default_factory=list)
    pairs: List[PairResult] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    # What a repro bundle keeps (bpuemu.host.verifier.repro): the model, the inputs, each side's run, board facts.
    model: Any = field(default=None, repr=False, compare=False)
    input_data: list = field(default_factory=list, repr=False, compare=False)
    runs: list = field(default_factory=list, repr=False, compare=False)
    board_facts: Dict[str, Dict[str, str]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return bool(self.pairs) and all(p.passed for p in self.pairs)

    def to_dict(self) -> dict:
        return {
            "quanti_model": self.quanti_model, "bin_model": self.bin_model, "model_name": self.model_name,
            "digits": self.digits, "lsb": self.lsb, "host_platform": self.host_platform, "inputs": list(self.inputs),
            "sides": [dict(asdict(s), transfer_ms=s.transfer_ms) for s in self.sides],
            "pairs": [p.to_dict() for p in self.pairs], "warnings": list(self.warnings), "passed": self.passed,
        }

    def write_json(self, path: str) -> None:
        from bpuemu.common.atomic import write_file_atomic

        write_file_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")

    def text(self) -> str:
        return "\n".join(pair_header(p.side_a, p.side_b, p.model_a, p.model_b) + "\n" + pair_body(p) for p in self.pairs)


def _lines(level: str, *lines: str) -> str:
    return "\n".join(f"{level} {line}" for line in lines)


def pair_header(side_a: str, side_b: str, model_a: str, model_b: str) -> str:
    return _lines("INFO", RULE, f"compare source: {side_a} VS {side_b}", f"compare model name: {model_a} VS {model_b}")


def _tensor_block(c: TensorComparison, what: str) -> List[str]:
    out = [_lines(
        "INFO",
        f"Comparison results of {what} is {c.name_b}",
        f"mismatch result num: {c.mismatch.total}",
        f"****** mismatch.line_miss num: {c.mismatch.line_miss}",
        f"****** mismatch.line_diff num: {c.mismatch.line_diff}",
        f"****** mismatch.line_nan num: {c.mismatch.line_nan}",
        f"total result num: {c.total}",
        f"mismatch rate: {c.mismatch_rate}",
        f"relative mismatch ratio: {c.relative_mismatch_ratio}",
        f"max abs error: {c.max_abs_error:.6g}",
        f"{_similarity_text(c)}, mse: {c.mse:.6g}" + _lsb_text(c),
    )]
    if c.shape_a != c.shape_b:
        out.append(_lines("WARNING", f"shapes differ: {c.shape_a} vs {c.shape_b}"))
    return out


def _similarity_text(c: TensorComparison, long: bool = True) -> str:
    """The cosine, or for integer outputs without a scale (indices, labels) the agreement rate."""
    if c.agreement is not None:
        return f"agreement rate: {c.agreement:.6f}" if long else f"agreement {c.agreement:.6f}"
    return f"cosine similarity: {c.cosine:.6f}" if long else f"cosine {c.cosine:.6f}"


def _lsb_text(c: TensorComparison) -> str:
    if c.max_lsb_error is None:
        return ", max lsb error: n/a (float output without a quantization scale)"
    scale = c.scale[0] if c.scale and len(c.scale) == 1 else f"per channel x{len(c.scale or [])}"
    tol = f", tolerance {c.lsb_tolerance:g} lsb" if c.lsb_tolerance is not None else ""
    return f", max lsb error: {c.max_lsb_error:.4g} (scale {scale}{tol})"


def _verdict(passed: bool) -> str:
    return "PASSED" if passed else "FAILED"


def pair_body(p: PairResult) -> str:
    out = [_lines("INFO", "=============== Original output comparison results =================")]
    for c in p.outputs:
        out += _tensor_block(c, "original output")
        out.append(_lines("INFO" if c.passed else "WARNING",
                          f"raw output {c.name_a} and raw output {c.name_b} result Strict check {_verdict(c.passed)}"))
    if p.layers:
        out.append(_lines("INFO", "=============== All nodes comparison results ================="))
        for i, c in enumerate(p.layers):
            line = (f"[{i}] {c.name_b}: mismatch {c.mismatch.total}/{c.total}, max abs error {c.max_abs_error:.6g}, "
                    f"{_similarity_text(c, long=False)} {_verdict(c.passed)}")
            out.append(_lines("INFO" if c.passed else "WARNING", line))
        if p.first_divergence is not None:
            out.append(_lines("WARNING", p.first_divergence.describe()))
        else:
            out.append(_lines("INFO", f"no divergence in {len(p.layers)} shared tensor(s)"))
    for note in p.notes:
        out.append(_lines("WARNING" if not p.passed else "INFO", note))
    out.append(_lines("INFO" if p.passed else "WARNING", f"{p.side_a} and {p.side_b} result Strict check {_verdict(p.passed)}"))
    out.append(_lines("INFO", RULE))
    return "\n".join(out)
