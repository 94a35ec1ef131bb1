"""A job's fingerprint: what decides the output of a batch, hashed.

A batch planned but not committed (a crash) is run again. The re-run's outputs only match
what its first attempt may already have written if the job is the same: the same topology,
the same code in its functions and processors, the same settings that change what a task
does. The fingerprint is logged with each plan (the offset log), and a replay under another
fingerprint is refused (``streamplatform.ReplayRefused``).

What it covers: the topology's structure (``describe()``), the bytecode, constants and
captured values of every function, processor class and serde reachable from its nodes and
stores, including the functions and classes they call by global name (an object with a
``__fingerprint__()`` method by what that returns), and the settings in ``OUTPUT_SETTINGS``
(and ``REGISTRY_OUTPUT_SETTINGS`` when not at their defaults). It leaves out where and how
fast the job runs (brokers, Spark master, Delta root, state dir, batch size, claim timings,
the registry's address). It is a best effort over Python objects:
code reached through a module attribute, or inside a library the topology calls, is not
followed.
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Iterable, Mapping
from typing import Any

from streamplatform.dsl.topology import Topology

OUTPUT_SETTINGS = (
    "application.id",
    "processing.guarantee",
    "default.deserialization.exception.handler",
    "processing.exception.handler",
    "default.production.exception.handler",
    "errors.dead.letter.queue.topic.name",
    "statestore.uncommitted.max.records",
    "statestore.uncommitted.max.bytes",
)
# The registry serdes' settings that change the bytes they write (where the schema id goes,
# under which subject, with which schema), with their defaults.
REGISTRY_OUTPUT_SETTINGS = {
    "key.schema.id.serializer": "prefix",
    "value.schema.id.serializer": "prefix",
    "key.subject.name.strategy": "TopicNameStrategy",
    "value.subject.name.strategy": "TopicNameStrategy",
    "use.latest.version": False,
    "normalize.schemas": False,
}
_MAX_DEPTH = 12


def job_fingerprint(
    topology: Topology, settings: Mapping[str, Any], delta_sinks: Iterable[str] = ()
) -> str:
    """A hex digest of the topology, its code, the output-deciding settings and which sink
    topics are Delta tables (the rest go to Kafka)."""
    digest = hashlib.sha256()
    digest.update(topology.describe().encode())
    walker = _Walker(digest)
    for name in sorted(topology.nodes):
        walker.feed(topology.nodes[name])
    for name in sorted(topology.stores):
        walker.feed(topology.stores[name])
    for name in OUTPUT_SETTINGS:
        digest.update(f"{name}={settings.get(name)!r};".encode())
    for name, default in REGISTRY_OUTPUT_SETTINGS.items():
        # Only when changed: the digest of the jobs fingerprinted before these counted.
        if settings.get(name, default) != default:
            digest.update(f"{name}={settings.get(name)!r};".encode())
    sinks = sorted(delta_sinks)
    if sinks:  # (no Delta sink: the digest of the jobs fingerprinted before sinks counted)
        digest.update(f"delta_sinks={sinks!r};".encode())
    return digest.hexdigest()


class _Walker:
    """Feeds a stable description of an object graph to a hash: code by its bytecode and
    constants, objects by their class and attributes; never an id or an address."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.seen: set[int] = set()

    def put(self, text: str) -> None:
        self.digest.update(text.encode())
        self.digest.update(b"\0")

    def feed(self, value: Any, depth: int = 0) -> None:  # noqa: C901 (one case per kind)
        if depth > _MAX_DEPTH:
            self.put("...")
            return
        if value is None or isinstance(value, bool | int | float | str | bytes):
            self.put(repr(value))
            return
        if id(value) in self.seen:
            self.put("<seen>")
            return
        self.seen.add(id(value))
        deeper = depth + 1
        if isinstance(value, types.CodeType):
            self.put(f"code {value.co_name}")
            self.digest.update(value.co_code)
            for name in value.co_names:
                self.put(name)
            for constant in value.co_consts:
                self.feed(constant, deeper)
        elif isinstance(value, types.FunctionType):
            self.put(f"function {value.__module__}.{value.__qualname__}")
            self.feed(value.__code__, deeper)
            for default in value.__defaults__ or ():
                self.feed(default, deeper)
            for cell in value.__closure__ or ():
                try:
                    self.feed(cell.cell_contents, deeper)
                except ValueError:  # an empty cell
                    self.put("<empty>")
            # The functions and classes it calls by global name (a helper the fix went into).
            for name in sorted(_global_names(value.__code__)):
                called = value.__globals__.get(name)
                if isinstance(called, types.FunctionType | type):
                    self.put(f"global {name}")
                    self.feed(called, deeper)
        elif isinstance(value, types.MethodType):
            self.feed(value.__func__, deeper)
            self.feed(value.__self__, deeper)
        elif isinstance(value, types.BuiltinFunctionType | types.ModuleType):
            self.put(f"{type(value).__name__} {getattr(value, '__qualname__', value.__name__)}")
        elif isinstance(value, type):
            self._feed_class(value, deeper)
        elif isinstance(value, list | tuple | set | frozenset):
            self.put(type(value).__name__)
            items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
            for item in items:
                self.feed(item, deeper)
        elif isinstance(value, dict):
            self.put("dict")
            for key in sorted(value, key=repr):
                self.feed(key, deeper)
                self.feed(value[key], deeper)
        elif isinstance(value, functools.partial):
            self.put("partial")
            self.feed((value.func, value.args, value.keywords), deeper)
        else:
            cls = type(value)
            self._feed_class(cls, deeper)
            described = getattr(value, "__fingerprint__", None)
            if described is not None:  # an object that says what decides its output (a
                self.feed(described(), deeper)  # registry serde: not its client or caches)
                return
            attributes = getattr(value, "__dict__", None)
            if attributes is None and hasattr(cls, "__slots__"):
                attributes = {s: getattr(value, s, None) for s in cls.__slots__}
            if attributes:
                self.feed(dict(attributes), deeper)

    def _feed_class(self, cls: type, depth: int) -> None:
        """A class by its name and, for classes outside the standard library and builtins,
        the code of the methods it and its own bases define."""
        self.put(f"class {cls.__module__}.{cls.__qualname__}")
        if cls.__module__ in ("builtins", "functools", "typing") or id(cls) in self.seen:
            return
        self.seen.add(id(cls))
        for klass in cls.__mro__:
            if klass.__module__ in ("builtins", "abc", "typing"):
                continue
            for name in sorted(vars(klass)):
                member = vars(klass)[name]
                if isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                if isinstance(member, types.FunctionType):
                    self.put(f"{klass.__qualname__}.{name}")
                    self.feed(member.__code__, depth + 1)


def _global_names(code: types.CodeType) -> set[str]:
    """The names a code object and the code nested in it (lambdas, comprehensions) look up."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names
