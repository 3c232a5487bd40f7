"""Drawing the debugger's figures with matplotlib's headless Agg canvas (PNG files).

Each function takes plain numbers and a path; none runs a model. matplotlib is
imported on first use, so ``hmct-debugger --help`` stays instant.
"""
import os
import re
from typing import Dict, List, Optional, Sequence

import numpy as np

#: At most this many values per channel go into a box plot (quantiles barely move; drawing stays fast).
BOX_SAMPLE = 4000
MAX_TICK_LABELS = 40


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def safe_name(name: str) -> str:
    """A file name for a node name (``/`` and other specials become ``_``)."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name).strip("._") or "node"


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=100, bbox_inches="tight")
    os.replace(tmp, path)
    _plt().close(fig)
    return path


def _ticks(ax, labels: Sequence[str]) -> None:
    step = max(1, len(labels) // MAX_TICK_LABELS)
    pos = list(range(0, len(labels), step))
    ax.set_xticks(pos)
    ax.set_xticklabels([labels[i] for i in pos], rotation=90, fontsize=7)


def error_curves(path: str, curves: Dict[str, Dict[str, float]], metric: str, title: str) -> str:
    """Cumulative error curves: one line per partial model over the nodes in topological order."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(8, min(24, 0.12 * max(len(c) for c in curves.values()))), 5))
    labels: List[str] = []
    for label, curve in curves.items():
        labels = list(curve)
        ax.plot(range(len(curve)), list(curve.values()), marker=".", markersize=3, linewidth=1, label=label)
    _ticks(ax, labels)
    ax.set_ylabel(metric)
    ax.set_xlabel("node (topological order)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def _hist(ax, values: np.ndarray, label: str, color: str, bins: int = 200) -> None:
    v = values[np.isfinite(values)]
    if v.size:
        ax.hist(v, bins=bins, histtype="step", color=color, label=label, log=True)


def _marks(ax, values: np.ndarray, threshold: Optional[float]) -> None:
    """The seed's marks: blue triangles at the largest |value|, a red dashed line at the smallest threshold."""
    v = values[np.isfinite(values)]
    if v.size:
        m = float(np.max(np.abs(v)))
        ax.plot([-m, m], [0, 0], linestyle="none", marker="^", color="blue", markersize=9, label=f"max |x| = {m:.5g}",
                transform=ax.get_xaxis_transform(), clip_on=False)
    if threshold is not None and threshold > 0:
        for t in (-threshold, threshold):
            ax.axvline(t, color="red", linestyle="--", linewidth=1)
        ax.plot([], [], color="red", linestyle="--", label=f"threshold = {threshold:.5g}")


def distribution(path: str, title: str, series: Dict[str, np.ndarray], threshold: Optional[float] = None,
                 error: Optional[np.ndarray] = None) -> str:
    """Value histograms (float vs quantized), marks, and the error histogram when given."""
    plt = _plt()
    ncols = 2 if error is not None else 1
    fig, axes = plt.subplots(1, ncols, figsize=(7 * ncols, 4.5))
    ax = axes[0] if ncols == 2 else axes
    for (label, values), color in zip(series.items(), ("tab:blue", "tab:orange", "tab:green")):
        _hist(ax, np.asarray(values, np.float64).reshape(-1), label, color)
    _marks(ax, np.concatenate([np.asarray(v, np.float64).reshape(-1) for v in series.values()]), threshold)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("value")
    ax.set_ylabel("count (log)")
    ax.legend(fontsize=8)
    if error is not None:
        _hist(axes[1], np.asarray(error, np.float64).reshape(-1), "quantized - float", "tab:red")
        axes[1].set_title("error distribution", fontsize=10)
        axes[1].set_xlabel("error")
        axes[1].legend(fontsize=8)
    return _save(fig, path)


def channel_boxes(path: str, title: str, per_channel: List[np.ndarray], threshold: Optional[float] = None) -> str:
    """One box per channel: red solid median, blue dashed mean (the seed's box plot)."""
    plt = _plt()
    rng = np.random.default_rng(0)
    data = []
    for v in per_channel:
        v = np.asarray(v, np.float64).reshape(-1)
        data.append(rng.choice(v, BOX_SAMPLE, replace=False) if v.size > BOX_SAMPLE else v)
    fig, ax = plt.subplots(figsize=(max(8, min(30, 0.18 * len(data))), 5))
    ax.boxplot(data, positions=list(range(len(data))), showmeans=True, meanline=True, flierprops={"markersize": 2, "alpha": 0.4},
               medianprops={"color": "red", "linestyle": "-"}, meanprops={"color": "blue", "linestyle": "--"})
    if threshold:
        ax.axhline(threshold, color="red", linestyle=":", linewidth=1)
        ax.axhline(-threshold, color="red", linestyle=":", linewidth=1)
    _ticks(ax, [str(i) for i in range(len(data))])
    ax.set_xlabel(f"channel ({len(data)} channels)")
    ax.set_ylabel("value")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def sensitivity_analysis(path: str, nodes: Sequence[str], single: Dict[str, float], cumulative: Dict[str, float]) -> str:
    """Blue dashed baseline 1, green x: only that node quantized, red line: that node and all before it float."""
    plt = _plt()
    labels = ["none"] + list(nodes)
    fig, ax = plt.subplots(figsize=(max(8, min(24, 0.4 * len(labels))), 5))
    ax.axhline(1.0, color="blue", linestyle="--", linewidth=1, label="float model (baseline)")
    ax.plot(range(1, len(labels)), [single[n] for n in nodes], "gx", markersize=8, label="only this node quantized")
    ax.plot(range(len(labels)), [cumulative[k] for k in labels], "r-", marker=".", label="this node and those before it float")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("cosine-similarity")
    ax.set_title("sensitivity analysis")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
