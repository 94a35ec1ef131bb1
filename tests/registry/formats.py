"""The three registry formats as the registry tests use them: a transaction stream
deduplicated by id and joined with the FX rate valid at its time (the README's job), with
Avro, Protobuf or JSON Schema values. The test driver and Spark run the same topology."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from streamplatform import StreamsBuilder, Topology
from streamplatform.serdes import Serde, SerdeContext, Serdes
from streamplatform.state import Stores
from tests.registry.payments_pb2 import Enriched, Payment, Rate

AVRO_TX = """{"type": "record", "name": "Tx", "namespace": "payments",
  "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}"""
# v2 of the transaction: a field added with a default (a backward-compatible change).
AVRO_TX_V2 = """{"type": "record", "name": "Tx", "namespace": "payments",
  "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
             {"name": "currency", "type": "string", "default": "EUR"}]}"""
AVRO_RATE = """{"type": "record", "name": "Rate", "namespace": "payments",
  "fields": [{"name": "rate", "type": "double"}]}"""
AVRO_ENRICHED = """{"type": "record", "name": "Enriched", "namespace": "payments",
  "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"},
             {"name": "eur", "type": "double"}]}"""


def _json_schema(title: str, properties: dict[str, str]) -> str:
    import json

    return json.dumps({
        "$schema": "http://json-schema.org/draft-07/schema#", "title": title, "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties), "additionalProperties": False,
    })  # fmt: skip


JSON_TX = _json_schema("Tx", {"id": "integer", "amount": "number"})
JSON_RATE = _json_schema("Rate", {"rate": "number"})
JSON_ENRICHED = _json_schema("Enriched", {"id": "integer", "amount": "number", "eur": "number"})


@dataclass(frozen=True)
class Format:
    """One registry format: its serdes (new instances each call, as a job's would be) and how
    its values are made and compared."""

    name: str
    tx_serde: Callable[[], Serde]
    rate_serde: Callable[[], Serde]
    enriched_serde: Callable[[], Serde]
    tx: Callable[[int, float], Any]
    rate: Callable[[float], Any]
    plain: Callable[[Any], dict]  # a value as a dict, to compare across formats


def _dict(value: Any) -> dict:
    return dict(value)


def _message(value: Any) -> dict:
    return {field.name: getattr(value, field.name) for field in value.DESCRIPTOR.fields}


AVRO = Format(
    "avro", lambda: Serdes.avro(AVRO_TX), lambda: Serdes.avro(AVRO_RATE),
    lambda: Serdes.avro(AVRO_ENRICHED), lambda i, a: {"id": i, "amount": a},
    lambda r: {"rate": r}, _dict,
)  # fmt: skip
PROTOBUF = Format(
    "protobuf", lambda: Serdes.protobuf(Payment), lambda: Serdes.protobuf(Rate),
    lambda: Serdes.protobuf(Enriched), lambda i, a: Payment(id=i, amount=a),
    lambda r: Rate(rate=r), _message,
)  # fmt: skip
JSON_SCHEMA = Format(
    "json_schema", lambda: Serdes.json_schema(JSON_TX), lambda: Serdes.json_schema(JSON_RATE),
    lambda: Serdes.json_schema(JSON_ENRICHED), lambda i, a: {"id": i, "amount": a},
    lambda r: {"rate": r}, _dict,
)  # fmt: skip
FORMATS = (AVRO, PROTOBUF, JSON_SCHEMA)


def _tx_id(key: Any, value: Any) -> Any:
    return value["id"] if isinstance(value, dict) else value.id


def _joined(tx: Any, rate: Any) -> Any:
    if isinstance(tx, Payment):
        return Enriched(id=tx.id, amount=tx.amount, eur=tx.amount * rate.rate)
    return {"id": tx["id"], "amount": tx["amount"], "eur": tx["amount"] * rate["rate"]}


def enrich_topology(
    fmt: Format,
    rates: str = "fx-rates",
    transactions: str = "transactions",
    enriched: str = "enriched",
) -> Topology:
    """Transactions deduplicated by id within 10 minutes, joined with the rate valid at their
    time (a versioned table: its store keeps the rates in the registry's format too)."""
    b = StreamsBuilder()
    tx = b.stream(transactions, key_serde=Serdes.string(), value_serde=fmt.tx_serde())
    table = b.table(
        rates, key_serde=Serdes.string(), value_serde=fmt.rate_serde(),
        store=Stores.persistent_versioned_key_value_store("rates", timedelta(days=1)),
    )  # fmt: skip
    (
        tx.deduplicate_by_key_value(_tx_id, timedelta(minutes=10))
        .join(table, _joined)
        .to(enriched, key_serde=Serdes.string(), value_serde=fmt.enriched_serde())
    )
    return b.build()


# The inputs' first timestamp: not 0, which a Kafka producer takes for "now".
START = 1_700_000_000_000


def inputs(fmt: Format, count: int = 40) -> tuple[list, list]:
    """Rates (key, value, ts) and transactions (key, value, ts): several records per key,
    every fourth transaction a duplicate of the one before (same key and id), rates changing
    over time."""
    keys = ["alice", "bob", "carol"]
    rates = [(key, fmt.rate(0.5 + i / 10), START + i * 10_000) for i in range(3) for key in keys]
    txs = []
    for i in range(count):
        if i % 4 == 3:
            key, value, _ = txs[-1]
            txs.append((key, value, START + 1_000 * i))
        else:
            txs.append((keys[i % 3], fmt.tx(i, float(i)), START + 1_000 * i))
    return rates, txs


def expected_enriched(fmt: Format) -> list:
    """What the job must give, computed directly from the inputs."""
    rates, txs = inputs(fmt)
    seen, out = set(), []
    for key, value, timestamp in txs:
        tx = fmt.plain(value)
        if (key, tx["id"]) in seen:
            continue
        seen.add((key, tx["id"]))
        valid = [(ts, fmt.plain(r)["rate"]) for k, r, ts in rates if k == key and ts <= timestamp]
        rate = max(valid)[1]
        out.append((key, {"id": tx["id"], "amount": tx["amount"], "eur": tx["amount"] * rate},
                    timestamp))  # fmt: skip
    return out


def poison_values(fmt: Format, registry_url: str, topic: str = "transactions") -> list[bytes]:
    """Four bad transaction values for ``topic``: an unknown schema id, a truncated payload, a
    wrong magic byte, and a payload that does not fit the schema its (registered) id names."""
    good = fmt.tx_serde()
    good.configure({"schema.registry.url": registry_url})
    valid = good.serialize(fmt.tx(7, 7.5), SerdeContext(topic, False, []))
    assert valid is not None
    unknown_id = b"\x00" + struct.pack(">I", 99_999) + valid[5:]
    truncated = valid[:-1] if fmt.name != "json_schema" else valid[:-2]
    wrong_magic = b"\x07" + valid[1:]
    if fmt.name == "avro":  # the id of a schema whose "id" is a string: no resolution to long
        other = Serdes.avro(AVRO_TX.replace('"long"', '"string"'),
                            registry={"schema.registry.url": registry_url})  # fmt: skip
        misfit = other.serialize({"id": "x", "amount": 1.0},
                                 SerdeContext(f"{topic}-other", False, []))  # fmt: skip
    elif fmt.name == "json_schema":  # the right id, a value its schema refuses
        misfit = valid[:5] + b'{"id": "x", "amount": 1.0}'
    else:  # the right id and message index, bytes no Payment parses from (a bad tag)
        misfit = valid[:6] + b"\xff\xff\xff"
    assert misfit is not None
    return [unknown_id, truncated, wrong_magic, misfit]
