"""Version constants of the wire contract: the board handshake, the `.bin` reader, ``hrt_model_exec --json``."""

__version__ = "0.1.0"

#: Board gRPC API major version (proto package bpuemu.board.v1).
API_VERSION = 1

#: `.bin` container format. Readers refuse a newer major; minors are additive.
FORMAT_MAJOR = 1
FORMAT_MINOR = 1

#: ``hrt_model_exec --json`` document version (bpuemu.common.exec_json). Readers
#: refuse a newer one; fields are only ever added within a version.
EXEC_JSON_VERSION = 1

#: What the runtime reports as its version (the real board's "hbdk runtime").
RUNTIME_VERSION = f"bpuemu-runtime {__version__}"
