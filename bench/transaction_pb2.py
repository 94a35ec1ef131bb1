"""The Protobuf form of the bench's values, for bench/registry_bench.py --format protobuf:

    syntax = "proto3";
    package bench;
    message Transaction { string id = 1; int64 amount = 2; }

Built from its descriptor as protoc's generated modules are (no protoc on the machine). Spark's
Python workers import it by name: registry_bench puts bench/ on their PYTHONPATH."""

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.internal import builder

_FIELD = descriptor_pb2.FieldDescriptorProto
_file = descriptor_pb2.FileDescriptorProto(name="bench/transaction.proto", package="bench",
                                           syntax="proto3")  # fmt: skip
_message = _file.message_type.add(name="Transaction")
_message.field.add(name="id", number=1, type=_FIELD.TYPE_STRING, label=_FIELD.LABEL_OPTIONAL,
                   json_name="id")  # fmt: skip
_message.field.add(name="amount", number=2, type=_FIELD.TYPE_INT64,
                   label=_FIELD.LABEL_OPTIONAL, json_name="amount")  # fmt: skip

DESCRIPTOR = descriptor_pool.Default().AddSerializedFile(_file.SerializeToString())
builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, globals())
builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, "transaction_pb2", globals())
Transaction: type  # set by the builder above
