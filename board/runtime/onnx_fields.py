"""Message classes for a few fields of onnx.proto, for board code that reads ONNX pieces without onnx.

The onnx package is not on the board (bpuemu.board never imports it). A reader
names the fields it needs, with onnx.proto's field numbers, as a schema:

    message -> [(field, number, scalar type or message name, label), ...]

and ``message_classes`` builds protobuf classes for it from a descriptor, in a
package of the reader's own, so two readers (and onnx itself, on a host that
loads the board runtime) never clash. Protobuf keeps every field a schema does
not name as it read it, byte for byte.
"""
from typing import Dict, List, Tuple, Union

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

FIELD = descriptor_pb2.FieldDescriptorProto
STRING, BYTES, INT32, INT64 = FIELD.TYPE_STRING, FIELD.TYPE_BYTES, FIELD.TYPE_INT32, FIELD.TYPE_INT64
ONE, MANY = FIELD.LABEL_OPTIONAL, FIELD.LABEL_REPEATED

Schema = Dict[str, List[Tuple[str, int, Union[int, str], int]]]


def message_classes(package: str, schema: Schema) -> Dict[str, type]:
    """The schema's message classes by name, in the proto package ``package``."""
    f = descriptor_pb2.FileDescriptorProto(name=f"{package}.proto", package=package, syntax="proto2")
    for name, fields in schema.items():
        msg = f.message_type.add(name=name)
        for field, number, kind, label in fields:
            spec = msg.field.add(name=field, number=number, label=label)
            if isinstance(kind, str):
                spec.type, spec.type_name = FIELD.TYPE_MESSAGE, f".{package}.{kind}"
            else:
                spec.type = kind
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}")) for name in schema}
