"""The x86 development host: conversion (hb_mapper), model tools, the verifier, board clients.

May import bpuemu.board (the runtime is the host's x86 simulator) and
bpuemu.common; nothing on the board side imports this package.

The host reads top-down: each package imports only packages below it
(``.importlinter``'s layers contract, tests/test_architecture.py), so a
reader follows a command downward from its click module to the graph toolkit:

    cli                              the commands: parse, call the library, print
    samples                          sample models, projects and a local daemon (demo, tests, benches)
    verifier | debugger | tools | data | hbm_infer   hb_verifier, the accuracy debugger, the .bin tools,
                                     horizon_tc_ui.data, an .hbm on a board from Python (hbm_infer)
    mapper | hb_runtime              hb_mapper checker / makertbin / infer: a config to a conversion; the J6
                                     host inference API (HBRuntime: .onnx, .bc, .hbm)
    convert | hb_onnxruntime         makertbin's stages and pipeline; the seeds' ONNX inference API
    quant                            calibration and quantization (reads the compiler's BPU op table)
    compiler                         the BPU model: op table, placement, partition, compile, plan, node removal,
                                     the X5 timing model (``timing``)
    caffe | config | clients         Caffe -> ONNX, the yaml, the SSH board transport
    onnxgraph                        the ONNX graph toolkit and the one session opener

Packages joined by ``|`` do not import each other. The quantizer sits above
the compiler because it asks the op table which nodes the BPU runs, while
compiling a quantized model needs nothing of how it was quantized.

``from bpuemu.host import HB_ONNXRuntime`` is the seeds' inference API for the
conversion's ONNX artifacts.
"""


def __getattr__(name):  # lazy: importing bpuemu.host stays cheap
    if name == "HB_ONNXRuntime":
        from bpuemu.host.hb_onnxruntime import HB_ONNXRuntime

        return HB_ONNXRuntime
    raise AttributeError(name)
