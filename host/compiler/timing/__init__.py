"""The X5 timing model, part of the compile step (makertbin stores its times in the `.bin`).

``x5``: the parameter table and every cost formula (bench/x5_fit.py fits it);
``strategy``: the compile_mode / optimize_level a model is costed for;
``layers``: the layers of a BPU subgraph read off its ONNX piece (OPs, shapes, DDR bytes);
``estimate``: per plan step and per model (``estimate_model``), makertbin's
    estimate line and advice, and ``annotate``, which stores each step's
    modeled X5 time in the `.bin`.

hb_perf's report of these figures is bpuemu.host.tools.static_perf, above.
"""
