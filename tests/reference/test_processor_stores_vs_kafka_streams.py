"""Kafka Streams itself is the reference for what a processor sees of its store: the same
input through its TopologyTestDriver (ProcessorStoreReference.java, run by the JDK as a
single-file program on the jars of ``.jvm/streams/``) and through ours must give the same
output. Ours runs with commits at every record and only at the end (a Spark micro-batch): a
processor reads its own uncommitted writes either way, as in Kafka Streams."""

from __future__ import annotations

import pytest

from streamplatform import Processor, StreamsBuilder, TopologyTestDriver
from streamplatform.serdes import Serdes
from streamplatform.state import Stores

from .kafka_streams import run_reference


def kafka_streams(mode: str, records, tmp_path) -> list[tuple[str, str]]:
    """``records`` (key, value, timestamp) through Kafka Streams' driver: topic "out"."""
    lines = "".join(f"{key}\t{value}\t{timestamp}\n" for key, value, timestamp in records)
    out = run_reference("ProcessorStoreReference.java", mode, lines, tmp_path / "kafka-streams")
    return [tuple(line.split("\t", 1)) for line in out]


class Counter(Processor):
    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("counts")

    def process(self, record):
        count = (self.store.get(record.key) or 0) + 1
        self.store.put(record.key, count)
        self.context.forward(record._replace(value=str(count)))


def _null(value) -> str:
    return "null" if value is None else str(value)


def _keys(entries) -> str:
    return ",".join(f"{key}:{value}" for key, value in entries)


class StoreMethods(Processor):
    def init(self, context):
        super().init(context)
        self.store = context.get_state_store("counts")

    def process(self, record):
        store, key = self.store, record.key
        if record.value == "delete":
            seen = f"delete={_null(store.delete(key))}"
        else:
            seen = f"put_if_absent={_null(store.put_if_absent(key, len(record.value)))}"
        seen += (
            f";range={_keys(store.range('b', 'd'))};open_from={_keys(store.range(None, 'b'))}"
            f";reverse={_keys(store.reverse_range('b', 'd'))}"
            f";prefix={_keys(store.prefix_scan('a'))};all={_keys(store.all())}"
            f";get={_null(store.get(key))}"
        )
        self.context.forward(record._replace(value=seen))


def ours(processor, records, commit_every) -> list[tuple[str, str]]:
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long()))  # fmt: skip
    (b.stream("in", Serdes.string(), Serdes.string())
        .filter(lambda key, value: value != "bot")
        .process(processor, "counts")
        .to("out"))  # fmt: skip
    config = {"application.id": "ours"}
    with TopologyTestDriver(b.build(), config, commit_every=commit_every) as driver:
        source = driver.create_input_topic("in", Serdes.string(), Serdes.string())
        for key, value, timestamp in records:
            source.pipe_input(key, value, timestamp=timestamp)
        return driver.create_output_topic("out", Serdes.string(), Serdes.string()) \
            .read_key_values_to_list()  # fmt: skip


VIEWS = [(f"user-{i % 3}", "bot" if i % 5 == 0 else "view", i * 100) for i in range(30)]
STORE_CALLS = [
    ("b", "xx", 0), ("ab", "xyz", 1), ("d", "q", 2), ("b", "yyy", 3), ("b", "delete", 4),
    ("c", "cc", 5), ("aa", "z", 6), ("zz", "delete", 7), ("a", "long value", 8), ("d", "x", 9),
]  # fmt: skip


@pytest.mark.parametrize("commit_every", [1, None])
def test_a_counting_processor_counts_as_in_kafka_streams(tmp_path, commit_every):
    expected = kafka_streams("count", VIEWS, tmp_path)
    assert len(expected) == 24  # the bots filtered out
    assert ours(Counter, VIEWS, commit_every) == expected


@pytest.mark.parametrize("commit_every", [1, None])
def test_the_key_value_store_methods_answer_as_in_kafka_streams(tmp_path, commit_every):
    """put_if_absent, delete, inclusive and open ranges, reverse ranges, prefix scans, all and
    get, each after the processor's own uncommitted writes."""
    expected = kafka_streams("store", STORE_CALLS, tmp_path)
    assert len(expected) == len(STORE_CALLS)
    assert ours(StoreMethods, STORE_CALLS, commit_every) == expected
