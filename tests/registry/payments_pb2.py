# Generated from the FileDescriptorProto below, as protoc's Python output is (no protoc on
# this machine): the messages of the registry tests. The .proto it stands for:
#
#   syntax = "proto3";
#   package streamplatform.tests;
#   message Payment { int64 id = 1; double amount = 2; }
#   message Enriched { int64 id = 1; double amount = 2; double eur = 3; }
#   message Rate { double rate = 1; }
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf.internal import builder as _builder

DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(
    b'\n\x1dtests/registry/payments.proto\x12\x14streamplatform.tests"%\n\x07Payment\x12\n\n\x02id\x18\x01 \x01(\x03\x12\x0e\n\x06amount\x18\x02 \x01(\x01"3\n\x08Enriched\x12\n\n\x02id\x18\x01 \x01(\x03\x12\x0e\n\x06amount\x18\x02 \x01(\x01\x12\x0b\n\x03eur\x18\x03 \x01(\x01"\x14\n\x04Rate\x12\x0c\n\x04rate\x18\x01 \x01(\x01b\x06proto3'
)
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, globals())
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, "tests.registry.payments_pb2", globals())
