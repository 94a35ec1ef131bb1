"""``streamplatform.dlq`` without Kafka or Spark: decoding DLQ records and the preflight that
decides between re-publishing and parking (the task code, in-process)."""

from __future__ import annotations

import pytest

from streamplatform import StreamsBuilder, TopologyTestDriver
from streamplatform.dlq import DlqRecord, SourceCoordinates, preflight, summarize
from streamplatform.dlq.records import REPLAY_ATTEMPT_HEADER, REPLAY_OF_HEADER
from streamplatform.serdes import Serdes

SETTINGS = {
    "application.id": "preflight",
    "errors.dead.letter.queue.topic.name": "dlq",
    "default.deserialization.exception.handler": "log_and_continue",
    "processing.exception.handler": "log_and_continue",
}


def topology(strict: bool):
    """v1 (strict) rejects negative amounts; v2 accepts them."""

    def check(tx: dict) -> dict:
        if strict and tx["amount"] < 0:
            raise ValueError(f"negative amount {tx['amount']}")
        return tx

    b = StreamsBuilder()
    b.stream("tx", Serdes.string(), Serdes.json()).map_values(check).to("out")
    return b.build()


def dead_letters(records: list[tuple[bytes, bytes]]) -> list[DlqRecord]:
    """What v1 sends to its DLQ for ``records``, read back as the replay would."""
    with TopologyTestDriver(topology(strict=True), SETTINGS) as driver:
        source = driver.create_input_topic("tx", Serdes.bytes(), Serdes.bytes())
        for index, (key, value) in enumerate(records):
            source.pipe_raw(key, value, timestamp=1_000 + index, headers=[("trace", b"t")])
        raw = driver.create_output_topic("dlq", Serdes.bytes(), Serdes.bytes())
        return [
            DlqRecord.from_headers(r.key, r.value, r.timestamp, r.headers, dlq_topic="dlq")
            for r in raw.read_records_to_list()
        ]


def test_dlq_records_decode_their_error_headers():
    poison, negative = dead_letters([(b"k", b"{bad"), (b"k", b'{"amount": -5}'),
                                     (b"k", b'{"amount": 5}')])  # fmt: skip
    assert poison.source == SourceCoordinates("tx", 0, 0)
    assert poison.error.exception == "SerializationError"
    assert negative.source.offset == 1 and negative.error.exception == "ValueError"
    assert negative.error.message == "negative amount -5"
    assert negative.original_headers == [("trace", b"t")]  # error headers stripped
    assert "ValueError" in (negative.error.stacktrace or "")
    summary = summarize([poison, negative])
    assert summary.by_exception == {"SerializationError": 1, "ValueError": 1}
    assert summary.by_source_partition == {"tx/0": 2}


def test_a_replayed_record_that_failed_again_knows_its_original_and_attempts():
    headers = [(REPLAY_OF_HEADER, b"tx/2/41"), (REPLAY_ATTEMPT_HEADER, b"2"),
               ("__streams.errors.exception", b"ValueError")]  # fmt: skip
    record = DlqRecord.from_headers(b"k", b"v", 7, headers, SourceCoordinates("tx", 2, 97))
    assert record.original == SourceCoordinates("tx", 2, 41)
    assert record.attempt == 2 and record.source.offset == 97
    assert SourceCoordinates.parse("a/b/3/9") == SourceCoordinates("a/b", 3, 9)


def test_a_dlq_record_without_coordinates_cannot_be_tracked():
    with pytest.raises(ValueError, match="cannot be tracked"):
        DlqRecord.from_headers(b"k", b"v", 0, [])


def test_preflight_passes_what_the_current_topology_handles_and_fails_the_rest():
    poison, negative = dead_letters([(b"k", b"{bad"), (b"k", b'{"amount": -5}')])
    still_strict = preflight(topology(strict=True), SETTINGS, [poison, negative])
    assert [(v.passes, v.exception) for v in still_strict] == [
        (False, "SerializationError"),
        (False, "ValueError"),
    ]
    fixed = preflight(topology(strict=False), SETTINGS, [negative, poison])
    assert [(v.record.source.offset, v.passes, v.outputs) for v in fixed] == [(1, True, 1),
                                                                              (0, False, 0)]  # fmt: skip


def test_preflight_with_a_failing_handler_and_no_dlq_still_says_why():
    settings = {"application.id": "preflight"}  # log_and_fail, no DLQ topic
    _, negative = dead_letters([(b"k", b"{bad"), (b"k", b'{"amount": -1}')])
    [verdict] = preflight(topology(strict=True), settings, [negative])
    assert not verdict.passes and verdict.exception == "ValueError"
    assert "negative amount" in (verdict.message or "")


def test_preflight_parks_records_of_a_topic_the_topology_no_longer_reads():
    record = DlqRecord.from_headers(b"k", b"{}", 0, [], SourceCoordinates("gone", 0, 3))
    [verdict] = preflight(topology(strict=False), SETTINGS, [record])
    assert (verdict.passes, verdict.exception) == (False, "TopicNotRead")


def test_a_record_that_failed_after_a_repartition_is_parked_with_the_reason():
    b = StreamsBuilder()
    stream = b.stream("tx", Serdes.string(), Serdes.json())
    stream.deduplicate(lambda k, v: v["id"], 60_000).map_values(lambda v: v["amount"] + 1).to("out")
    repartitioned = b.build()
    (internal,) = repartitioned.repartition_topics(SETTINGS["application.id"])
    with TopologyTestDriver(repartitioned, SETTINGS) as driver:
        source = driver.create_input_topic("tx", Serdes.bytes(), Serdes.bytes())
        source.pipe_raw(b"k", b'{"id": 1, "amount": "x"}', timestamp=1_000)  # fails downstream
        raw = driver.create_output_topic("dlq", Serdes.bytes(), Serdes.bytes())
        (record,) = [
            DlqRecord.from_headers(r.key, r.value, r.timestamp, r.headers, dlq_topic="dlq")
            for r in raw.read_records_to_list()
        ]
    assert (
        record.source.topic == internal
    )  # docs/semantics.md: the record that entered the sub-topology
    (verdict,) = preflight(repartitioned, SETTINGS, [record])
    assert not verdict.passes
    assert verdict.exception == "RepartitionedRecord"
    assert internal in (verdict.message or "")
