"""StreamsConfig: Kafka Streams' dotted setting names, validated once, frozen.

Every setting is declared once below (name, parser, default, doc, aliases); validation, defaults,
alias resolution and the reference in ``docs/configuration.md`` (``python -m
streamplatform.config``) all come from that one table. An unknown or ill-typed setting is an
error at start that names it; all problems are reported together.

Kafka client settings pass through: ``client.id``, ``security.protocol``, ``sasl.*``, ``ssl.*``
(the Java client's names, translated for librdkafka: kafka/security.py) and the
``producer.``/``consumer.``/``admin.`` prefixes, as in Kafka Streams.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from streamplatform.exceptions import StreamPlatformError

BUILTIN_HANDLERS = ("log_and_fail", "log_and_continue")
# With a DLQ topic set, a bad record's place is the DLQ and the task goes on: these handlers
# then default to log_and_continue (Kafka Streams keeps log_and_fail, which writes the DLQ
# record and stops the task). The production handler keeps log_and_fail: a record that
# cannot be written is a fault of the job or the cluster, not of the input.
DLQ_DEFAULTED_HANDLERS = (
    "default.deserialization.exception.handler",
    "processing.exception.handler",
)
GUARANTEES = ("at_least_once", "exactly_once_v2")
MAX_CLIENT_TAGS = 5
MAX_TAG_KEY_LENGTH = 20
MAX_TAG_VALUE_LENGTH = 30

CLIENT_TAG_PREFIX = "client.tag."
_CLIENT_TAG_ALIAS = "instance.tag."
_PASSTHROUGH_KEYS = ("client.id", "security.protocol")
_CLIENT_PREFIXES = ("producer", "consumer", "admin")
_PASSTHROUGH_PREFIXES = ("sasl.", "ssl.", *(f"{client}." for client in _CLIENT_PREFIXES))


class ConfigError(StreamPlatformError, ValueError):
    """One or more settings are wrong; the message names each of them."""


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value


def _optional_string(value: Any) -> str | None:
    return None if value is None else _string(value)


def _int(minimum: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError("expected an integer, not a boolean")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer >= {minimum}") from None
        if isinstance(value, float) and value != number:
            raise ValueError(f"expected an integer >= {minimum}")
        if number < minimum:
            raise ValueError(f"expected an integer >= {minimum}")
        return number

    return parse


def _optional_limit(value: Any) -> int | None:
    """A limit where None or -1 mean "unlimited"."""
    if value is None or value == -1 or value == "-1":
        return None
    return _int(1)(value)


def _choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return str(value)

    return parse


_ISO_DURATION = re.compile(
    r"P(?:(?P<days>\d+)D)?(?:T(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d{1,9})?)S)?)?"
)


def iso_duration_ms(text: str) -> int:
    """An ISO-8601 duration as Java's ``Duration.parse`` takes it (``PnDTnHnMn.nS``: days,
    hours, minutes, seconds), in milliseconds."""
    match = _ISO_DURATION.fullmatch(text.strip().upper())
    if match is None or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise ValueError(f"{text!r} is not an ISO-8601 duration such as PT1H, P1D or PT30M")
    parts = {name: float(value) for name, value in match.groupdict().items() if value}
    seconds = (parts.get("days", 0) * 86_400 + parts.get("hours", 0) * 3_600
               + parts.get("minutes", 0) * 60 + parts.get("seconds", 0))  # fmt: skip
    return round(seconds * 1000)


def _offset_reset(value: Any) -> str:
    """Kafka's ``auto.offset.reset`` (KIP-1106): earliest, latest, none, by_duration:<ISO>."""
    text = _string(value).strip().lower()
    if text in ("earliest", "latest", "none"):
        return text
    if text.startswith("by_duration:"):
        iso_duration_ms(text.split(":", 1)[1])  # refused here, at start, when malformed
        return f"by_duration:{text.split(':', 1)[1].upper()}"
    raise ValueError("expected earliest, latest, none or by_duration:<ISO-8601 duration> "
                     "(by_duration:PT1H, say)")  # fmt: skip


def _bool(value: Any) -> bool:
    """true/false, as a boolean or a string (the CLI's --set and YAML give either)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("expected true or false")


# Subject name strategies: Confluent's short names, and its Java class names (a job's settings
# may come from a Java application's properties).
SUBJECT_NAME_STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
_STRATEGY_PACKAGE = "io.confluent.kafka.serializers.subject."
# Where a registry serde writes the schema id: Confluent's classic payload prefix (magic byte 0
# and 4 bytes of id), or the newer record header (the schema's GUID in __key_schema_id /
# __value_schema_id). Both are always read.
SCHEMA_ID_FORMATS = ("prefix", "header")
_SCHEMA_ID_CLASSES = {
    "io.confluent.kafka.serializers.schema.id.PrefixSchemaIdSerializer": "prefix",
    "io.confluent.kafka.serializers.schema.id.HeaderSchemaIdSerializer": "header",
}


def _subject_name_strategy(value: Any) -> str:
    name = _string(value).removeprefix(_STRATEGY_PACKAGE)
    if name not in SUBJECT_NAME_STRATEGIES:
        raise ValueError(f"expected one of {', '.join(SUBJECT_NAME_STRATEGIES)}")
    return name


def _schema_id_format(value: Any) -> str:
    name = _SCHEMA_ID_CLASSES.get(_string(value), value)
    if name not in SCHEMA_ID_FORMATS:
        raise ValueError(f"expected one of {', '.join(SCHEMA_ID_FORMATS)}")
    return str(name)


def _delta_root(value: Any) -> str:
    from streamplatform.storage import check_root

    check_root(_string(value))
    return str(value)


def _endpoint(value: Any) -> str | None:
    if value is None:
        return None
    if not _string(value).startswith(("http://", "https://")):
        raise ValueError("expected a URL that starts with http:// or https://")
    return str(value)


def _string_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",") if item.strip()]
    elif isinstance(value, list | tuple):
        items = [_string(item).strip() for item in value]
    else:
        raise ValueError("expected a comma-separated string or a list of strings")
    return tuple(items)


def load_object(path: str) -> Any:
    """Import ``package.module.Name`` or ``package.module:Name``."""
    module_name, _, attribute = path.replace(":", ".").rpartition(".")
    if not module_name:
        raise ValueError(f"{path!r} is not an import path (package.module.Name)")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from None


def _handler(value: Any) -> str:
    name = _string(value)
    if name not in BUILTIN_HANDLERS:
        load_object(name)  # fail at start, not at the first bad record
    return name


def _optional_import_path(value: Any) -> str | None:
    if value is None:
        return None
    load_object(_string(value))  # fail at start, not at the first record
    return value


def _optional_config_setter(value: Any) -> str | None:
    """``rocksdb.config.setter``: checked at start, as far as can be without a store."""
    if value is None:
        return None
    path = _string(value)
    setter = load_object(path)
    if not isinstance(setter, type) or not callable(getattr(setter, "set_config", None)):
        raise ValueError(
            f"{path!r} is not a class with a set_config(store_name, options, configs) method"
        )
    try:
        inspect.signature(setter).bind()
    except TypeError:
        raise ValueError(
            f"{path!r} cannot be instantiated without arguments (one instance per store)"
        ) from None
    except ValueError:
        pass  # no signature to read (a class implemented in C): found out at the first store
    return path


_MiB = 1024 * 1024


@dataclass(frozen=True)
class Setting:
    name: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str
    type_doc: str
    aliases: tuple[str, ...] = ()
    required: bool = False


SETTINGS: tuple[Setting, ...] = (
    Setting("application.id", _string, None, "Identifies the application: prefixes internal "
            "topics, names the state directory and the Delta tables' transaction ids.",
            "string", required=True),
    Setting("bootstrap.servers", _optional_string, None, "Kafka brokers, host:port,... Needed "
            "to run on Kafka; the TopologyTestDriver does without.", "string"),
    Setting("processing.guarantee", _choice(*GUARANTEES), "exactly_once_v2",
            "exactly_once_v2 (the default here; Kafka Streams defaults to at_least_once): "
            "idempotent Delta sinks, and each task's Kafka outputs (sinks, DLQ) in one Kafka "
            "transaction (transactional.id <application.id>-<task>) with its offsets for the "
            "consumer group application.id. at_least_once: Kafka outputs may repeat after a "
            "crash (each carries the __streamplatform.source header). Under both, a batch's "
            "state writes take effect only when the batch commits.",
            " | ".join(GUARANTEES)),
    Setting("state.dir", _string, None, "Root of the local state stores; a task's stores live "
            "in <state.dir>/<application.id>/<task id>/. Default: .data/state.", "path"),
    Setting("commit.interval.ms", _int(0), None, "How often a task commits its stores and "
            "offsets. Default 30000, or 100 under exactly_once_v2 (as in Kafka Streams).", "ms"),
    Setting("num.standby.replicas", _int(0), 0, "Warm copies of each stateful task kept on "
            "other instances (KIP-708 placement).", "int >= 0"),
    Setting("rack.aware.assignment.tags", _string_list, (), "Client tag keys to spread standbys "
            "over, in precedence order (KIP-708).", "list",
            aliases=("standby.task.assignment.awareness",)),
    Setting("default.deserialization.exception.handler", _handler, None,
            "What to do with a record that cannot be deserialized. Default: log_and_continue "
            "when errors.dead.letter.queue.topic.name is set, else log_and_fail.", "handler"),
    Setting("processing.exception.handler", _handler, None,
            "What to do when a processor raises (KIP-1033). Default: log_and_continue when "
            "errors.dead.letter.queue.topic.name is set, else log_and_fail.", "handler"),
    Setting("default.production.exception.handler", _handler, "log_and_fail",
            "What to do when an output record cannot be serialized or written.", "handler"),
    Setting("ensure.explicit.internal.resource.naming", _bool, False, "true: a topology "
            "whose state stores, changelog topics or repartition topics have generated names "
            "(KSTREAM-<KIND>-<index>, which change when an operator is added upstream) is an "
            "error at start, in StreamingJob and the TopologyTestDriver alike, listing each "
            "with its operator and how to name it (KIP-1111). false: a job logs them as a "
            "warning. Processor names do not count. See docs/upgrades.md.", "boolean"),
    Setting("errors.dead.letter.queue.topic.name", _optional_string, None, "When set, the "
            "built-in handlers send one DLQ record per error to this topic (KIP-1034). The topic "
            "is never created for you.", "string", aliases=("errors.deadletterqueue.topic.name",)),
    Setting("default.timestamp.extractor", _optional_import_path, None, "Import path of the "
            "event time of the records of every source without its own timestamp_extractor: "
            "a callable extract(record, partition_time) -> ms (or a class whose instances have "
            "an extract method), as Kafka Streams' TimestampExtractor. Default: the Kafka "
            "record's timestamp. A negative or failing extraction goes to the deserialization "
            "exception handler.", "import path"),
    Setting("metrics.recording.level", _choice("INFO", "DEBUG", "TRACE"), "INFO", "Which "
            "metrics the tasks record, as in Kafka Streams: INFO, or DEBUG (and TRACE) to also "
            "time each state-store operation of the processors (put, get, range... latency "
            "and rate per store, in ns; docs/operations.md), at the cost of two clock reads "
            "per operation.", "INFO, DEBUG or TRACE"),
    Setting("statestore.cache.max.bytes", _int(0), 10 * 1024 * 1024, "Each task's memory "
            "budget for what its processors keep in memory, shared equally between its "
            "aggregations' record caches and its deduplications' ids (docs/memory.md). The "
            "record cache works as Kafka Streams' (here per task): the latest update per key "
            "waits for the commit (on Spark, the end of the micro-batch), so a key updated many "
            "times in a batch is forwarded once. A deduplication keeps its ids in memory within "
            "its share and in RocksDB past it; session and sliding windows keep a key's "
            "windows, and on window close the windows not yet emitted, within theirs. 0: every "
            "update is forwarded, and no id or window is kept in memory past a commit.",
            "bytes"),
    Setting("statestore.uncommitted.max.records", _optional_limit, None, "Commit early when a "
            "task's stores hold more uncommitted entries than this (KIP-892). -1: no limit.",
            "int or -1"),
    Setting("statestore.uncommitted.max.bytes", _optional_limit, 64 * 1024 * 1024,
            "Commit early when a task's stores hold more uncommitted bytes than this (KIP-892). "
            "-1: no limit.", "bytes or -1"),
    Setting("rocksdb.config.setter", _optional_config_setter, None, "Import path of a class "
            "that tunes each RocksDB store, as Kafka Streams' RocksDBConfigSetter: one instance "
            "per store open, set_config(store_name, options, configs) changes options (a "
            "streamplatform.state.RocksDBOptions: StoreOptions' fields) in place, after the "
            "platform.rocksdb.* and platform.versioned.* settings; configs is a copy of the "
            "job's settings; close(store_name, options), if defined, runs when the store "
            "closes. See docs/memory.md.", "import path"),
    Setting("platform.rocksdb.block.cache.bytes", _int(1), 128 * _MiB, "Capacity of the "
            "LRU block cache that every RocksDB store of a worker process shares; the "
            "memtables are charged to it (platform.rocksdb.write.buffer.manager.bytes). "
            "Process-wide: the last store opened sets it. See docs/memory.md.", "bytes >= 1"),
    Setting("platform.rocksdb.write.buffer.manager.bytes", _int(1), None, "Memtable "
            "memory of all RocksDB stores of a worker process, charged to the block cache; "
            "past it RocksDB flushes memtables. At most platform.rocksdb.block.cache.bytes. "
            "Process-wide. Default: half the block cache (64 MiB for the default cache).",
            "bytes >= 1"),
    Setting("platform.rocksdb.write.buffer.bytes", _int(1), 16 * _MiB, "Size of one memtable "
            "(per column family of each store) before RocksDB flushes it.", "bytes >= 1"),
    Setting("platform.versioned.latest.cache.entries", _int(0), 10_000, "Latest versions each "
            "versioned store keeps decoded in memory (entries, per store). 0: none.",
            "int >= 0"),
    Setting("platform.versioned.history.cache.bytes", _int(0), 64 * _MiB, "Memory of each "
            "versioned store for the older versions of keys read often at older times (per "
            "store; values plus ~190 bytes per version and ~400 per key). 0: none.",
            "bytes >= 0"),
    # Schema Registry, in the names Confluent's clients use: the registry serdes
    # (Serdes.avro / protobuf / json_schema) of a job's sources, sinks and stores take them.
    Setting("schema.registry.url", _optional_string, None, "The Schema Registry the registry "
            "serdes use (comma-separated URLs; `mock://<scope>` for an in-process mock shared "
            "by every serde of that scope, for tests).", "URL"),
    Setting("basic.auth.credentials.source", _choice("USER_INFO", "URL", "SASL_INHERIT"),
            None, "Where the registry client takes its basic-auth credentials from: "
            "`USER_INFO` (`basic.auth.user.info`), `URL` (user:password@ in the URL) or "
            "`SASL_INHERIT` (the user and password of the Kafka clients' `sasl.jaas.config`).",
            "USER_INFO | URL | SASL_INHERIT"),
    Setting("basic.auth.user.info", _optional_string, None, "`user:password` for the "
            "registry (with `basic.auth.credentials.source=USER_INFO`). Never logged.",
            "string"),
    Setting("schema.registry.ssl.ca.location", _optional_string, None, "CA certificate(s) "
            "that sign the registry's TLS certificate.", "path"),
    Setting("schema.registry.ssl.certificate.location", _optional_string, None, "Client "
            "certificate for mutual TLS with the registry.", "path"),
    Setting("schema.registry.ssl.key.location", _optional_string, None, "Private key of "
            "that client certificate.", "path"),
    Setting("auto.register.schemas", _bool, True, "Registry serdes register their writer "
            "schema under the subject they write to when it is not there yet; false: the "
            "schema must be registered already (else the record fails to serialize).",
            "boolean"),
    Setting("use.latest.version", _bool, False, "Registry serdes write with the subject's "
            "latest registered schema instead of their own (auto-registration off).",
            "boolean"),
    Setting("normalize.schemas", _bool, False, "Normalize schemas before registering or "
            "looking them up.", "boolean"),
    Setting("key.subject.name.strategy", _subject_name_strategy, "TopicNameStrategy",
            "Subject of a key schema: `TopicNameStrategy` (`<topic>-key`), "
            "`RecordNameStrategy` (the record's full name) or `TopicRecordNameStrategy` "
            "(`<topic>-<record name>`); Confluent's Java class names are accepted too.",
            "strategy"),
    Setting("value.subject.name.strategy", _subject_name_strategy, "TopicNameStrategy",
            "Subject of a value schema, as `key.subject.name.strategy` (`<topic>-value`).",
            "strategy"),
    Setting("key.schema.id.serializer", _schema_id_format, "prefix", "Where registry serdes "
            "write a key's schema id: `prefix` (magic byte 0 + 4-byte id before the payload, "
            "Confluent's classic format) or `header` (the schema's GUID in the "
            "`__key_schema_id` header); Confluent's Java class names are accepted too. Both "
            "formats are always read.", "prefix | header"),
    Setting("value.schema.id.serializer", _schema_id_format, "prefix", "The same for values "
            "(header `__value_schema_id`).", "prefix | header"),
    Setting("platform.delta.root", _delta_root, None, "Root of the runtime's Delta tables "
            "(offset and commit logs, changelogs, snapshots, DLQ mirror, sinks) and of its "
            "side files: a local path, or `s3://bucket/prefix` (or `s3a://`; "
            "docs/cluster.md). Default: .data/delta.", "path or URI"),
    Setting("platform.storage.s3.endpoint", _endpoint, None, "The S3 API's URL for an "
            "`s3://` root on an S3-compatible server (MinIO, Ceph, the local S3 server). "
            "Default: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS's own.", "URL"),
    Setting("platform.storage.s3.region", _optional_string, None, "Region of an `s3://` "
            "root's bucket. Default: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1.",
            "string"),
    Setting("platform.storage.s3.access.key.id", _optional_string, None, "Access key of an "
            "`s3://` root. Default: $AWS_ACCESS_KEY_ID, else each engine's default "
            "credential chain (instance profiles, web identity).", "string"),
    Setting("platform.storage.s3.secret.access.key", _optional_string, None, "Its secret "
            "key. Default: $AWS_SECRET_ACCESS_KEY. Never logged.", "string"),
    Setting("platform.storage.s3.session.token", _optional_string, None, "Session token of "
            "temporary credentials. Default: $AWS_SESSION_TOKEN. Never logged.", "string"),
    Setting("platform.storage.s3.path.style.access", _bool, None, "Path-style requests "
            "(`endpoint/bucket/key`) instead of virtual-hosted ones. Default: true with an "
            "endpoint of one's own, false on AWS.", "boolean"),
    Setting("platform.spark.master", _string, None, "Spark master for the job. Default: "
            "$SPARK_MASTER or local[*].", "string"),
    Setting("auto.offset.reset", _offset_reset, "earliest", "Where a partition the job has "
            "never committed a position of starts (a new job, a partition or source topic added "
            "later, a job reset): earliest, latest (what arrives from the start on), "
            "by_duration:<ISO-8601> (records from that long before the start, by timestamp: "
            "by_duration:PT1H), or none (refuse to start). Kafka Streams' default, earliest.",
            "earliest | latest | none | by_duration:<duration>"),
    Setting("platform.max.records.per.batch", _int(1), 100_000, "Upper bound on the records a "
            "task takes in one micro-batch, over all its partitions (each partition is planned "
            "up to it; a task stops where a partition so cut ends: docs/semantics.md, \"Event "
            "time across partitions and batches\").", "int >= 1"),
    Setting("platform.delta.value.fields", _bool, False, "Delta sinks whose value serde has "
            "a schema (the registry serdes) get a column `value_fields` beside `value`: the "
            "value decoded into the schema's struct, so SQL reads its fields "
            "(`value_fields.amount`); a table written before gains the column "
            "(docs/schema-registry.md).", "boolean"),
    Setting("platform.sink.driver.max.records", _int(0), 50_000, "A job whose tasks read one "
            "Kafka topic (no repartition) takes the direct path (docs/architecture.md): its "
            "tasks read their Kafka ranges themselves, produce its Kafka sinks and DLQ records "
            "themselves, and the driver appends its Delta sinks with delta-rs, instead of "
            "Spark's Kafka source, cache and Delta writer. A batch that plans at most this many "
            "records brings the tasks' rows to the driver through Spark; a bigger one has each "
            "task spill its rows to a file beside the Delta root, streamed into the sinks once "
            "every task reported. 0: always Spark's Kafka source and Delta writer.", "int >= 0"),
    Setting("platform.driver.tasks.max.records", _int(0), 20_000, "With a local master "
            "(local, local[N], local[*]), a batch of such a job (its tasks read one Kafka "
            "topic) that plans at most this many records runs its tasks in the driver process, "
            "one after another, instead of in a Spark job: no job to schedule (~150-250 ms on "
            "2 cores), and the tasks stay open in the driver between batches. Bigger batches, "
            "cluster and Spark Connect masters use Spark. 0: always Spark.", "int >= 0"),
    Setting("platform.driver.tasks.beside.spark", _int(0), 1, "With a local master "
            "(local, local[N], local[*]), a batch of such a job that Spark runs, with more "
            "tasks than the master has slots, runs at most this many of its tasks in the "
            "driver process at the same time: the tasks of Spark's last, partial wave (tasks "
            "mod N), which would otherwise run alone while a core idles. Three tasks on "
            "local[2]: two in Spark, one in the driver, all three at once. 0: every task of "
            "such a batch in Spark.", "int >= 0"),
    Setting("platform.task.cache.idle.ms", _int(0), 60_000, "How long a Spark Python worker "
            "keeps a task open after its batch (stores, deduplication ids, stream time, "
            "punctuation schedules), for the task's next batch. 0: every batch opens its "
            "tasks anew.", "ms >= 0"),
    Setting("platform.claim.lease.ms", _int(1_000), 30_000, "How long a job's claim (one "
            "driver per application.id) outlives its holder's last sign of life; the holder "
            "renews it three times per lease. A holder on this host whose process is gone "
            "loses it at once.", "ms >= 1000"),
    Setting("platform.claim.wait.ms", _int(0), 0, "How long a driver waits for another "
            "driver's claim on the job to end before it gives up with JobClaimedError. "
            "0: fail at once.", "ms >= 0"),
    Setting("platform.upgrade.allow.new.stores", _string_list, (), "Stores that may start "
            "empty although the last commit's stores differ: the start is otherwise refused "
            "when a store of the last commit is gone (this one may be its rename) or a store "
            "moved to another sub-topology (its tasks, and so its state, change). See "
            "docs/upgrades.md.", "list"),
    Setting("platform.upgrade.drop.stores", _string_list, (), "Stores of the last commit "
            "that may be gone from the topology, their state left behind (the start is "
            "otherwise refused); also repartition topics that held records waiting in a "
            "task's buffer at the last commit, those records then dropped. See "
            "docs/upgrades.md.", "list"),
    Setting("platform.upgrade.allow.serde.changes", _string_list, (), "Stores whose kind or "
            "key/value serde may differ from the last commit's: the new serdes then read the "
            "bytes the old ones wrote (the start is otherwise refused); also repartition topics "
            "whose records wait in a task's buffer. See docs/upgrades.md.", "list"),
)  # fmt: skip

# The settings that set a field of each store's StoreOptions (state/rocks.py, TaskStoreOptions);
# rocksdb.config.setter sees them and may change them per store.
STORE_OPTION_SETTINGS: Mapping[str, str] = {
    "platform.rocksdb.block.cache.bytes": "block_cache_bytes",
    "platform.rocksdb.write.buffer.manager.bytes": "write_buffer_manager_bytes",
    "platform.rocksdb.write.buffer.bytes": "write_buffer_bytes",
    "platform.versioned.latest.cache.entries": "latest_cache_entries",
    "platform.versioned.history.cache.bytes": "history_cache_bytes",
}

_CACHE_AND_BUFFERS = (
    "platform.rocksdb.block.cache.bytes",
    "platform.rocksdb.write.buffer.manager.bytes",
)
# Settings whose values are credentials: never shown (repr, logs, Dagster metadata).
SECRET_SETTINGS = frozenset(
    {
        "basic.auth.user.info",
        "platform.storage.s3.secret.access.key",
        "platform.storage.s3.session.token",
    }
)
# The settings a registry serde takes from the job (registry/serdes.py).
REGISTRY_SETTINGS = tuple(s.name for s in SETTINGS if s.name.startswith(
    ("schema.registry.", "basic.auth.", "auto.register.", "use.latest.", "normalize.", "key.",
     "value.")))  # fmt: skip
_BY_NAME = {setting.name: setting for setting in SETTINGS}
_ALIASES = {alias: setting.name for setting in SETTINGS for alias in setting.aliases}


def _tag(key: str, value: Any, errors: list[str]) -> tuple[str, str] | None:
    tag = key[len(CLIENT_TAG_PREFIX) :]
    if not tag:
        errors.append(f"{key}: a client tag needs a key after {CLIENT_TAG_PREFIX!r}")
    elif len(tag) > MAX_TAG_KEY_LENGTH:
        errors.append(f"{key}: tag keys are at most {MAX_TAG_KEY_LENGTH} characters")
    elif not isinstance(value, str) or not value:
        errors.append(f"{key}: expected a non-empty string value")
    elif len(value) > MAX_TAG_VALUE_LENGTH:
        errors.append(f"{key}: tag values are at most {MAX_TAG_VALUE_LENGTH} characters")
    else:
        return tag, value
    return None


class StreamsConfig(Mapping[str, Any]):
    """Validated, frozen settings. ``config["commit.interval.ms"]`` gives the typed value."""

    def __init__(self, settings: Mapping[str, Any] | None = None, **overrides: Any) -> None:
        given = dict(settings or {}) | overrides
        errors: list[str] = []
        values: dict[str, Any] = {}
        tags: dict[str, str] = {}
        passthrough: dict[str, Any] = {}
        seen: set[str] = set()
        for raw_key, value in given.items():
            key = _ALIASES.get(raw_key, raw_key)
            if key.startswith(_CLIENT_TAG_ALIAS):
                key = CLIENT_TAG_PREFIX + key[len(_CLIENT_TAG_ALIAS) :]
            if key in seen:
                errors.append(f"{raw_key}: given twice (directly and through an alias)")
                continue
            seen.add(key)
            if key in _BY_NAME:
                try:
                    values[key] = _BY_NAME[key].parse(value)
                except ValueError as exc:
                    errors.append(f"{raw_key}={value!r}: {exc}")
            elif key.startswith(CLIENT_TAG_PREFIX):
                tag = _tag(raw_key if raw_key == key else key, value, errors)
                if tag is not None:
                    tags[tag[0]] = tag[1]
            elif key in _PASSTHROUGH_KEYS or key.startswith(_PASSTHROUGH_PREFIXES):
                passthrough[key] = value
            else:
                errors.append(_unknown(raw_key))
        for setting in SETTINGS:
            if setting.required and setting.name not in values:
                errors.append(f"{setting.name}: required, not set")
            values.setdefault(setting.name, setting.default)
        if len(tags) > MAX_CLIENT_TAGS:
            errors.append(f"client.tag.*: at most {MAX_CLIENT_TAGS} tags, got {len(tags)}")
        cache, buffers = (values[name] for name in _CACHE_AND_BUFFERS)
        if buffers is None and isinstance(cache, int):
            values[_CACHE_AND_BUFFERS[1]] = max(1, cache // 2)
        elif isinstance(cache, int) and isinstance(buffers, int) and buffers > cache:
            errors.append(
                f"{_CACHE_AND_BUFFERS[1]}={buffers} is more than {_CACHE_AND_BUFFERS[0]}="
                f"{cache}: the memtables are charged to the block cache, which they would "
                "overfill"
            )
        errors += _security_errors(passthrough)
        if errors:
            raise ConfigError("Invalid streamplatform settings:\n  " + "\n  ".join(errors))
        for name in DLQ_DEFAULTED_HANDLERS:
            if values[name] is None:
                dlq = values["errors.dead.letter.queue.topic.name"]
                values[name] = "log_and_continue" if dlq else "log_and_fail"
        if values["commit.interval.ms"] is None:
            eos = values["processing.guarantee"] == "exactly_once_v2"
            values["commit.interval.ms"] = 100 if eos else 30_000
        self._values = values
        self.client_tags: Mapping[str, str] = dict(tags)
        self.client_settings: Mapping[str, Any] = dict(passthrough)

    def __getitem__(self, name: str) -> Any:
        return self._values[_ALIASES.get(name, name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        given = {
            k: "*****" if k in SECRET_SETTINGS else v
            for k, v in self._values.items()
            if v != _BY_NAME[k].default
        }
        return f"StreamsConfig({given!r})"

    def to_dict(self) -> dict[str, Any]:
        """The settings as given-equivalent plain data (canonical names, no unset values),
        e.g. to ship to Spark executors, where ``StreamsConfig(config.to_dict())`` rebuilds it."""
        settings = {k: v for k, v in self._values.items() if v is not None}
        settings |= {CLIENT_TAG_PREFIX + k: v for k, v in self.client_tags.items()}
        return settings | dict(self.client_settings)

    @property
    def exactly_once(self) -> bool:
        return bool(self["processing.guarantee"] == "exactly_once_v2")

    def kafka_settings(self, client: str | None = None) -> dict[str, Any]:
        """Settings for a confluent-kafka client: ``bootstrap.servers``, the shared pass-through
        settings, and for ``client`` = "producer" | "consumer" | "admin" its prefixed ones."""
        if not self["bootstrap.servers"]:
            raise ConfigError("bootstrap.servers: required to run against Kafka, not set")
        settings = {"bootstrap.servers": self["bootstrap.servers"]}
        for key, value in self.client_settings.items():
            prefix, _, rest = key.partition(".")
            if prefix not in _CLIENT_PREFIXES:
                settings[key] = value
            elif prefix == client:
                settings[rest] = value
        return settings


def _security_errors(passthrough: Mapping[str, Any]) -> list[str]:
    """What kafka/security.py refuses in the Kafka security settings (librdkafka's names, an
    unknown protocol, a login module or store neither client can use), as errors."""
    from streamplatform.kafka.security import librdkafka_security  # it imports this module

    shared = {k: v for k, v in passthrough.items() if not k.startswith(_PASSTHROUGH_PREFIXES[2:])}
    try:
        librdkafka_security(shared)
    except ConfigError as error:
        return [str(error)]
    except OSError as error:  # a trust store that cannot be read
        return [f"ssl.truststore.location: {error}"]
    return []


def _unknown(key: str) -> str:
    known = [*_BY_NAME, *_ALIASES]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"{key}: unknown setting{hint}"


def reference_markdown() -> str:
    """The configuration reference, generated from :data:`SETTINGS`."""
    lines = [
        "# Configuration reference",
        "",
        "Generated by `python -m streamplatform.config` from `platform/streamplatform/config.py`.",
        "",
        "| setting | type | default | aliases | meaning |",
        "|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        default = "required" if s.required else ("" if s.default is None else repr(s.default))
        aliases = ", ".join(f"`{a}`" for a in s.aliases)
        type_doc = s.type_doc.replace("|", "\\|")  # a | would end the table cell
        lines.append(f"| `{s.name}` | {type_doc} | {default} | {aliases} | {s.doc} |")
    lines += [
        f"| `client.tag.<key>` | string | | `instance.tag.<key>` | This instance's tags for "
        f"rack-aware standby placement: at most {MAX_CLIENT_TAGS} tags, keys at most "
        f"{MAX_TAG_KEY_LENGTH} and values at most {MAX_TAG_VALUE_LENGTH} characters. |",
        "",
        "Handlers: `log_and_fail`, `log_and_continue`, or an import path `package.module.Class`.",
        "Kafka client settings pass through: `client.id`, `security.protocol`, `sasl.*`, "
        "`ssl.*`, and `producer.*` / `consumer.*` / `admin.*` for one client only.",
        "",
        "## Memory",
        "",
        "A worker process's peak memory is about B + R + the sum of T over the tasks it holds "
        "open: B the interpreter and libraries (~125 MiB for a Spark Python worker); R "
        "RocksDB's block cache shared by all its stores (`platform.rocksdb.block.cache.bytes`, "
        "memtables included) plus ~1.9 bytes per stored key of index and filter blocks; T per "
        "task: `statestore.cache.max.bytes`, which its record caches and deduplications share "
        "(a record cache's Python objects take ~5 times what it counts), its stores' "
        "uncommitted writes (at most `statestore.uncommitted.max.bytes` each, times the Python "
        "objects' factor) and its versioned stores' caches (`platform.versioned.*`). The "
        "measured factors, the tuning of each store through "
        "`rocksdb.config.setter`, and a worked example: [memory.md](memory.md).",
        "",
        "## Defaults that differ from Kafka Streams, and why",
        "",
        "A setting means the same from the Python API (`StreamingJob`, `TopologyTestDriver`), "
        "the CLI (`streamplatform run --set KEY=VALUE`) and Dagster (the job declaration's "
        "`settings`): the defaults below are applied by `StreamsConfig` itself, whichever way "
        "the job starts.",
        "",
        "- `processing.guarantee` defaults to `exactly_once_v2` (Kafka Streams: "
        "`at_least_once`). Exactly once is why teams run their jobs here; `at_least_once` is a "
        "choice to make explicitly. Every progress line, `BatchResult.guarantee`, Dagster "
        "materialization and commit-log row names the guarantee a batch ran under.",
        "- With `errors.dead.letter.queue.topic.name` set, "
        "`default.deserialization.exception.handler` and `processing.exception.handler` default "
        "to `log_and_continue` (Kafka Streams: `log_and_fail`, which writes the DLQ record and "
        "then stops the task). Setting a DLQ topic says where bad records go so that the job "
        "goes on; set `log_and_fail` explicitly to stop at the first one (its DLQ record is "
        "still written). Without a DLQ topic both stay `log_and_fail`, so no record is dropped "
        "silently. `default.production.exception.handler` stays `log_and_fail`: an output that "
        "cannot be written is a fault of the job or the cluster, not of one input record.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference_markdown(), end="")
