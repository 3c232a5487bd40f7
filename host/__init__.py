"""The x86 development host: conversion (hb_mapper), model tools, the verifier, board clients.

May import bpuemu.board (the runtime is the host's x86 simulator) and
bpuemu.common; nothing on the board side imports this package.

``from bpuemu.host import HB_ONNXRuntime`` is the seeds' inference API for the
conversion's ONNX artifacts.
"""


def __getattr__(name):  # lazy: importing bpuemu.host stays cheap
    if name == "HB_ONNXRuntime":
        from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

        return HB_ONNXRuntime
    raise AttributeError(name)
