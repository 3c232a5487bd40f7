"""Generated protobuf and gRPC code for the board API and the `.bin` manifest.

Do not edit: regenerate with ``python scripts/gen_proto.py`` after changing
``proto/``; tests/test_proto_sync.py fails while this is stale.
"""
