"""The model tools that work on a compiled `.bin`: hb_model_info, hb_pack, hb_perf, hb_eval_preprocess.

Each tool is a library module (``model_info``, ``pack``, ``eval_preprocess``,
and the ``static_perf`` package for hb_perf's report of the X5 timing model,
bpuemu.host.compiler.timing); its click
command lives in bpuemu.host.cli and only parses, calls the library and
prints. hb_model_modifier's node removal is bpuemu.host.compiler.modifier
(makertbin's remove_node_type / remove_node_name run it too), and what the
tools share about a compiled model's plan is bpuemu.host.compiler.plan.
"""
