"""sensitivity_analysis: what quantizing the sensitive nodes alone, or keeping them float, does.

The sensitive nodes are ``sensitive_nodes`` as given, or the ordinary nodes
whose node sensitivity (output cosine with only that node quantized, on
``data_num`` samples) is below ``pick_threshold``, most sensitive first. For
each such node n_i:

* single[n_i]: output cosine with only n_i quantized (the green crosses);
* cumulative[n_i]: output cosine with n_1..n_i float and everything else
  quantized (the red line); cumulative['none'] is the whole calibrated model.

Figure: ``sensitivity_analysis.png`` in save_dir.
"""
import os
from typing import Dict, List, Optional, Sequence

from bpuemu.common.compare import METRICS
from bpuemu.host.debugger import plots
from bpuemu.host.debugger.data import CalibratedModel, Sample, load_data, load_model
from bpuemu.host.debugger.engine import Evaluator, all_but, progress
from bpuemu.host.debugger.sensitivity import candidates_for, rank

FILE = "sensitivity_analysis.png"
COSINE = METRICS["cosine-similarity"]


def pick_sensitive(sensitivity: Dict[str, Dict[str, float]], pick_threshold: float) -> List[str]:
    return [n for n, v in sensitivity.items() if v[COSINE.name] < pick_threshold]


def analyse(cm: CalibratedModel, samples: Sequence[Sample], nodes: Sequence[str],
            save_dir: Optional[str] = None, evaluator: Optional[Evaluator] = None,
            with_outputs: bool = False) -> Dict[str, Dict[str, float]]:
    """``with_outputs``: a node also brings the quantization of the model output it makes
    (runall ranks such nodes by it, see runall.ranked_nodes)."""
    ev = evaluator or Evaluator(cm, samples)
    single: Dict[str, float] = {}
    cumulative: Dict[str, float] = {"none": ev.score(None, [COSINE])[COSINE.name]}
    kept_float: List[str] = []
    for n in progress(nodes, "sensitivity analysis (nodes)"):
        mine = cm.calibrations_of(n) + (cm.output_calibrations(n) if with_outputs else [])
        single[n] = ev.score(mine, [COSINE])[COSINE.name]
        kept_float += mine
        cumulative[n] = ev.score(all_but(cm, kept_float), [COSINE])[COSINE.name]
    if save_dir is not None and nodes:
        plots.sensitivity_analysis(os.path.join(save_dir, FILE), nodes, single, cumulative)
    return {"single": single, "cumulative": cumulative}


def sensitivity_analysis(model_or_file=None, calibrated_data=None, pick_threshold: float = 0.999, data_num: int = 1,
                         sensitive_nodes: Optional[Sequence[str]] = None, save_dir: Optional[str] = None
                         ) -> Dict[str, Dict[str, float]]:
    """Returns {'single': {node: cosine}, 'cumulative': {'none' | node: cosine}}; draws the figure in save_dir
    (default: the current directory)."""
    cm = load_model(model_or_file)
    data = load_data(calibrated_data, cm)
    samples = data.first(data_num)
    ev = Evaluator(cm, samples)
    if sensitive_nodes:
        cm.check_names(sensitive_nodes, "sensitive node")
        nodes = list(dict.fromkeys(sensitive_nodes))
    else:
        sens = rank(cm, samples, [COSINE], candidates_for(cm, "node", None), evaluator=ev)
        nodes = pick_sensitive(sens, pick_threshold)
    return analyse(cm, samples, nodes, save_dir if save_dir is not None else ".", ev)
