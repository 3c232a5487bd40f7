"""The BIN model structure: the plan as a graph, drawn as the seed shows it.

One node per plan step, named as the profiler names it (so every box has a
row in profiler.log), plus the model's inputs and outputs. BPU subgraphs are
dark cyan, everything the CPU runs (Preprocess, quantize/dequantize, layout
converts, CPU ops) grey. Drawn with matplotlib (Agg, no display needed); the
same graph is also written as Graphviz DOT text.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from bpuemu.common.proto import model_pb2
from bpuemu.host.compiler.plan import Kind

BPU_COLOUR = "#008b8b"      # dark cyan
CPU_COLOUR = "#808080"      # grey
IO_COLOUR = "#ffffff"


@dataclass
class Node:
    name: str
    kind: str                  # "BPU" | "CPU" | "input" | "output"
    label: str
    level: int = 0
    column: float = 0.0


@dataclass
class Structure:
    nodes: List[Node] = field(default_factory=list)
    edges: List[Tuple[int, int]] = field(default_factory=list)

    def colour(self, node: Node) -> str:
        return {"BPU": BPU_COLOUR, "CPU": CPU_COLOUR}.get(node.kind, IO_COLOUR)


_KIND_LABEL = {
    Kind.PREPROCESS: "Preprocess", Kind.BPU_SUBGRAPH: "BPU subgraph", Kind.CPU_OP: "CPU op",
    Kind.DEQUANTIZE: "Dequantize", Kind.QUANTIZE: "Quantize", Kind.LAYOUT_CONVERT: "layout convert",
}


def structure(model: model_pb2.Model) -> Structure:
    """Nodes and dataflow edges of ``model``'s plan (layout converts included)."""
    s = Structure()
    writer: Dict[str, int] = {}
    for p in model.inputs:
        s.nodes.append(Node(p.name, "input", f"input: {p.name}"))
        writer[f"rt:{p.name}"] = len(s.nodes) - 1
    for step in model.plan:
        kind = "BPU" if step.kind == Kind.BPU_SUBGRAPH else "CPU"
        label = step.name
        if step.kind == Kind.CPU_OP and step.op_types:
            label += f"\n({', '.join(t for t in step.op_types if t not in ('QuantizeLinear', 'DequantizeLinear'))})"
        elif step.kind != Kind.CPU_OP:
            label += f"\n[{_KIND_LABEL.get(step.kind, '')}]"
        s.nodes.append(Node(step.name, kind, label))
        me = len(s.nodes) - 1
        for t in step.inputs:
            src = writer.get(t)
            if src is not None and (src, me) not in s.edges:
                s.edges.append((src, me))
        for t in step.outputs:
            writer[t] = me
    outs = list(model.output_tensors) or [p.name for p in model.outputs]
    for p, t in zip(model.outputs, outs):
        s.nodes.append(Node(p.name, "output", f"output: {p.name}"))
        src = writer.get(t)
        if src is not None:
            s.edges.append((src, len(s.nodes) - 1))
    _layout(s)
    return s


def _layout(s: Structure) -> None:
    """Longest-path levels top to bottom; nodes of a level side by side."""
    preds: Dict[int, List[int]] = {}
    for a, b in s.edges:
        preds.setdefault(b, []).append(a)
    for i, node in enumerate(s.nodes):       # plan order is topological
        node.level = 1 + max((s.nodes[p].level for p in preds.get(i, [])), default=-1)
    by_level: Dict[int, List[Node]] = {}
    for node in s.nodes:
        by_level.setdefault(node.level, []).append(node)
    for nodes in by_level.values():
        for k, node in enumerate(nodes):
            node.column = k - (len(nodes) - 1) / 2.0


def dot(s: Structure, name: str) -> str:
    """Graphviz DOT text of the structure."""
    def q(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'

    lines = [f"digraph {q(name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    for i, n in enumerate(s.nodes):
        if n.kind in ("input", "output"):
            lines.append(f"  n{i} [label={q(n.label)}, shape=ellipse, style=filled, fillcolor={q(IO_COLOUR)}];")
        else:
            lines.append(f"  n{i} [label={q(n.label)}, shape=box, style=\"rounded,filled\", "
                         f"fillcolor={q(s.colour(n))}, fontcolor=\"white\"];")
    lines += [f"  n{a} -> n{b};" for a, b in s.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw_png(s: Structure, path: str, title: str = "") -> None:
    """Draw the structure into a PNG with matplotlib (headless Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    levels = max((n.level for n in s.nodes), default=0) + 1
    widest = max((sum(1 for m in s.nodes if m.level == n.level) for n in s.nodes), default=1)
    chars = max((max(len(line) for line in n.label.split("\n")) for n in s.nodes), default=10)
    box_w = max(2.0, 0.085 * chars + 0.4)          # inches
    box_h, gap_x, gap_y = 0.62, 0.5, 0.45
    fig_w = widest * (box_w + gap_x) + gap_x
    fig_h = levels * (box_h + gap_y) + gap_y + (0.4 if title else 0)
    fig = Figure(figsize=(fig_w, fig_h), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, fig_w)
    ax.set_ylim(0, fig_h)
    ax.axis("off")
    top = fig_h - (0.4 if title else 0) - gap_y

    def centre(n: Node):
        return fig_w / 2 + n.column * (box_w + gap_x), top - n.level * (box_h + gap_y) - box_h / 2

    if title:
        ax.text(fig_w / 2, fig_h - 0.25, title, ha="center", va="center", fontsize=11, fontweight="bold")
    for a, b in s.edges:
        (x0, y0), (x1, y1) = centre(s.nodes[a]), centre(s.nodes[b])
        ax.add_patch(FancyArrowPatch((x0, y0 - box_h / 2), (x1, y1 + box_h / 2), arrowstyle="-|>",
                                     mutation_scale=12, color="#333333", linewidth=1.0))
    for n in s.nodes:
        x, y = centre(n)
        io = n.kind in ("input", "output")
        ax.add_patch(FancyBboxPatch((x - box_w / 2, y - box_h / 2), box_w, box_h,
                                    boxstyle="round,pad=0,rounding_size=0.3" if io else "round,pad=0,rounding_size=0.08",
                                    facecolor=s.colour(n), edgecolor="#222222", linewidth=1.0))
        ax.text(x, y, n.label, ha="center", va="center", fontsize=8, color="black" if io else "white",
                family="DejaVu Sans")
    fig.savefig(path, format="png", facecolor="white")
