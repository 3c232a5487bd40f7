"""The model tools that work on a compiled `.bin`: hb_model_info, hb_pack, hb_model_modifier, hb_perf.

Each tool is a library module (``model_info``, ``pack``, ``modifier``,
``perf``) with a thin click command beside it; the commands only parse,
call the library and print. ``plan`` holds what they share: reading tensors,
producers and consumers off a model's execution plan and its ONNX pieces.
"""
