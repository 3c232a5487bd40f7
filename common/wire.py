"""Constants of the board protocol that both ends must agree on.

The messages themselves are defined in proto/bpuemu/board/v1/board.proto.
"""

#: Port hrt_boardd listens on when --listen gives none, and clients assume.
DEFAULT_PORT = 9473

#: Upload chunk size: streaming in 1 MiB chunks measured ~2.5x faster than
#: one large unary message on this class of machine (DESIGN.md).
UPLOAD_CHUNK_BYTES = 1 << 20

#: Largest single message either side accepts (an infer request or reply
#: carrying tensors). Larger requests fail with RESOURCE_EXHAUSTED.
MAX_MESSAGE_BYTES = 256 << 20

#: Metadata key carrying the caller's token (see hrt_boardd --token-file).
TOKEN_METADATA_KEY = "authorization"

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


def split_target(target: str, default_port: int = DEFAULT_PORT) -> tuple:
    """'host[:port]' -> (host, port); IPv6 literals go in brackets: [::1]:9473."""
    target = target.strip()
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif target.count(":") == 1:
        host, port = target.split(":")
    else:
        host, port = target, ""
    if not host:
        raise ValueError(f"'{target}' names no host")
    if port and not port.isdigit():
        raise ValueError(f"'{target}': port '{port}' is not a number")
    return host, int(port) if port else default_port


def join_target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
