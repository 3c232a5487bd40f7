"""Version constants checked by the board handshake and the `.bin` reader."""

__version__ = "0.1.0"

#: Board gRPC API major version (proto package bpuemu.board.v1).
API_VERSION = 1

#: `.bin` container format. Readers refuse a newer major; minors are additive.
FORMAT_MAJOR = 1
FORMAT_MINOR = 0

#: What the runtime reports as its version (the real board's "hbdk runtime").
RUNTIME_VERSION = f"bpuemu-runtime {__version__}"
