"""A job's settings reach every store it opens: the platform.rocksdb.* / platform.versioned.*
settings, then ``rocksdb.config.setter`` (Kafka Streams' RocksDBConfigSetter), through the
task that opens the stores (here the TopologyTestDriver's, as on Spark)."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from datetime import timedelta
from pathlib import Path

import pytest

from streamplatform import Processor, StreamsBuilder, TopologyTestDriver, cli
from streamplatform.config import ConfigError, load_object
from streamplatform.serdes import Serdes
from streamplatform.state import RocksDBOptions, StoreOptions, Stores
from streamplatform.state.rocks import shared_memory, shared_memory_sizes

MiB = 1024 * 1024
HERE = "tests.state.test_state_rocksdb_settings"


class Counter(Processor):
    def init(self, context):
        super().init(context)
        self.counts = context.get_state_store("counts")

    def process(self, record):
        count = (self.counts.get(record.key) or 0) + 1
        self.counts.put(record.key, count)
        self.context.forward(record._replace(value=count))


def topology():
    """A processor with a key-value store and a versioned store."""
    b = StreamsBuilder()
    b.add_state_store(Stores.key_value_store_builder(
        Stores.persistent_key_value_store("counts"), Serdes.string(), Serdes.long()))  # fmt: skip
    b.add_state_store(Stores.persistent_versioned_key_value_store("rates", timedelta(hours=1)))
    b.stream("in", Serdes.string(), Serdes.string()).process(Counter, "counts", "rates").to(
        "out", value_serde=Serdes.long()
    )
    return b.build()


class RecordingSetter:
    """Smaller memtables for "counts", no history cache for "rates"; records its calls on
    the class (the one the runtime loads by its import path)."""

    calls: list[tuple[str, dict, dict]] = []
    closed: list[tuple[str, int]] = []

    def set_config(self, store_name, options, configs):
        type(self).calls.append((store_name, dataclasses.asdict(options), configs))
        if store_name == "counts":
            options.write_buffer_bytes = 2 * MiB
        else:
            options.history_cache_bytes = 0
        configs["application.id"] = "changed"  # a copy: nothing else sees it

    def close(self, store_name, options):
        type(self).closed.append((store_name, options.write_buffer_bytes))


class CompressionSetter:
    def set_config(self, store_name, options, configs):
        options.compression = "brotli"


class TypoSetter:
    def set_config(self, store_name, options, configs):
        options.block_cache_size = MiB  # not an option


class FailingSetter:
    def set_config(self, store_name, options, configs):
        raise RuntimeError("no tuning today")


class NeedsArguments:
    def __init__(self, profile):
        self.profile = profile

    def set_config(self, store_name, options, configs):
        pass


@pytest.fixture(autouse=True)
def _default_shared_memory():
    yield
    shared_memory(StoreOptions())  # the process-wide cache back to the defaults


def _run(settings):
    """Open the task (one record through it) and return its stores, the driver still open."""
    driver = TopologyTestDriver(topology(), {"application.id": "tuned", **settings})
    try:
        driver.create_input_topic("in", Serdes.string(), Serdes.string()).pipe_input("a", "x")
    except BaseException:
        driver.close()
        raise
    (task,) = driver._tasks.values()
    return driver, task.stores


def test_rocksdb_options_are_store_options_fields_mutable():
    fields = [(f.name, f.type, f.default) for f in dataclasses.fields(StoreOptions)]
    assert [(f.name, f.type, f.default) for f in dataclasses.fields(RocksDBOptions)] == fields
    assert RocksDBOptions().to_store_options() == StoreOptions()
    options = RocksDBOptions.of(StoreOptions(bloom_bits_per_key=0))
    options.compression = "zstd"
    assert options.to_store_options() == StoreOptions(bloom_bits_per_key=0, compression="zstd")
    with pytest.raises(AttributeError):
        options.block_cache_size = 1  # type: ignore[attr-defined]


def test_without_settings_the_stores_open_with_store_options_defaults():
    driver, stores = _run({})
    with driver:
        assert stores["counts"].options == StoreOptions()
        assert stores["rates"].options == StoreOptions()


def test_plain_settings_reach_every_store_and_the_shared_cache():
    driver, stores = _run({
        "platform.rocksdb.block.cache.bytes": 32 * MiB,
        "platform.rocksdb.write.buffer.manager.bytes": 8 * MiB,
        "platform.rocksdb.write.buffer.bytes": 1 * MiB,
        "platform.versioned.latest.cache.entries": 100,
        "platform.versioned.history.cache.bytes": 1 * MiB,
    })  # fmt: skip
    expected = StoreOptions(block_cache_bytes=32 * MiB, write_buffer_manager_bytes=8 * MiB,
                            write_buffer_bytes=1 * MiB, latest_cache_entries=100,
                            history_cache_bytes=1 * MiB)  # fmt: skip
    with driver:
        assert stores["counts"].options == expected
        assert stores["rates"].options == expected
        assert shared_memory_sizes() == (32 * MiB, 8 * MiB)
        _, manager = shared_memory(expected)
        assert manager.get_buffer_size() == 8 * MiB  # RocksDB's own write-buffer manager


def test_the_setter_tunes_each_store_by_name_after_the_plain_settings():
    setter = load_object(f"{HERE}.RecordingSetter")  # the class the runtime instantiates
    setter.calls.clear()
    setter.closed.clear()
    driver, stores = _run({"rocksdb.config.setter": f"{HERE}.RecordingSetter",
                           "platform.rocksdb.write.buffer.bytes": 4 * MiB})  # fmt: skip
    with driver:
        assert sorted(name for name, _, _ in setter.calls) == ["counts", "rates"]
        for _, seen, configs in setter.calls:
            assert seen["write_buffer_bytes"] == 4 * MiB  # the plain setting came first
            assert configs["platform.rocksdb.write.buffer.bytes"] == 4 * MiB
            assert configs["statestore.cache.max.bytes"] == 10 * MiB  # defaults included
        assert stores["counts"].options.write_buffer_bytes == 2 * MiB
        assert stores["counts"].options.history_cache_bytes == 64 * MiB
        assert stores["rates"].options.write_buffer_bytes == 4 * MiB
        assert stores["rates"].options.history_cache_bytes == 0
        assert driver.config["application.id"] == "tuned"
        assert setter.closed == []
    assert sorted(setter.closed) == [("counts", 2 * MiB), ("rates", 4 * MiB)]


@pytest.mark.parametrize(
    ("setter", "named"),
    [
        ("CompressionSetter", "for store 'counts': StoreOptions.compression must be one of"),
        (
            "TypoSetter",
            "for store 'counts': 'RocksDBOptions' object has no attribute 'block_cache_size'",
        ),
        ("FailingSetter", "for store 'counts': no tuning today"),
    ],
)
def test_a_setter_leaving_a_bad_value_fails_the_task_naming_the_setting_and_store(setter, named):
    with pytest.raises(ConfigError) as error:
        _run({"rocksdb.config.setter": f"{HERE}.{setter}"})
    assert f"rocksdb.config.setter='{HERE}.{setter}' {named}" in str(error.value)


def test_the_cli_settings_reach_the_stores(monkeypatch):
    """``streamplatform run --set KEY=VALUE`` gives StreamingJob the settings as strings;
    StreamsConfig types them, and the task opens its stores with them, as from Python."""
    made = {}
    monkeypatch.setattr("streamplatform.runtime.microbatch.StreamingJob",
                        lambda topology, settings, **kwargs: made.update(settings))  # fmt: skip
    args = cli.build_parser().parse_args([
        "run", "--topology", f"{HERE}:topology",
        "--set", "application.id=tuned", "--set", "platform.rocksdb.write.buffer.bytes=3145728",
        "--set", f"rocksdb.config.setter={HERE}.RecordingSetter",
    ])  # fmt: skip
    cli._job(args)
    assert made["platform.rocksdb.write.buffer.bytes"] == "3145728"
    driver, stores = _run(made)
    with driver:
        assert stores["rates"].options.write_buffer_bytes == 3 * MiB
        assert stores["counts"].options.write_buffer_bytes == 2 * MiB  # the setter's


def test_store_options_refuse_a_write_buffer_manager_bigger_than_the_cache():
    with pytest.raises(ValueError, match="write_buffer_manager_bytes .* must not exceed"):
        StoreOptions(block_cache_bytes=8 * MiB, write_buffer_manager_bytes=16 * MiB)
    with pytest.raises(ConfigError, match="for store 'counts': StoreOptions.write_buffer_manager"):
        _run({"rocksdb.config.setter": f"{HERE}.BigBuffersSetter"})


class BigBuffersSetter:
    def set_config(self, store_name, options, configs):
        options.write_buffer_manager_bytes = options.block_cache_bytes + 1


def test_the_setter_of_docs_memory_md_runs_as_written(monkeypatch):
    page = (Path(__file__).parents[2] / "docs" / "memory.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    module = types.ModuleType("memory_md_example")
    exec(compile(block, "docs/memory.md", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    driver, stores = _run({"rocksdb.config.setter": "memory_md_example.BoundedMemory"})
    with driver:
        assert stores["counts"].options.cache_index_and_filter_blocks
        assert stores["counts"].options.history_cache_bytes == 64 * MiB
        assert stores["rates"].options.history_cache_bytes == 8 * MiB


def test_a_dagster_job_declaration_checks_and_passes_the_settings(tmp_path):
    """Dagster's job declaration checks the settings when the definitions load, and gives
    them to the job as they are: the stores open with them, as from Python and the CLI."""
    from streamplatform.dagster import StreamingJobSpec

    with pytest.raises(ConfigError, match="rocksdb.config.setter='collections.OrderedDict'"):
        StreamingJobSpec(name="tuned", topology=topology,
                         settings={"rocksdb.config.setter": "collections.OrderedDict"})  # fmt: skip
    spec = StreamingJobSpec(name="tuned", topology=topology,
                            settings={"platform.rocksdb.write.buffer.bytes": 2 * MiB})  # fmt: skip
    settings = spec.streams_settings({"bootstrap.servers": "b:9092"}, str(tmp_path), "")
    driver, stores = _run(settings)
    with driver:
        assert stores["counts"].options.write_buffer_bytes == 2 * MiB


def test_a_failing_setter_stops_a_streaming_job_at_construction(tmp_path):
    """The job builds every store's options at start-up: a setter that fails stops it there,
    naming the setting and the store, before any Kafka, Spark or batch."""
    from streamplatform.runtime.microbatch import StreamingJob

    settings = {
        "application.id": "tuned", "bootstrap.servers": "127.0.0.1:9",
        "state.dir": str(tmp_path / "state"), "platform.delta.root": str(tmp_path / "delta"),
        "rocksdb.config.setter": f"{HERE}.FailingSetter",
    }  # fmt: skip
    with pytest.raises(ConfigError, match="for store 'counts': no tuning today"):
        StreamingJob(topology(), settings)
