"""KTable.filter's old values, ported from Kafka Streams' own KTableFilterTest (apache/kafka
streams/src/test/java/org/apache/kafka/streams/kstream/internals/) with its inputs and expected
outputs unchanged: doTestNotSendingOldValue (shouldNotSendOldValuesWithoutMaterialization),
doTestSendingOldValue (shouldSendOldValuesWhenEnabledWithoutMaterialization) and
doTestSkipNullOnMaterialization (shouldSkipNullToRepartitionWithoutMaterialization).

Kafka Streams' MockApiProcessor sees ``Change(new, old)``; our tables forward new values
only, so each expected record here is the Java test's key, new value and timestamp, read from
the filtered table's ``to_stream()``. ``enableSendingOldValues`` is not public API (in Kafka
Streams either): a ``group_by`` downstream asks for old values, as in
shouldSkipNullToRepartitionWithoutMaterialization. The record cache is off, as the Java test
sets it (``CACHE_MAX_BYTES_BUFFERING_CONFIG`` 0)."""

from __future__ import annotations

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes

CONFIG = {"application.id": "ktable-filter", "statestore.cache.max.bytes": 0}
INPUT = [("A", 1, 5), ("B", 1, 10), ("C", 1, 15), ("A", 2, 15), ("B", 2, 8), ("A", 3, 20),
         ("A", None, 10), ("B", None, 20)]  # fmt: skip


def _even(key, value) -> bool:
    return value % 2 == 0  # the test's predicate


def _filtered_outputs(send_old_values: bool, records) -> tuple[list[tuple], list[tuple]]:
    """The source table's and the filtered table's updates (proc1 and proc2)."""
    b = StreamsBuilder()
    table1 = b.table("topic1", Serdes.string(), Serdes.long())
    table2 = table1.filter(_even)
    if send_old_values:
        table2.group_by(lambda key, value: (key, value)).count()
    table1.to_stream().to("proc1", Serdes.string(), Serdes.long())
    table2.to_stream().to("proc2", Serdes.string(), Serdes.long())
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        topic = driver.create_input_topic("topic1", Serdes.string(), Serdes.long())
        for key, value, timestamp in records:
            topic.pipe_input(key, value, timestamp=timestamp)
        outputs = []
        for name in ("proc1", "proc2"):
            out = driver.create_output_topic(name, Serdes.string(), Serdes.long())
            outputs.append([(r.key, r.value, r.timestamp) for r in out.read_records_to_list()])
    return outputs[0], outputs[1]


def test_should_not_send_old_values_without_materialization():
    proc1, proc2 = _filtered_outputs(send_old_values=False, records=INPUT)
    assert proc1 == [("A", 1, 5), ("B", 1, 10), ("C", 1, 15), ("A", 2, 15), ("B", 2, 8),
                     ("A", 3, 20), ("A", None, 10), ("B", None, 20)]  # fmt: skip
    # Without old values every update goes on: a rejected value is a tombstone.
    assert proc2 == [("A", None, 5), ("B", None, 10), ("C", None, 15), ("A", 2, 15), ("B", 2, 8),
                     ("A", None, 20), ("A", None, 10), ("B", None, 20)]  # fmt: skip


def test_should_send_old_values_when_enabled_without_materialization():
    proc1, proc2 = _filtered_outputs(send_old_values=True, records=INPUT)
    assert proc1 == [("A", 1, 5), ("B", 1, 10), ("C", 1, 15), ("A", 2, 15), ("B", 2, 8),
                     ("A", 3, 20), ("A", None, 10), ("B", None, 20)]  # fmt: skip
    # checkEmptyAndClearProcessResult for A, B, C = 1; then Change(2, null) twice,
    # Change(null, 2) for A = 3; A's tombstone (old 3, filtered out: null) is not forwarded.
    assert proc2 == [("A", 2, 15), ("B", 2, 8), ("A", None, 20), ("B", None, 20)]


def test_should_skip_null_to_repartition_without_materialization():
    b = StreamsBuilder()
    table1 = b.table("topic1", Serdes.string(), Serdes.string())
    filtered = table1.filter(lambda key, value: value.lower() == "accept")
    table2 = filtered.group_by(lambda key, value: (key, value)).reduce(
        lambda agg, value: agg + value,  # MockReducer.STRING_ADDER
        lambda agg, value: agg + "-" + value,  # MockReducer.STRING_REMOVER
    )
    table1.to_stream().to("proc1", Serdes.string(), Serdes.string())
    table2.to_stream().to("proc2", Serdes.string(), Serdes.string())
    filtered.to_stream().to("filtered", Serdes.string(), Serdes.string())
    with TopologyTestDriver(b.build(), CONFIG) as driver:
        topic = driver.create_input_topic("topic1", Serdes.string(), Serdes.string())
        for key, timestamp in (("A", 5), ("B", 10), ("C", 20)):
            topic.pipe_input(key, "reject", timestamp=timestamp)
        read = {
            name: [(r.key, r.value, r.timestamp) for r in driver.create_output_topic(
                name, Serdes.string(), Serdes.string()).read_records_to_list()]
            for name in ("proc1", "proc2", "filtered")
        }  # fmt: skip
    assert read["proc1"] == [("A", "reject", 5), ("B", "reject", 10), ("C", "reject", 20)]
    assert read["proc2"] == []  # checkEmptyAndClearProcessResult
    assert read["filtered"] == []  # nothing to repartition: the filter forwarded nothing


def test_the_filter_keeps_which_keys_have_a_value_across_commits():
    """The filter's store is a transactional store like any other: a commit after every
    record (and the record cache on) gives the same updates."""
    b = StreamsBuilder()
    filtered = b.table("topic1", Serdes.string(), Serdes.long()).filter(_even)
    filtered.group_by(lambda key, value: (key, value)).count()
    filtered.to_stream().to("proc2", Serdes.string(), Serdes.long())
    with TopologyTestDriver(b.build(), {"application.id": "f"}, commit_every=1) as driver:
        topic = driver.create_input_topic("topic1", Serdes.string(), Serdes.long())
        for key, value, timestamp in INPUT:
            topic.pipe_input(key, value, timestamp=timestamp)
        out = driver.create_output_topic("proc2", Serdes.string(), Serdes.long())
        got = [(r.key, r.value, r.timestamp) for r in out.read_records_to_list()]
    assert got == [("A", 2, 15), ("B", 2, 8), ("A", None, 20), ("B", None, 20)]
