"""Kafka transactions on the local broker: what the exactly-once runtime relies on."""

from __future__ import annotations

from streamplatform.kafka import TopicSpec, consumer, create_topics, producer


def _read_all(settings, topic, isolation_level, expected_at_least, group):
    reader = consumer(settings, group, **{"isolation.level": isolation_level})
    reader.subscribe([topic])
    values = []
    try:
        for _ in range(100):  # bounded: at most 100 polls of 0.5 s
            message = reader.poll(0.5)
            if message is None:
                if len(values) >= expected_at_least:
                    break
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
    finally:
        reader.close()
    return sorted(values)


def test_aborted_records_are_invisible_to_read_committed(kafka_settings, topic_name):
    create_topics(kafka_settings, [TopicSpec(topic_name, partitions=1)])
    writer = producer(kafka_settings, **{"transactional.id": f"{topic_name}-tx"})
    writer.init_transactions(30)

    writer.begin_transaction()
    for value in (b"aborted-1", b"aborted-2", b"aborted-3"):
        writer.produce(topic_name, value=value)
    writer.flush(10)
    writer.abort_transaction(30)

    writer.begin_transaction()
    for value in (b"committed-1", b"committed-2"):
        writer.produce(topic_name, value=value)
    writer.commit_transaction(30)

    committed = _read_all(kafka_settings, topic_name, "read_committed", 2, "g-committed")
    assert committed == [b"committed-1", b"committed-2"]
    # The aborted records are in the log: a read_uncommitted reader sees all five.
    everything = _read_all(kafka_settings, topic_name, "read_uncommitted", 5, "g-uncommitted")
    assert everything == sorted(
        [b"aborted-1", b"aborted-2", b"aborted-3", b"committed-1", b"committed-2"]
    )


def test_producer_partitions_keys_like_java_clients(kafka_settings, topic_name):
    from streamplatform.runtime.partitioner import partition_for

    create_topics(kafka_settings, [TopicSpec(topic_name, partitions=7)])
    writer = producer(kafka_settings)
    delivered = {}

    def remember(error, message):
        assert error is None
        delivered[message.key()] = message.partition()

    for key in (b"USD", b"GBP", b"JPY", b"acct-001", b"x"):
        writer.produce(topic_name, key=key, value=b"v", on_delivery=remember)
    assert writer.flush(10) == 0
    assert delivered == {key: partition_for(key, 7) for key in delivered}
