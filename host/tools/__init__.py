"""The model tools that work on a compiled `.bin`: hb_model_info, hb_pack, hb_model_modifier, hb_perf.

Each tool is a library module (``model_info``, ``pack``, ``modifier``, and
the ``static_perf`` package for hb_perf's static latency model); its click
command lives in bpuemu.host.cli and only parses, calls the library and prints. ``plan`` holds what they share: reading tensors,
producers and consumers off a model's execution plan and its ONNX pieces.
"""
