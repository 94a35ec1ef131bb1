"""A job whose output depends on the clock, as a user's may (test_deterministic_replays.py).
Only public names of the library."""

from __future__ import annotations

from streamplatform import Processor, PunctuationType, Record, StreamsBuilder
from streamplatform.serdes import Serdes
from streamplatform.state import Stores


class SeenAt(Processor):
    """A processor whose output depends on the clock, as a user's may: each record's time of
    processing (``context.current_system_time_ms()``) goes to its store and downstream, keyed
    by the record's partition and offset, and a wall-clock punctuator writes a "tick" with the
    time it fired. Deterministic only if every attempt of a batch sees the same clock."""

    def init(self, context):
        super().init(context)
        self.seen = context.get_state_store("seen-at")
        context.schedule(1, PunctuationType.WALL_CLOCK_TIME, self.tick)

    def tick(self, now):
        self.seen.put("tick", now)
        self.context.forward(Record("tick", {"tick": now}, now))

    def process(self, record):
        now = self.context.current_system_time_ms()
        key = f"{self.context.partition}/{self.context.offset}"
        self.seen.put(key, now)
        self.context.forward(Record(key, {"seen_at": now}, record.timestamp))


def clock_topology(source: str, sink: str):
    b = StreamsBuilder()
    b.add_state_store(
        Stores.key_value_store_builder(
            Stores.persistent_key_value_store("seen-at"), Serdes.string(), Serdes.long()
        )
    )
    (
        b.stream(source, key_serde=Serdes.string(), value_serde=Serdes.bytes())
        .process(SeenAt, "seen-at")
        .to(sink, key_serde=Serdes.string(), value_serde=Serdes.json())
    )
    return b.build()
