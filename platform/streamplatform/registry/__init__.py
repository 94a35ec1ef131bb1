"""Schema Registry support: the registry serdes (``Serdes.avro``, ``Serdes.protobuf``,
``Serdes.json_schema``, in :mod:`streamplatform.registry.serdes`) and a local registry for
tests and trying things out (:mod:`streamplatform.registry.local_registry`)."""
