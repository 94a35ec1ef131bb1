"""End to end with Avro values: Kafka -> dedup -> Delta, ours with Avro values against ours with
JSON values and against Spark's native ``from_avro``, same run, same data.

e2e_bench's records (N, default 2M, 20% duplicates, 3% out of order) go into two 3-partition
topics on the local broker: as JSON (e2e_bench's ``produce``) and as Avro in Confluent's wire
format (magic byte 0, the schema id, then the Avro body) for the record
``{"id": string, "amount": long}``, with the schema registered in a local Schema Registry
(``streamplatform.registry.local_registry.LocalRegistry``, Apicurio). Three runs on
``local[2]``, each first once on other data of the same size (``--warmup-records``, default
``--records``), then ``--repeats`` times in rotating order:

- ours JSON: e2e_bench's job, ``deduplicate_by_key_value(id, 10 min)`` into a Delta sink,
  ``processing.guarantee=exactly_once_v2``, one batch;
- ours Avro: the same topology with ``Serdes.avro(SCHEMA)`` values (the sink writes them with
  it too, registering the sink's subject), ``schema.registry.url`` set;
- native Avro: Structured Streaming Kafka source -> strip the 5-byte Confluent prefix ->
  ``from_avro(..., SCHEMA)`` (``pyspark.sql.avro.functions``; the spark-avro jar comes with
  ``make setup``) -> ``withWatermark`` -> ``dropDuplicatesWithinWatermark([key, id])`` -> Delta,
  ``trigger(availableNow=True)``.

``--format protobuf`` and ``--format json_schema``: the same with Protobuf values (the
message ``bench.Transaction {string id = 1; int64 amount = 2;}``, bench/transaction_pb2.py)
or JSON Schema values (an object of a string ``id`` and an integer ``amount``), written by our
serde. Their native peers: ``from_protobuf`` (the spark-protobuf jar; when Maven Central does
not serve it here, the native run is left out and the bench says so) and ``from_json`` on the
bytes after the 5-byte prefix, with the schema as a DDL string.

Prints records/s of each (median, spread), the ratios ours-Avro / ours-JSON and ours-Avro /
native-Avro, the execution path ours took, and the rows each wrote (ours JSON and ours Avro
must write the same: it fails otherwise). Before the Spark runs, the per-record cost of the
serdes in this process (``--serde-records`` records, default 100k): JSON's against Avro's,
and Avro's split into our serde's wrapper, confluent-kafka's ``AvroDeserializer`` /
``AvroSerializer`` and fastavro itself. Without a Java 21+ for the local registry
(docs/schema-registry.md) it says so and exits 0, as the registry tests are skipped.

    .venv/bin/python bench/registry_bench.py [--records 2000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_bench  # noqa: E402
from e2e_bench import (  # noqa: E402
    INTERVAL_MS,
    PARTITIONS,
    REPO,
    bench_records,
    dedup_topology,
    job_config,
    kafka_stream,
    paths_of,
    produce,
    produce_all,
    run_to_the_end,
)

from streamplatform import StreamingJob, StreamsBuilder, Topology  # noqa: E402
from streamplatform.kafka import LocalBroker, TopicSpec, create_topics  # noqa: E402
from streamplatform.registry.local_registry import (  # noqa: E402
    LocalRegistry,
    NoSuitableJava,
    registry_java,
)
from streamplatform.serdes import SerdeContext, Serdes, deserialize_all  # noqa: E402
from streamplatform.spark import spark_session  # noqa: E402

# The Avro form of bench_records' JSON values ({"id": "tx-...", "amount": n}).
SCHEMA = json.dumps({
    "type": "record", "name": "Transaction", "namespace": "bench",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "long"}],
})  # fmt: skip
SINK = "deduplicated"
# The same values as JSON Schema: what our serde checks them against.
JSON_SCHEMA = json.dumps({
    "type": "object", "title": "Transaction",
    "properties": {"id": {"type": "string"}, "amount": {"type": "integer"}},
    "required": ["id", "amount"],
})  # fmt: skip
FORMAT_NAMES = {"avro": "Avro", "protobuf": "Protobuf", "json_schema": "JSON Schema"}
NATIVE_READERS = {"avro": "from_avro", "protobuf": "from_protobuf", "json_schema": "from_json"}
RUNS = ("json", "avro", "native")  # "avro": the registry format of --format


def labels(fmt: str) -> dict[str, str]:
    name = FORMAT_NAMES[fmt]
    return {
        "json": "ours   JSON values, StreamingJob exactly_once_v2 -> Delta",
        "avro": f"ours   {name} values, StreamingJob exactly_once_v2 -> Delta",
        "native": f"native {NATIVE_READERS[fmt]} + dropDuplicatesWithinWatermark -> Delta",
    }


def registry_serde(fmt: str, **options: Any) -> Any:
    """Our value serde of the bench's values in ``fmt``."""
    if fmt == "protobuf":
        from transaction_pb2 import Transaction

        return Serdes.protobuf(Transaction, **options)
    if fmt == "json_schema":
        return Serdes.json_schema(JSON_SCHEMA, **options)
    return Serdes.avro(SCHEMA, **options)


def _tx_id(key: str, value: Any) -> str:
    return value["id"] if isinstance(value, dict) else value.id  # a dict, or a Transaction


def avro_topology(topic: str, sink: str = SINK, fmt: str = "avro") -> Topology:
    """e2e_bench's dedup_topology with values in ``fmt`` (read and written by the registry
    serde)."""
    b = StreamsBuilder()
    stream = b.stream(topic, Serdes.string(), registry_serde(fmt))
    stream.deduplicate_by_key_value(_tx_id, INTERVAL_MS).to(sink)
    return b.build()


def produce_registry(settings: dict, registry_url: str, fmt: str, topic: str, records: int,
                     seed: int = 5) -> None:  # fmt: skip
    """bench_records into ``topic`` as ``fmt`` values written by our serde (its fast path
    after the first value)."""
    if fmt == "avro":
        produce_avro(settings, registry_url, topic, records, seed)
        return
    serde = registry_serde(fmt, registry={"schema.registry.url": registry_url})
    context = SerdeContext(topic, False, [])
    if fmt == "protobuf":
        from transaction_pb2 import Transaction

        def value_of(value: dict) -> Any:
            return Transaction(id=value["id"], amount=value["amount"])
    else:
        value_of = dict
    loads, serialize = json.loads, serde.serialize
    produce_all(settings, ((topic, key, serialize(value_of(loads(value)), context), timestamp)
                           for key, value, timestamp in bench_records(records, seed)))  # fmt: skip


def avro_encoder(registry_url: str, topic: str) -> Callable[[dict], bytes]:
    """Encodes a value as our serde writes it into ``topic``: magic byte, schema id, Avro body.

    Our serde (confluent-kafka's AvroSerializer underneath) costs 7.5 us a record on a quiet
    machine here (22 us with tests running beside it), fastavro alone 2-4 us: for 2M records,
    15-35 s of producing saved. So the serde writes the first 1,000 values (the first
    registers the schema under ``<topic>-value`` and gives its id) and the rest are fastavro's
    ``schemaless_writer`` behind the same 5-byte prefix; the first 1,000 are checked to be the
    same bytes both ways."""
    import fastavro

    serde = Serdes.avro(SCHEMA)
    serde.configure({"schema.registry.url": registry_url})
    parsed = fastavro.parse_schema(json.loads(SCHEMA))
    writer = fastavro.schemaless_writer
    prefix: list[bytes] = []
    checked = [0]

    def encode(value: dict) -> bytes:
        if checked[0] < 1000:
            checked[0] += 1
            data = serde.serialize(value, SerdeContext(topic, False, []))
            assert data is not None
            if not prefix:
                prefix.append(data[:5])
            out = io.BytesIO()
            out.write(prefix[0])
            writer(out, parsed, value)
            assert out.getvalue() == data, "fastavro's bytes differ from the serde's"
            return data
        out = io.BytesIO()
        out.write(prefix[0])
        writer(out, parsed, value)
        return out.getvalue()

    return encode


def produce_avro(settings: dict, registry_url: str, topic: str, records: int, seed: int = 5):
    """bench_records (same keys, ids, amounts, timestamps as e2e_bench's ``produce``) into
    ``topic`` as Avro in Confluent's wire format."""
    encode = avro_encoder(registry_url, topic)
    loads = json.loads
    produce_all(settings, ((topic, key, encode(loads(value)), timestamp)
                           for key, value, timestamp in bench_records(records, seed)))  # fmt: skip


def run_ours(spark, settings, registry_url, which, topic, tmp: Path, cap: int, name: str,
             fmt: str = "avro"):  # fmt: skip
    """Ours (JSON or ``fmt`` values) on ``topic``: seconds, rows in the Delta sink, paths."""
    if which == "json":
        topology, extra = dedup_topology(topic, SINK), {}
    else:
        topology, extra = avro_topology(topic, SINK, fmt), {"schema.registry.url": registry_url}
    config = job_config(settings, tmp, name, cap, **extra)
    job = StreamingJob(topology, config, spark=spark, delta_sinks=[SINK])
    elapsed, results = run_to_the_end(job)
    rows = spark.read.format("delta").load(str(tmp / "delta" / name / SINK)).count()
    return elapsed, rows, paths_of(results)


def native_available(fmt: str) -> str | None:
    """Why the native peer of ``fmt`` cannot run here, or None."""
    if fmt == "protobuf" and not any((REPO / ".jvm" / "spark").glob("spark-protobuf_*.jar")):
        return (
            "the spark-protobuf jar (from_protobuf) is not in .jvm/spark: Maven Central as "
            "reached from this machine does not serve org.apache.spark:spark-protobuf_2.13"
        )
    return None


def run_native_avro(spark, settings, topic: str, tmp: Path, name: str, fmt: str = "avro"
                    ) -> tuple[float, int]:  # fmt: skip
    from pyspark.sql import functions as F

    body = F.expr("substring(value, 6, length(value) - 5)")
    if fmt == "json_schema":
        decoded = F.from_json(body.cast("string"), "id STRING, amount BIGINT")
    elif fmt == "protobuf":
        from google.protobuf import descriptor_pb2
        from pyspark.sql.protobuf.functions import from_protobuf
        from transaction_pb2 import DESCRIPTOR

        files = descriptor_pb2.FileDescriptorSet()
        DESCRIPTOR.CopyToProto(files.file.add())
        # Past the 5-byte prefix, Confluent's message indexes: one 0 byte for the first message.
        body = F.expr("substring(value, 7, length(value) - 6)")
        decoded = from_protobuf(body, "bench.Transaction",
                                binaryDescriptorSet=files.SerializeToString())  # fmt: skip
    else:
        from pyspark.sql.avro.functions import from_avro

        decoded = from_avro(body, SCHEMA)
    stream = (
        kafka_stream(spark, settings, topic)
        .select(
            F.col("key").cast("string").alias("key"),
            "value",
            decoded.alias("tx"),
            "timestamp", "partition", "offset",
        )
        .select("key", "value", "tx.id", "tx.amount", "timestamp", "partition", "offset")
        .withWatermark("timestamp", f"{INTERVAL_MS // 1000} seconds")
        .dropDuplicatesWithinWatermark(["key", "id"])
    )  # fmt: skip
    return e2e_bench.run_available_now(spark, stream, tmp, name)


def print_ratio(label: str, ours: list[float], theirs: list[float]) -> None:
    """e2e_bench's print_ratio with its label: records/s of ``ours`` over ``theirs`` (medians),
    and per run of the same repeat."""
    ratios = sorted(t / o for o, t in zip(ours, theirs, strict=True))
    print(f"ratio {label} (records/s): {statistics.median(theirs) / statistics.median(ours):.2f}x "
          f"(per repeat: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


def _per_record_us(function: Callable[[], object], records: int, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best / records * 1e6


def serde_breakdown(registry_url: str, topic: str, records: int) -> None:
    """Per-record cost of the value serdes in this process, best of 3 (module docstring)."""
    import fastavro
    import orjson
    from confluent_kafka.schema_registry import topic_subject_name_strategy
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from streamplatform.registry.serdes import registry_client
    from streamplatform.serdes import deserializer_for, serializer_for

    registry = {"schema.registry.url": registry_url}
    texts = [value.encode() for _, value, _ in bench_records(records)]
    values = [orjson.loads(text) for text in texts]
    encode = avro_encoder(registry_url, topic)
    avros = [encode(value) for value in values]
    parsed = fastavro.parse_schema(json.loads(SCHEMA))
    reader_parsed = fastavro.parse_schema(json.loads(SCHEMA))  # a separate copy, as confluent's

    json_serde, avro_serde = Serdes.json(), Serdes.avro(SCHEMA)
    avro_serde.configure(registry)
    read_json = deserializer_for(json_serde, topic, False)
    read_avro = deserializer_for(avro_serde, topic, False)
    write_avro = serializer_for(avro_serde, SINK, False)
    client = registry_client(registry)
    confluent_reader = AvroDeserializer(
        client, SCHEMA, conf={"subject.name.strategy": topic_subject_name_strategy}
    )
    confluent_writer = AvroSerializer(client, SCHEMA, conf={"auto.register.schemas": True})
    in_ctx = SerializationContext(topic, MessageField.VALUE, [])
    out_ctx = SerializationContext(SINK, MessageField.VALUE, [])
    assert read_avro(avros[0], []) == values[0] and confluent_reader(avros[0], in_ctx) == values[0]
    write_avro(values[0], [])  # registers the sink's subject
    chunks = [texts[i : i + 10_000] for i in range(0, records, 10_000)]
    avro_chunks = [avros[i : i + 128] for i in range(0, records, 128)]  # source_records.py's
    reader, writer, BytesIO = fastavro.schemaless_reader, fastavro.schemaless_writer, io.BytesIO

    def fastavro_write(value: dict) -> bytes:
        out = BytesIO()
        out.write(b"\0\0\0\0\1")
        writer(out, parsed, value)
        return out.getvalue()

    read = {
        "JSON: Serdes.json() via deserializer_for (one record at a time)":
            lambda: [read_json(t, None) for t in texts],
        "JSON: deserialize_all in 10k chunks (what the task uses)":
            lambda: [deserialize_all(json_serde, chunk) for chunk in chunks],
        "Avro: deserialize_all in 128-record chunks (what the task uses: the C reader)":
            lambda: [deserialize_all(avro_serde, chunk) for chunk in avro_chunks],
        "Avro: Serdes.avro() via deserializer_for (one record at a time)":
            lambda: [read_avro(a, []) for a in avros],
        "Avro: confluent-kafka AvroDeserializer called directly":
            lambda: [confluent_reader(a, in_ctx) for a in avros],
        "Avro: fastavro.schemaless_reader(writer, reader), as confluent calls it":
            lambda: [reader(BytesIO(a[5:]), parsed, reader_parsed) for a in avros],
        "Avro: fastavro.schemaless_reader(writer) alone":
            lambda: [reader(BytesIO(a[5:]), parsed, None) for a in avros],
    }  # fmt: skip
    write = {
        "JSON: none, the sink writes the bytes as read (AS_READ_SERDES)": None,
        "Avro: Serdes.avro() via serializer_for (what the sink uses)":
            lambda: [write_avro(v, []) for v in values],
        "Avro: confluent-kafka AvroSerializer called directly":
            lambda: [confluent_writer(v, out_ctx) for v in values],
        "Avro: fastavro.schemaless_writer + 5-byte prefix":
            lambda: [fastavro_write(v) for v in values],
    }  # fmt: skip
    print(f"per-record cost of the value serdes, {records:,} records, best of 3, this process:")
    for title, cases in (("read", read), ("write", write)):
        for label, function in cases.items():
            cost = "-" if function is None else f"{_per_record_us(function, records):6.2f} us"
            print(f"  {title:5s} {label:72s} {cost:>9s}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, rotating")
    parser.add_argument("--warmup-records", type=int, help="default: --records")
    parser.add_argument("--serde-records", type=int, default=100_000,
                        help="records for the serdes' per-record costs (0: skip)")  # fmt: skip
    parser.add_argument("--format", choices=tuple(FORMAT_NAMES), default="avro",
                        help="the registry format of the values")  # fmt: skip
    args = parser.parse_args()
    fmt = args.format
    # Spark's Python workers import the Protobuf message class by its module (bench/).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")])
    )
    missing_native = native_available(fmt)
    runs_here = RUNS if missing_native is None else RUNS[:2]
    if args.warmup_records is None:
        args.warmup_records = args.records
    try:
        registry_java()
    except NoSuitableJava as error:  # as the registry tests are skipped: `make bench` goes on
        print(f"skipped: {error}")
        return
    # Spark's Python workers cannot import bench/: e2e_bench's topology (its id lambda)
    # travels by value, as this script's does.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(e2e_bench)
    runs: dict[str, list[float]] = {which: [] for which in runs_here}
    rows: dict[str, set[int]] = {which: set() for which in runs_here}
    paths: dict[str, set[str]] = {"json": set(), "avro": set()}
    produced: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as directory:
        tmp = Path(directory)
        with LocalBroker(tmp / "broker") as broker, LocalRegistry(tmp / "registry") as registry:
            settings = {"bootstrap.servers": broker.bootstrap_servers}
            url = registry.url
            topics = ("json", "avro", "warmup-json", "warmup-avro", "serdes-avro")
            create_topics(settings, [TopicSpec(t, PARTITIONS) for t in topics])
            for prefix, count, seed in (
                ("", args.records, 5),
                ("warmup-", args.warmup_records, 11),
            ):
                started = time.perf_counter()
                produce(settings, f"{prefix}json", count, seed)
                produced[f"{prefix}json"] = time.perf_counter() - started
                started = time.perf_counter()
                produce_registry(settings, url, fmt, f"{prefix}avro", count, seed)
                produced[f"{prefix}avro"] = time.perf_counter() - started
            took = ", ".join(f"{topic} {seconds:.1f} s" for topic, seconds in produced.items())
            print(f"produced: {took}", flush=True)
            if args.serde_records and fmt == "avro":
                serde_breakdown(url, "serdes-avro", args.serde_records)
            spark = spark_session(master="local[2]", app_name="registry-bench")
            try:

                def run(which: str, prefix: str, name: str) -> tuple[float, int]:
                    if which == "native":
                        return run_native_avro(spark, settings, f"{prefix}avro", tmp, name, fmt)
                    cap = args.records if not prefix else args.warmup_records
                    topic = f"{prefix}{which}"
                    seconds, written, used = run_ours(
                        spark, settings, url, which, topic, tmp, cap, name, fmt
                    )
                    if not prefix:
                        paths[which] |= used
                    return seconds, written

                for which in runs_here:  # the JVM's class loading and JIT charged to none
                    seconds, written = run(which, "warmup-", f"warmup-{which}")
                    print(f"  warm-up {which:6s}: {args.warmup_records / seconds:>9,.0f} "
                          f"records/s ({seconds:.1f} s, {written:,} rows)", flush=True)  # fmt: skip
                orders = [RUNS, ("native", "avro", "json"), ("avro", "json", "native")]
                for repeat in range(args.repeats):
                    for which in orders[repeat % len(orders)]:  # load from others drifts
                        if which not in runs_here:
                            continue
                        seconds, written = run(which, "", f"{which}-{repeat}")
                        runs[which].append(seconds)
                        rows[which].add(written)
                        print(f"  run {repeat} {which:6s}: {args.records / seconds:>9,.0f} "
                              f"records/s ({seconds:.1f} s, {written:,} rows)",
                              flush=True)  # fmt: skip
            finally:
                spark.stop()
    n = args.records
    print(f"{n:,} records, {PARTITIONS} partitions, local[2], median of {args.repeats} runs "
          "each (rotating order, after a warm-up of each)")  # fmt: skip
    path_of = {
        "json": ", ".join(sorted(paths["json"])),
        "avro": ", ".join(sorted(paths["avro"])),
        "native": "Structured Streaming, availableNow",
    }
    name = FORMAT_NAMES[fmt]
    for which in runs_here:
        median = statistics.median(runs[which])
        counts = " or ".join(f"{count:,}" for count in sorted(rows[which]))
        print(f"{labels(fmt)[which]}: {n / median:>9,.0f} records/s ({median:.1f} s, runs "
              f"{min(runs[which]):.1f}-{max(runs[which]):.1f} s; {counts} rows; "
              f"path {path_of[which]})")  # fmt: skip
    print_ratio(f"ours {name} / ours JSON", runs["avro"], runs["json"])
    if missing_native is not None:
        print(f"native {NATIVE_READERS[fmt]}: not run, {missing_native}")
    else:
        print_ratio(f"ours {name} / native {name}", runs["avro"], runs["native"])
        if rows["native"] != rows["avro"]:
            print(f"note: native wrote {sorted(rows['native'])} rows, ours {sorted(rows['avro'])}")
    if len(rows["json"] | rows["avro"]) != 1:
        raise SystemExit(
            f"FAILED: ours JSON wrote {sorted(rows['json'])} rows and ours {name} "
            f"{sorted(rows['avro'])} from the same records: they must be one and the same count"
        )


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
