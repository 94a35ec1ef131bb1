"""Foreign-key table-table joins (Kafka Streams' KIP-213): ``left.join(right, extractor,
joiner)`` and ``left.left_join(right, extractor, joiner)``, record by record as Kafka Streams'
processors in ``kstream/internals/foreignkeyjoin/`` do.

Each left value names a right key (its foreign key, ``extractor(value)`` or ``extractor(key,
value)``). The two tables need not be co-partitioned: the left side subscribes each left key
to its foreign key through an internal topic keyed by the foreign key, read next to the right
table; the right side answers through a second internal topic keyed by the left key, read next
to the left table. So the topology has two sub-topologies that each read what the other
writes (a cycle), and five processors:

- left sub-topology: ``SubscriptionSend`` (Kafka Streams' ``SubscriptionSendProcessorSupplier``)
  turns each left update into subscription records (subscribe to the new foreign key, and
  unsubscribe from the old one when it changed), each carrying the left key, an instruction and
  a 128-bit hash of the new left value's bytes;
- right sub-topology: ``SubscriptionReceive`` keeps the subscriptions in a store keyed by
  (foreign key, left key), so that ``ForeignTableJoin`` finds a right key's subscribers by a
  prefix scan when the right table changes; ``SubscriptionJoin`` answers each new subscription
  with the right value it finds (or nothing, per the instruction);
- left sub-topology again: ``ResponseJoin`` (``ResponseJoinProcessorSupplier``) joins each
  response with the left key's current value, and drops the response when the hash it carries
  is not the hash of that value: the left value changed since, and a newer response is coming
  (or came already). The result node (``-result``) passes the joined values on, and writes
  them into ``store=`` when one is given (Kafka Streams' ``Materialized``).

**Why the join keeps its own copies of both tables.** Kafka Streams reads the left table's
old values (it enables "send old values") and both tables' current values through value
getters; our tables forward new values only and a derived table (``filter``, ``map_values``,
a join) has no store. So ``SubscriptionSend`` keeps the left values it saw (left key -> value
bytes: the old value of the next update, and the current value ``ResponseJoin`` hashes), and
``ForeignTableJoin`` keeps the right values it saw (foreign key -> 8-byte timestamp + value
bytes, for ``SubscriptionJoin``'s lookups and the result's timestamp).

**The hash.** Kafka Streams hashes the serialized left value with Murmur3 (128 bits); the hash
only travels between our own processors through our own internal topics and is only compared
for equality, so we use BLAKE2b (128 bits, in the standard library). The internal topics' bytes
are ours too (``SubscriptionSerde``, ``ResponseSerde``): the topology is not wire-compatible
with a Kafka Streams application's, as none of ours is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from streamplatform.dsl.graph import ProcessorNode, SinkNode, SourceNode
from streamplatform.dsl.join import TableSource
from streamplatform.dsl.printing import key_joiner, takes_key
from streamplatform.dsl.processor import PassThrough, Processor, ProcessorContext, engine_store
from streamplatform.records import Record
from streamplatform.serdes import Serde, Serdes, SerializationError
from streamplatform.state import Stores
from streamplatform.state.stores import KeyValueStoreSpec

if TYPE_CHECKING:
    from streamplatform.dsl.ktable import KTable

# SubscriptionWrapper.Instruction, in Kafka Streams' order.
DELETE_KEY_AND_PROPAGATE = 0  # unsubscribe, and answer with no right value (a tombstone)
DELETE_KEY_NO_PROPAGATE = 1  # unsubscribe only (the new foreign key's answer follows)
PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE = 2  # subscribe; answer even when there is no right value
PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE = 3  # subscribe; answer only when there is a right value
_DELETES = (DELETE_KEY_AND_PROPAGATE, DELETE_KEY_NO_PROPAGATE)

_VERSION = 0  # the first byte of both wrappers, for a later change of their layout
_HAS_HASH, _HAS_VALUE = 1, 2  # the flags byte of both wrappers
_HASH_SIZE = 16
_LENGTH = struct.Struct(">i")
_TIMESTAMP = struct.Struct(">q")


def value_hash(value_bytes: bytes | None) -> bytes | None:
    """The hash of a left value's bytes (None for no value); see the module's docstring."""
    if value_bytes is None:
        return None
    return hashlib.blake2b(value_bytes, digest_size=_HASH_SIZE).digest()


def combined_key(foreign_key: bytes, primary_key: bytes) -> bytes:
    """The subscription store's key, as Kafka Streams' CombinedKeySchema lays it out: the
    foreign key's length (4 bytes, big-endian), its bytes, then the left key's bytes. A
    right key's subscribers are then the keys that start with ``combined_key(fk, b"")``."""
    return _LENGTH.pack(len(foreign_key)) + foreign_key + primary_key


class Subscription(NamedTuple):
    """Kafka Streams' ``SubscriptionWrapper``: what a left update asks of the right side."""

    hash: bytes | None  # of the left value that sent it; None when it was a tombstone
    instruction: int
    primary_key: Any  # the left key
    # The left task's partition: the answers go back to it (Kafka Streams' primaryPartition),
    # whatever partitioner wrote the left table's topic.
    primary_partition: int = -1


class SubscriptionSerde:
    """The subscription topic's value serde: version, flags, instruction, the hash (when
    present), then the left key's bytes in ``key_serde``."""

    def __init__(self, key_serde: Serde) -> None:
        self.key_serde = key_serde
        self.name = f"fk-subscription({key_serde.name})"

    def serialize(self, subscription: Subscription | None) -> bytes | None:
        if subscription is None:
            return None
        flags = _HAS_HASH if subscription.hash is not None else 0
        key = self.key_serde.serialize(subscription.primary_key) or b""
        head = bytes((_VERSION, flags, subscription.instruction))
        partition = _LENGTH.pack(subscription.primary_partition)
        return head + partition + (subscription.hash or b"") + key

    def deserialize(self, data: bytes | None) -> Subscription | None:
        if data is None:
            return None
        data = bytes(data)
        if len(data) < 3 or data[0] != _VERSION:
            raise SerializationError("not a foreign-key join's subscription", raw=data)
        partition = _LENGTH.unpack_from(data, 3)[0]
        start = 7 + (_HASH_SIZE if data[1] & _HAS_HASH else 0)
        hashed = data[7:start] if data[1] & _HAS_HASH else None
        return Subscription(hashed, data[2], self.key_serde.deserialize(data[start:]), partition)


class Response(NamedTuple):
    """Kafka Streams' ``SubscriptionResponseWrapper``: the right value for a left key."""

    hash: bytes | None  # the subscription's, echoed back
    foreign_value: Any  # None: the right table has no value for the foreign key
    primary_partition: int = -1  # the subscription's: where the answer goes


def response_partition(key: Any, response: Response | None, partitions: int) -> int | None:
    """The response topic's partitioner: the partition of the left task that subscribed
    (None: by the key, as a repartition topic's, for an answer without one)."""
    if response is None or response.primary_partition < 0:
        return None
    return response.primary_partition % partitions


class ResponseSerde:
    """The response topic's value serde: version, flags, the hash (when present), then the
    right value's bytes in ``value_serde`` (when present)."""

    def __init__(self, value_serde: Serde) -> None:
        self.value_serde = value_serde
        self.name = f"fk-response({value_serde.name})"

    def serialize(self, response: Response | None) -> bytes | None:
        if response is None:
            return None
        value = None
        if response.foreign_value is not None:
            value = self.value_serde.serialize(response.foreign_value) or b""
        flags = (_HAS_HASH if response.hash is not None else 0) | (
            _HAS_VALUE if value is not None else 0
        )
        partition = _LENGTH.pack(response.primary_partition)
        return bytes((_VERSION, flags)) + partition + (response.hash or b"") + (value or b"")

    def deserialize(self, data: bytes | None) -> Response | None:
        if data is None:
            return None
        data = bytes(data)
        if len(data) < 2 or data[0] != _VERSION:
            raise SerializationError("not a foreign-key join's response", raw=data)
        partition = _LENGTH.unpack_from(data, 2)[0]
        start = 6 + (_HASH_SIZE if data[1] & _HAS_HASH else 0)
        hashed = data[6:start] if data[1] & _HAS_HASH else None
        value = self.value_serde.deserialize(data[start:]) if data[1] & _HAS_VALUE else None
        return Response(hashed, value, partition)


def _foreign_key_function(extractor: Callable[..., Any]) -> Callable[[Any, Any], Any]:
    """``extractor`` as ``(key, value) -> foreign key``: itself when it takes two arguments
    (Kafka Streams 4's ``BiFunction`` extractor), else one that passes the value only."""
    if takes_key(extractor, 1):
        return extractor

    def of_value(key: Any, value: Any) -> Any:
        return extractor(value)

    return of_value


def _key_join(
    joiner: Callable[..., Any], value_serde: Serde | None = None, name: str | None = None
) -> None:
    """The arguments of ``join(other, joiner, ...)`` on the key (for join_arguments)."""


def _foreign_key_join(
    foreign_key_extractor: Callable[..., Any],
    joiner: Callable[..., Any],
    value_serde: Serde | None = None,
    name: str | None = None,
    store: KeyValueStoreSpec | None = None,
) -> None:
    """The arguments of ``join(other, foreign_key_extractor, joiner, ...)`` (join_arguments)."""


def join_arguments(
    operation: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any] | None, Callable[..., Any], Serde | None, str | None, Any]:
    """``KTable.join``'s (or ``left_join``'s) arguments after ``other``, as (foreign key
    extractor or None, joiner, value_serde, name, store). As Kafka Streams' overloads: a
    second function after the first (or ``foreign_key_extractor=``) makes it a foreign-key
    join; a serde there is the key join's ``value_serde``."""
    second = args[1] if len(args) > 1 else None
    foreign = (
        "foreign_key_extractor" in kwargs
        or (callable(second) and not hasattr(second, "serialize"))
        or (len(args) == 1 and "joiner" in kwargs)  # join(other, extractor, joiner=...)
    )
    signature = inspect.signature(_foreign_key_join if foreign else _key_join)
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TypeError(
            f"{operation}: takes (other, joiner, value_serde=, name=) on the key, or (other, "
            f"foreign_key_extractor, joiner, value_serde=, name=, store=) on a foreign key: "
            f"{error}"
        ) from None
    bound.apply_defaults()
    given = bound.arguments
    extractor = given["foreign_key_extractor"] if foreign else None
    store = given["store"] if foreign else None
    return extractor, given["joiner"], given["value_serde"], given["name"], store


class SubscriptionSend(Processor):
    """Kafka Streams' ``SubscriptionSendProcessorSupplier``: each left update as subscription
    records keyed by foreign key. ``store``: left key -> the left value's bytes (its old value
    for the next update; ResponseJoin reads the current one)."""

    dropped_records: int = 0  # updates whose foreign key is None (inner join)

    def __init__(
        self,
        store_name: str,
        key_serde: Serde,
        value_serde: Serde,
        foreign_key_serde: Serde,
        foreign_key: Callable[[Any, Any], Any],
        left_join: bool,
    ) -> None:
        self.store_name = store_name
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.foreign_key_serde = foreign_key_serde
        self.foreign_key = foreign_key
        self.left_join = left_join

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)
        # The task's partition ("<sub-topology>_<partition>"), which the answers come back to.
        self.partition = int(str(context.task_id).rsplit("_", 1)[1])  # "<sub-topology>_<n>"

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def process(self, record: Record) -> None:
        raw_key = self.key_serde.serialize(record.key)
        if raw_key is None:
            return  # a table has no None key (its source drops them)
        transaction = self.store.transaction
        old_bytes = transaction.get(raw_key)
        new_bytes = None if record.value is None else self.value_serde.serialize(record.value)
        if new_bytes is None:
            if old_bytes is not None:
                transaction.delete(raw_key)
        else:
            transaction.put(raw_key, new_bytes)
        old = None if old_bytes is None else self.value_serde.deserialize(old_bytes)
        new = None if new_bytes is None else record.value
        new_hash = value_hash(new_bytes)
        key = record.key

        partition = self.partition

        def send(foreign_key: Any, instruction: int) -> None:
            subscription = Subscription(new_hash, instruction, key, partition)
            self.context.forward(record._replace(key=foreign_key, value=subscription))

        if self.left_join:
            self._left_join(key, old, new, send)
        else:
            self._inner_join(key, old, new, send)

    def _left_join(self, key: Any, old: Any, new: Any, send: Callable[[Any, int], None]) -> None:
        """``leftJoinInstructions``: a None foreign key subscribes too (its answer is the
        left value with no right value)."""
        if old is not None:
            old_fk = self.foreign_key(key, old)
            new_fk = None if new is None else self.foreign_key(key, new)
            if old_fk is not None and not self._same(old_fk, new_fk):
                send(old_fk, DELETE_KEY_AND_PROPAGATE)
            send(new_fk, PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE)
        elif new is not None:
            send(self.foreign_key(key, new), PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE)

    def _inner_join(self, key: Any, old: Any, new: Any, send: Callable[[Any, int], None]) -> None:
        """``defaultJoinInstructions``: an update with a None foreign key (old or new) is
        dropped; a new foreign key answers only when the right side has a value for it,
        a changed one answers in any case (its previous result must be deleted)."""
        if old is not None:
            old_fk = self.foreign_key(key, old)
            if old_fk is None:
                self.dropped_records += 1
                return
            if new is None:
                send(old_fk, DELETE_KEY_AND_PROPAGATE)
                return
            new_fk = self.foreign_key(key, new)
            if new_fk is None:
                self.dropped_records += 1
                return
            if not self._same(old_fk, new_fk):
                send(old_fk, DELETE_KEY_NO_PROPAGATE)
            send(new_fk, PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE)
        elif new is not None:
            new_fk = self.foreign_key(key, new)
            if new_fk is None:
                self.dropped_records += 1
                return
            send(new_fk, PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE)

    def _same(self, one: Any, other: Any) -> bool:
        """Foreign keys compare as their bytes, as in Kafka Streams."""
        serialize = self.foreign_key_serde.serialize
        return serialize(one) == serialize(other)


class SubscriptionReceive(Processor):
    """Kafka Streams' ``SubscriptionReceiveProcessorSupplier``: keeps (or, for an
    unsubscription, deletes) each subscription in the subscription store, then passes it on
    keyed by (foreign key, left key). A None foreign key is not stored (nothing can answer it)
    and goes on only to be answered with no right value (a left join's)."""

    dropped_records: int = 0

    def __init__(self, store_name: str, foreign_key_serde: Serde, key_serde: Serde) -> None:
        self.store_name = store_name
        self.foreign_key_serde = foreign_key_serde
        self.serde = SubscriptionSerde(key_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.store_name)

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def process(self, record: Record) -> None:
        subscription: Subscription | None = record.value
        if subscription is None:
            self.dropped_records += 1
            return
        foreign_key = record.key
        if foreign_key is not None:
            raw_fk = self.foreign_key_serde.serialize(foreign_key) or b""
            raw_pk = self.serde.key_serde.serialize(subscription.primary_key) or b""
            key = combined_key(raw_fk, raw_pk)
            transaction = self.store.transaction
            if subscription.instruction in _DELETES:
                transaction.delete(key)
            else:
                transaction.put(key, self.serde.serialize(subscription))
        elif subscription.instruction != PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
            self.dropped_records += 1
            return
        self.context.forward(record._replace(key=(foreign_key, subscription.primary_key)))


def _right_value(stored: bytes | None, value_serde: Serde) -> tuple[Any, int] | None:
    """A right value and its timestamp from ForeignTableJoin's store, or None."""
    if stored is None:
        return None
    return value_serde.deserialize(stored[_TIMESTAMP.size :]), _TIMESTAMP.unpack_from(stored)[0]


class SubscriptionJoin(Processor):
    """Kafka Streams' ``SubscriptionJoinProcessorSupplier``: answers a subscription with the
    right value of its foreign key, keyed by the left key, timestamped with the later of the
    subscription's and the right value's timestamps."""

    def __init__(self, right_store: str, foreign_key_serde: Serde, value_serde: Serde) -> None:
        self.right_store = right_store
        self.foreign_key_serde = foreign_key_serde
        self.value_serde = value_serde

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.right_store)

    def process(self, record: Record) -> None:
        foreign_key, primary_key = record.key
        subscription: Subscription = record.value
        found = None
        if foreign_key is not None:
            raw_fk = self.foreign_key_serde.serialize(foreign_key) or b""
            found = _right_value(self.store.transaction.get(raw_fk), self.value_serde)
        timestamp = record.timestamp if found is None else max(record.timestamp, found[1])
        instruction = subscription.instruction
        if instruction == DELETE_KEY_NO_PROPAGATE:
            return
        if instruction == PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE and found is None:
            return
        value = None
        if instruction != DELETE_KEY_AND_PROPAGATE and found is not None:
            value = found[0]
        response = Response(subscription.hash, value, subscription.primary_partition)
        self.context.forward(record._replace(key=primary_key, value=response, timestamp=timestamp))


class ForeignTableJoin(Processor):
    """Kafka Streams' ``ForeignTableJoinProcessorSupplier``: each right update answers every
    left key subscribed to its key (a prefix scan of the subscription store), with the
    update's value (None for a tombstone) and timestamp. It also keeps the right values
    (``right_store``: foreign key -> 8-byte timestamp + value bytes) for SubscriptionJoin."""

    def __init__(
        self,
        right_store: str,
        subscription_store: str,
        foreign_key_serde: Serde,
        value_serde: Serde,
        key_serde: Serde,
    ) -> None:
        self.right_store = right_store
        self.subscription_store = subscription_store
        self.foreign_key_serde = foreign_key_serde
        self.value_serde = value_serde
        self.serde = SubscriptionSerde(key_serde)

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.values = engine_store(context, self.right_store)
        self.subscriptions = engine_store(context, self.subscription_store)

    def process(self, record: Record) -> None:
        raw_fk = self.foreign_key_serde.serialize(record.key)
        if raw_fk is None:
            return  # a table has no None key (its source drops them)
        values = self.values.transaction
        if record.value is None:
            values.delete(raw_fk)
        else:
            value_bytes = self.value_serde.serialize(record.value) or b""
            values.put(raw_fk, _TIMESTAMP.pack(record.timestamp) + value_bytes)
        prefix = combined_key(raw_fk, b"")
        subscribers = list(self.subscriptions.transaction.prefix(prefix))
        for _key, stored in subscribers:
            subscription = self.serde.deserialize(stored)
            assert subscription is not None
            response = Response(subscription.hash, record.value, subscription.primary_partition)
            self.context.forward(record._replace(key=subscription.primary_key, value=response))


class ResponseJoin(Processor):
    """Kafka Streams' ``ResponseJoinProcessorSupplier``: joins a response with the left key's
    current value, unless the response was sent for another value (its hash differs: the
    left key changed since, so the response is stale and dropped). No right value gives a
    tombstone, except in a left join for a key that has a left value."""

    dropped_records: int = 0  # stale responses

    def __init__(
        self,
        left_store: str,
        key_serde: Serde,
        value_serde: Serde,
        joiner: Callable[[Any, Any, Any], Any],
        left_join: bool,
    ) -> None:
        self.left_store = left_store
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.joiner = joiner
        self.left_join = left_join

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self.store = engine_store(context, self.left_store)

    def task_metrics(self) -> dict[str, int]:
        return {"dropped_records": self.dropped_records}

    def process(self, record: Record) -> None:
        response: Response | None = record.value
        raw_key = self.key_serde.serialize(record.key)
        if response is None or raw_key is None:
            self.dropped_records += 1
            return
        current_bytes = self.store.transaction.get(raw_key)
        if response.hash != value_hash(current_bytes):
            self.dropped_records += 1
            return
        current = None if current_bytes is None else self.value_serde.deserialize(current_bytes)
        if response.foreign_value is None and (not self.left_join or current is None):
            result = None
        else:
            result = self.joiner(record.key, current, response.foreign_value)
        self.context.forward(record._replace(value=result))


def foreign_key_join(
    left: KTable,
    right: KTable,
    extractor: Callable[..., Any],
    joiner: Callable[..., Any],
    left_join: bool,
    value_serde: Serde | None,
    name: str | None,
    store: KeyValueStoreSpec | None,
) -> KTable:
    """The nodes, internal topics and stores of a foreign-key join (the module's docstring),
    named after ``name`` (generated when not given) as Kafka Streams names them after
    ``TableJoined.as(name)``; a KTable of the results."""
    from streamplatform.dsl.ktable import KTable

    if not isinstance(right, KTable):
        raise TypeError(f"join: a table joins a KTable, got {type(right).__name__}")
    if right._builder is not left._builder:
        raise ValueError("join: the other table belongs to another StreamsBuilder")
    for what, function in (("foreign_key_extractor", extractor), ("joiner", joiner)):
        if not callable(function):
            raise TypeError(f"join: {what} must be callable, got {function!r}")
    if store is not None and not isinstance(store, KeyValueStoreSpec):
        raise TypeError("join: store= takes a key-value store (Stores.persistent_key_value_store)")
    for side, table in (("this", left), ("the other", right)):
        if table._versioned():
            raise ValueError(
                f"join: {side} table is versioned; a foreign-key join takes tables with a plain "
                "key-value store (Kafka Streams' versioned semantics are not implemented here)"
            )
    # Kafka Streams asks both tables for old values: a filter then forwards no update from no
    # value to no value (no subscription, no prefix scan for it).
    left._send_old_values()
    right._send_old_values()
    builder = left._builder
    base = name or builder.new_name("KTABLE-FK-JOIN")
    key_serde, value_serde_left = left.key_serde, left.value_serde
    fk_serde, right_value_serde = right.key_serde, right.value_serde
    result_serde = value_serde or left.value_serde
    foreign_key = _foreign_key_function(extractor)
    joiner3 = key_joiner(joiner)

    left_values = builder.add_store(
        Stores.persistent_key_value_store(f"{base}-LEFT-STATE-STORE"), key_serde, value_serde_left
    )
    right_values = builder.add_store(
        Stores.persistent_key_value_store(f"{base}-RIGHT-STATE-STORE"), fk_serde
    )
    # Typed as bytes: its keys are combined keys (combined_key), its values subscriptions.
    subscription_spec = dataclasses.replace(
        Stores.persistent_key_value_store(f"{base}-SUBSCRIPTION-STATE-STORE"),
        key_serde=Serdes.bytes(),
        value_serde=Serdes.bytes(),
    )
    subscriptions = builder.add_store(subscription_spec)

    # Left: subscribe, through the subscription topic (keyed by foreign key).
    send = ProcessorNode(
        f"{base}-subscription-registration-processor",
        lambda: SubscriptionSend(
            left_values, key_serde, value_serde_left, fk_serde, foreign_key, left_join
        ),  # fmt: skip
        (left_values,),
    )
    builder.add_node(send, parents=[left._node])
    subscription_serde = SubscriptionSerde(key_serde)
    registration = f"{base}-subscription-registration-topic"
    builder.add_node(
        SinkNode(
            f"{base}-subscription-registration-sink",
            registration,
            fk_serde,
            subscription_serde,
            internal=True,
        ),  # fmt: skip
        parents=[send.name],
    )
    registered = SourceNode(f"{base}-subscription-registration-source", registration, fk_serde,
                            subscription_serde, internal=True)  # fmt: skip
    builder.add_node(registered, parents=[])

    # Right: store the subscriptions, answer them, and answer them again when the right
    # table changes, through the response topic (keyed by the left key).
    receive = ProcessorNode(
        f"{base}-subscription-receive",
        lambda: SubscriptionReceive(subscriptions, fk_serde, key_serde),
        (subscriptions,),
    )
    builder.add_node(receive, parents=[registered.name])
    answer = ProcessorNode(
        f"{base}-subscription-join-foreign",
        lambda: SubscriptionJoin(right_values, fk_serde, right_value_serde),
        (right_values,),
    )
    builder.add_node(answer, parents=[receive.name])
    foreign = ProcessorNode(
        f"{base}-foreign-join-subscription",
        lambda: ForeignTableJoin(
            right_values, subscriptions, fk_serde, right_value_serde, key_serde
        ),  # fmt: skip
        (right_values, subscriptions),
    )
    builder.add_node(foreign, parents=[right._node])
    response_serde = ResponseSerde(right_value_serde)
    response_topic = f"{base}-subscription-response-topic"
    builder.add_node(
        SinkNode(
            f"{base}-subscription-response-sink",
            response_topic,
            key_serde,
            response_serde,
            internal=True,
            partitioner=response_partition,
        ),  # fmt: skip
        parents=[answer.name, foreign.name],
    )
    responses = SourceNode(f"{base}-subscription-response-source", response_topic, key_serde,
                           response_serde, internal=True)  # fmt: skip
    builder.add_node(responses, parents=[])

    # Left again: join the responses that are not stale.
    resolve = ProcessorNode(
        f"{base}-subscription-response-resolver",
        lambda: ResponseJoin(left_values, key_serde, value_serde_left, joiner3, left_join),
        (left_values,),
    )
    builder.add_node(resolve, parents=[responses.name])
    result: ProcessorNode
    if store is None:
        result = ProcessorNode(f"{base}-result", PassThrough)
    else:
        if store.key_serde is None and store.value_serde is None:
            store = dataclasses.replace(store, key_serde=key_serde, value_serde=result_serde)
        result_store = builder.add_store(store, key_serde, result_serde)
        result = ProcessorNode(
            f"{base}-result",
            lambda: TableSource(result_store, key_serde, result_serde),
            (result_store,),
        )
    builder.add_node(result, parents=[resolve.name])
    table = KTable(builder, result.name, store.name if store else left_values, key_serde,
                   result_serde)  # fmt: skip
    # Not joinable by a stream unless stored (store=); another table joins it (table_join.py
    # keeps its own copy of both sides).
    table._materialized = store is not None
    return table
