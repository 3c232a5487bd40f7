"""hrt_boardd: the board daemon serving the emulated BPU runtime over gRPC.

``store`` keeps uploaded models by SHA-256; ``state`` is the board's library
API (load, infer, perf, limits); ``service`` adapts it to the proto;
``interceptor`` turns BpuEmuErrors into gRPC statuses once; ``server`` wires
the server with health and reflection; ``cli`` is the command.
"""
