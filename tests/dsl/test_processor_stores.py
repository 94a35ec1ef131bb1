"""The store interfaces a processor gets (Kafka Streams' KeyValueStore and the versioned store):
typed by their serdes, reading their own uncommitted writes, with nothing of the commit
protocol; and the test driver's commit boundaries."""

from __future__ import annotations

import pytest

from streamplatform import Processor, StreamsBuilder, TopologyTestDriver
from streamplatform.errors import TaskFailedError
from streamplatform.serdes import Serdes
from streamplatform.state import (
    PUT_RETURN_CODE_NOT_PUT,
    VALID_TO_UNDEFINED,
    KeyValueStore,
    Stores,
    VersionedRecord,
    VersionedStore,
)


class Counter(Processor):
    """Written the Kafka Streams way: read the count, put the count + 1, forward it."""

    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("counts")

    def process(self, record):
        if record.value == "boom":
            raise ValueError("boom")
        count = (self.store.get(record.key) or 0) + 1
        self.store.put(record.key, count)
        self.context.forward(record._replace(value=count))


def _counting(store=None):
    b = StreamsBuilder()
    b.add_state_store(store or Stores.key_value_store_builder(
        Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long()))  # fmt: skip
    b.stream("in", Serdes.string(), Serdes.string()).process(Counter, "counts").to(
        "out", value_serde=Serdes.long()
    )
    return b.build()


def _pipe(driver, pairs):
    source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
    for offset, (key, value) in enumerate(pairs):
        source.pipe_input(key, value, timestamp=offset)


def _out(driver):
    return driver.create_output_topic("out", Serdes.string(), Serdes.long()).read_values_to_list()


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
@pytest.mark.parametrize("commit_every", [1, 3, None])
def test_a_processor_reads_its_own_uncommitted_writes(guarantee, commit_every):
    """Several records of one key between two commits count 1, 2, 3, 4, as on Spark, where a
    micro-batch commits once after all of them."""
    config = {"application.id": "count", "processing.guarantee": guarantee}
    with TopologyTestDriver(_counting(), config, commit_every=commit_every) as driver:
        _pipe(driver, [("a", "x"), ("a", "x"), ("b", "x"), ("a", "x"), ("a", "x")])
        assert _out(driver) == [1, 2, 1, 3, 4]
        assert driver.get_state_store("counts").get("a") == 4  # typed, uncommitted included


@pytest.mark.parametrize("guarantee", ["exactly_once_v2", "at_least_once"])
def test_a_failed_record_loses_the_writes_since_the_last_commit_under_either_guarantee(guarantee):
    """commit_every=None: only advance_wall_clock_time / commit() commit, as a batch boundary.
    A failure then drops every write since: the state is the last commit's, as on Spark."""
    config = {"application.id": "count", "processing.guarantee": guarantee}
    with TopologyTestDriver(_counting(), config, commit_every=None) as driver:
        _pipe(driver, [("a", "x"), ("a", "x")])
        driver.advance_wall_clock_time(1)  # commits: a = 2
        _pipe(driver, [("a", "x"), ("a", "x")])  # a = 4, uncommitted
        with pytest.raises(TaskFailedError, match="boom"):
            _pipe(driver, [("a", "boom")])
        _pipe(driver, [("a", "x")])
        assert _out(driver) == [1, 2, 3, 4, 3]  # back to the committed 2, then + 1


def test_commit_every_must_be_positive_or_none():
    with pytest.raises(ValueError, match="commit_every"):
        TopologyTestDriver(_counting(), {"application.id": "a"}, commit_every=0)


def test_the_key_value_store_interface(tmp_path):
    """Kafka Streams' KeyValueStore: put/get/put_if_absent/put_all/delete, inclusive ranges
    in serialized-key order, prefix scans, and an estimate of the entries."""
    seen = {}

    class Probe(Processor):
        def init(self, context):
            super().init(context)
            self.store = context.get_state_store("counts")

        def process(self, record):
            store = self.store
            assert isinstance(store, KeyValueStore)
            assert store.name == "counts"
            store.put_all([("a1", 1), ("a2", 2), ("b1", 3), ("c1", 4)])
            seen["get"] = store.get("a2"), store.get("zz")
            seen["put_if_absent"] = store.put_if_absent("a1", 9), store.put_if_absent("d1", 5)
            seen["delete"] = store.delete("c1"), store.delete("c1")
            store.put("b1", None)  # a None value deletes, as in Kafka Streams
            seen["range"] = list(store.range("a2", "d1"))
            seen["open_range"] = list(store.range(None, "a2")), list(store.range("d1", None))
            seen["empty_range"] = list(store.range("d1", "a1"))
            seen["reverse_range"] = list(store.reverse_range("a1", "d1"))
            seen["all"] = list(store.all())
            seen["reverse_all"] = [key for key, _ in store.reverse_all()]
            seen["prefix"] = list(store.prefix_scan("a"))
            seen["count"] = store.approximate_num_entries()
            with pytest.raises(ValueError, match="None"):
                store.get(None)
            for internal in ("transaction", "commit", "prepare", "settle", "close"):
                assert not hasattr(store, internal), internal

    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long()))  # fmt: skip
    b.stream("in", Serdes.string(), Serdes.string()).process(Probe, "counts")
    with TopologyTestDriver(b.build(), {"application.id": "kv"}) as driver:
        _pipe(driver, [("k", "v")])
    assert seen == {
        "get": (2, None),
        "put_if_absent": (1, None),
        "delete": (4, None),
        "range": [("a2", 2), ("d1", 5)],
        "open_range": ([("a1", 1), ("a2", 2)], [("d1", 5)]),
        "empty_range": [],
        "reverse_range": [("d1", 5), ("a2", 2), ("a1", 1)],
        "all": [("a1", 1), ("a2", 2), ("d1", 5)],
        "reverse_all": ["d1", "a2", "a1"],
        "prefix": [("a1", 1), ("a2", 2)],
        "count": pytest.approx(3, abs=3),  # an estimate: staged deletes count too
    }


def test_a_store_declared_without_serdes_takes_bytes():
    class Raw(Processor):
        def init(self, context):
            super().init(context)
            self.store = context.get_state_store("raw")

        def process(self, record):
            key = record.key.encode()
            self.store.put(key, (self.store.get(key) or b"") + b"+")
            self.context.forward(record._replace(value=len(self.store.get(key))))

    b = StreamsBuilder()
    b.add_state_store(Stores.persistent_key_value_store("raw"))
    b.stream("in", Serdes.string(), Serdes.string()).process(Raw, "raw").to(
        "out", value_serde=Serdes.long()
    )
    with TopologyTestDriver(b.build(), {"application.id": "raw"}, commit_every=None) as driver:
        _pipe(driver, [("a", "x"), ("a", "x")])
        assert _out(driver) == [1, 2]
        assert driver.get_state_store("raw").get(b"a") == b"++"


def test_the_versioned_store_interface():
    seen = {}

    class Rates(Processor):
        def init(self, context):
            super().init(context)
            self.store = context.get_state_store("rates")

        def process(self, record):
            store = self.store
            assert isinstance(store, VersionedStore)
            seen["puts"] = [
                store.put("eur", {"rate": 1.08}, 1_000),
                store.put("eur", {"rate": 1.09}, 5_000),
                store.put("eur", {"rate": 1.07}, 3_000),  # out of order: valid to 5_000
                store.put("eur", {"rate": 0.0}, 0),  # older than the retention
            ]
            seen["latest"] = store.get("eur")
            seen["as_of"] = store.get("eur", 3_500)
            seen["versions"] = store.get_versions("eur", 0, 10_000, ascending=True)
            seen["delete"] = store.delete("eur", 6_000)
            seen["after_delete"] = store.get("eur"), store.get("eur", 5_500)

    b = StreamsBuilder()
    b.add_state_store(Stores.versioned_key_value_store_builder(
        Stores.persistent_versioned_key_value_store("rates", 3_000),
        Serdes.string(), Serdes.json()))  # fmt: skip
    b.stream("in", Serdes.string(), Serdes.string()).process(Rates, "rates")
    with TopologyTestDriver(b.build(), {"application.id": "ver"}) as driver:
        _pipe(driver, [("k", "v")])
    assert seen == {
        "puts": [VALID_TO_UNDEFINED, VALID_TO_UNDEFINED, 5_000, PUT_RETURN_CODE_NOT_PUT],
        "latest": VersionedRecord({"rate": 1.09}, 5_000, None),
        "as_of": VersionedRecord({"rate": 1.07}, 3_000, 5_000),
        "versions": [
            VersionedRecord({"rate": 1.08}, 1_000, 3_000),
            VersionedRecord({"rate": 1.07}, 3_000, 5_000),
            VersionedRecord({"rate": 1.09}, 5_000, None),
        ],
        "delete": VersionedRecord({"rate": 1.09}, 5_000, None),
        "after_delete": (None, VersionedRecord({"rate": 1.09}, 5_000, 6_000)),
    }


def test_an_undeclared_store_is_an_error_naming_it():
    class Sneaky(Processor):
        def init(self, context):
            super().init(context)
            context.get_state_store("counts")

        def process(self, record):
            pass

    b = StreamsBuilder()
    b.add_state_store(Stores.persistent_key_value_store("counts"))
    b.stream("in").process(Counter, "counts")
    b.stream("other").process(Sneaky)
    with (
        pytest.raises(ValueError, match="did not declare store 'counts'"),
        TopologyTestDriver(b.build(), {"application.id": "x"}) as driver,
    ):
        driver.create_input_topic("other", Serdes.bytes(), Serdes.bytes()).pipe_input(b"k", b"v")


def test_builders_take_only_their_kind_of_supplier():
    with pytest.raises(TypeError, match="persistent_key_value_store"):
        Stores.key_value_store_builder(
            Stores.persistent_versioned_key_value_store("v", 1_000), None, None
        )
    with pytest.raises(TypeError, match="Serde"):
        Stores.key_value_store_builder(Stores.persistent_key_value_store("k"), "string", None)
