"""The board: the emulated BPU runtime, the gRPC daemon hrt_boardd, and hrt_model_exec.

Installable without the host side (no onnx, paramiko or yaml). Never imports
bpuemu.host.
"""
