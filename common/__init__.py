"""What the host tools and the board runtime share.

The `.bin` container, tensor properties and their enums, input-type
conversions, compare metrics, the error vocabulary and version constants.
Imports only the standard library, numpy and protobuf.
"""
