"""An Avro value that reaches a sink unchanged (through a deduplication, say) is written as it
was read when it carries the schema id the sink writes: the same bytes, without encoding it
again. Anything else is serialized as before: a value a processor may have changed, bytes of
another schema id, a serde of another schema, the header format."""

from __future__ import annotations

from typing import Any

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.registry import serdes as registry_serdes
from streamplatform.serdes import SerdeContext, Serdes
from tests.registry.formats import AVRO_TX, AVRO_TX_V2

MINUTE = 60_000


# One subject per record type, not per topic: the input's producer and the sink register the
# schema under the same subject, so the mock registry gives them the same id (a real registry
# gives a schema the same id under every subject; the mock, one per subject).
STRATEGY = "RecordNameStrategy"


def _settings(scope: str, strategy: str = STRATEGY) -> dict[str, Any]:
    return {"application.id": "as-read", "schema.registry.url": f"mock://{scope}",
            "processing.guarantee": "exactly_once_v2",
            "value.subject.name.strategy": strategy}  # fmt: skip


def _dedup(source_serde: Any, sink_serde: Any | None = None, change: bool = False):
    b = StreamsBuilder()
    stream = b.stream("tx", Serdes.string(), source_serde).deduplicate_by_key_value(
        lambda key, tx: tx["id"], 10 * MINUTE
    )
    if change:  # a processor that may change the value: no longer as read
        stream = stream.map_values(lambda tx: tx)
    stream.to("out", Serdes.string(), sink_serde or source_serde)
    return b.build()


class _CountedWrites:
    """Counts the values AvroSerde is asked to encode for the sink's topic "out" (patched in
    for the test): each call of its fast path, which every serialization tries first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = registry_serdes.AvroSerde._fast_write

        def counted(serde: Any, value: Any, is_key: Any, topic: Any) -> Any:
            self.calls += topic == "out" and not is_key
            return original(serde, value, is_key, topic)

        monkeypatch.setattr(registry_serdes.AvroSerde, "_fast_write", counted)


def _pipe(driver: TopologyTestDriver, scope: str, schema: str, values: list[dict],
          first_timestamp: int = 0, strategy: str = STRATEGY) -> list[bytes]:  # fmt: skip
    """``values`` written with ``schema`` as the producer of "tx" would, and piped as those
    bytes; the bytes."""
    writer = Serdes.avro(schema, subject_name_strategy=strategy,
                         registry={"schema.registry.url": f"mock://{scope}"})  # fmt: skip
    topic = driver.create_input_topic("tx", Serdes.bytes(), Serdes.bytes())
    raw = []
    for index, value in enumerate(values):
        raw.append(writer.serialize(value, SerdeContext("tx", False, [])))
        topic.pipe_raw(b"k", raw[-1], timestamp=first_timestamp + index)
    return raw


def _out(driver: TopologyTestDriver) -> list[bytes]:
    return [r.value for r in
            driver.create_output_topic("out", Serdes.string(), Serdes.bytes())
            .read_records_to_list()]  # fmt: skip


def test_unchanged_values_are_written_as_read_and_read_back_equal(monkeypatch) -> None:
    writes = _CountedWrites(monkeypatch)
    serde = Serdes.avro(AVRO_TX)
    values = [{"id": n % 7, "amount": float(n)} for n in range(20)]  # 13 duplicates
    with TopologyTestDriver(_dedup(serde), _settings("as-read")) as driver:
        raw = _pipe(driver, "as-read", AVRO_TX, values)
        written = _out(driver)
    assert len(written) == 7
    # The first record written learns the sink's prefix through confluent's serializer; the
    # rest are the bytes read.
    assert written == [raw[n] for n in range(7)]
    # The sink was asked to encode the first value only: the other six went as read.
    assert writes.calls == 1
    assert [Serdes.avro(AVRO_TX, registry={"schema.registry.url": "mock://as-read"})
            .deserialize(data, SerdeContext("out", False, [])) for data in written
            ] == values[:7]  # fmt: skip


def test_a_processor_that_may_change_the_value_serializes_it(monkeypatch) -> None:
    writes = _CountedWrites(monkeypatch)
    serde = Serdes.avro(AVRO_TX)
    values = [{"id": n, "amount": float(n)} for n in range(5)]
    with TopologyTestDriver(_dedup(serde, change=True), _settings("changed")) as driver:
        raw = _pipe(driver, "changed", AVRO_TX, values)
        written = _out(driver)
    assert written == raw  # the same bytes, but each encoded again:
    assert writes.calls == 5


def test_bytes_of_another_schema_id_are_serialized_with_the_sinks(monkeypatch) -> None:
    """Records written with v1 and read with the v2 schema: their bytes carry v1's id and
    lack the field v2 adds, so the sink (v2) encodes them. Records written with v2 carry the
    sink's id and go as read."""
    writes = _CountedWrites(monkeypatch)
    serde = Serdes.avro(AVRO_TX_V2)
    with TopologyTestDriver(_dedup(serde), _settings("versions")) as driver:
        v2 = _pipe(driver, "versions", AVRO_TX_V2,
                   [{"id": 1, "amount": 1.0, "currency": "USD"},
                    {"id": 2, "amount": 2.0, "currency": "CHF"}])  # fmt: skip
        [v1] = _pipe(driver, "versions", AVRO_TX, [{"id": 3, "amount": 3.0}], 5)
        written = _out(driver)
    assert written[:2] == v2
    assert writes.calls == 2  # the first v2 record, and the v1 one
    assert written[2][:5] == v2[0][:5] != v1[:5]  # the sink's id, not v1's
    reader = Serdes.avro(AVRO_TX_V2, registry={"schema.registry.url": "mock://versions"})
    assert reader.deserialize(written[2], SerdeContext("out", False, [])) == {
        "id": 3, "amount": 3.0, "currency": "EUR"}  # fmt: skip


def test_bytes_whose_schema_id_is_not_the_sinks_are_serialized(monkeypatch) -> None:
    """One subject per topic in the mock registry: the sink's id is not the input's."""
    writes = _CountedWrites(monkeypatch)
    serde = Serdes.avro(AVRO_TX)
    values = [{"id": n, "amount": float(n)} for n in range(4)]
    with TopologyTestDriver(_dedup(serde), _settings("ids", "TopicNameStrategy")) as driver:
        raw = _pipe(driver, "ids", AVRO_TX, values, strategy="TopicNameStrategy")
        written = _out(driver)
    assert [data[:5] for data in written] == [written[0][:5]] * 4 != [raw[0][:5]] * 4
    assert [data[5:] for data in written] == [data[5:] for data in raw]
    assert writes.calls == 4


def test_serdes_that_would_not_write_the_bytes_back_serialize() -> None:
    v1, v2 = Serdes.avro(AVRO_TX), Serdes.avro(AVRO_TX_V2)
    assert v1.writes_back_reads_of(Serdes.avro(AVRO_TX))
    assert not v2.writes_back_reads_of(v1)  # another schema
    assert not v2.writes_back_reads_of(Serdes.avro(AVRO_TX_V2, reader_schema=AVRO_TX))
    assert not Serdes.avro(AVRO_TX_V2, reader_schema=AVRO_TX).writes_back_reads_of(v2)
    assert not v1.writes_back_reads_of(Serdes.json())
    assert not Serdes.avro().writes_back_reads_of(Serdes.avro())  # no schema: the writer's
    with_objects = Serdes.avro(AVRO_TX, from_dict=lambda d, ctx: d)
    assert not v1.writes_back_reads_of(with_objects)
