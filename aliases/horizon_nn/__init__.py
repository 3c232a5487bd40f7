"""The seed's import path for the accuracy debug tool, as a thin alias of bpuemu.host.

Only ``horizon_nn.quantizer.debugger`` exists here: ``import horizon_nn.quantizer.debugger as dbg``.
"""
