"""``streamplatform query``: a store of a job as of a committed batch, as JSON lines.

    streamplatform query --topology jobs.clicks:topology --set application.id=clicks \\
        --set platform.delta.root=s3://lake/streams --store page-counts --key /home [--batch 12]

One line per result: ``{"partition", "key", "value"}``, with ``"window": {"start", "end"}`` for
windows and sessions, ``"timestamp"``/``"valid_to"`` for versions. Keys on the command line are
text, read as the store's key serde reads its keys: a string store takes the text, a long
store an integer, a JSON store JSON (a deduplication's ``(key, id)`` as ``["key", "id"]``).
Nothing of the job is touched but its Delta tables: it may be running.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from streamplatform.dsl.windows import Window, Windowed
from streamplatform.serdes import Serde
from streamplatform.state.versioned import VersionedRecord
from streamplatform.state_query import QueryError, StateQuery

_LATEST = 2**63 - 1


def add_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--store", required=True, help="the store's name (its topology's)")
    what = command.add_mutually_exclusive_group()
    what.add_argument("--key", metavar="KEY", help="one key (a window store: its windows)")
    what.add_argument("--range", nargs=2, metavar=("FROM", "TO"),
                      help="keys from FROM to TO, both included (key-value stores)")  # fmt: skip
    what.add_argument("--prefix", metavar="PREFIX", help="keys that start with PREFIX")
    what.add_argument("--all", action="store_true", help="every entry (the default)")
    command.add_argument("--batch", type=int, metavar="N",
                         help="as of committed batch N (default: the last committed)")  # fmt: skip
    command.add_argument("--as-of", type=int, metavar="MS",
                         help="a versioned store: the version valid at MS")  # fmt: skip
    command.add_argument("--versions", action="store_true",
                         help="a versioned store: every version of --key")  # fmt: skip
    command.add_argument("--from-time", type=int, default=0, metavar="MS",
                         help="windows starting at or after MS")  # fmt: skip
    command.add_argument("--to-time", type=int, default=_LATEST, metavar="MS",
                         help="windows starting at or before MS")  # fmt: skip
    command.add_argument("--partition", type=int, action="append", metavar="P",
                         help="only partition P's store (repeatable)")  # fmt: skip
    command.add_argument("--limit", type=int, metavar="N", help="at most N lines")


def run(args: argparse.Namespace, topology: Any, settings: dict[str, Any]) -> int:
    """Print the query's results; 0, or 1 after one line naming what was wrong."""
    try:
        with StateQuery(topology, settings, batch=args.batch) as state:
            store = state.store(args.store, args.partition)
            print(f"# {args.store} ({store.kind}) of {state.application_id} as of batch "
                  f"{state.batch}", file=sys.stderr)  # fmt: skip
            rows = _results(args, store)
            for row in itertools.islice(rows, args.limit):
                print(json.dumps(row, default=str))
    except QueryError as error:
        print(f"streamplatform query: {error}", file=sys.stderr)
        return 1
    return 0


def _results(args: argparse.Namespace, store: Any) -> Iterator[dict[str, Any]]:
    for partition, view in sorted(store.partitions.items()):
        for key, value in _answers(args, view):
            yield {"partition": partition, **_json_key(key), **_json_value(value)}


def _answers(args: argparse.Namespace, view: Any) -> Iterable[tuple[Any, Any]]:
    kind = view.kind
    key = None if args.key is None else parse_key(view, args.key)
    if kind == "versioned":
        if key is None:
            raise QueryError(f"store {view.name} is versioned: query it by --key (Kafka "
                             "Streams' versioned stores have no range query)")  # fmt: skip
        if args.versions:
            return [(key, v) for v in view.get_versions(key, args.from_time, args.to_time)]
        found = view.get(key, args.as_of)
        return [] if found is None else [(key, found)]
    if kind == "window":
        if key is not None:
            return [(Windowed(key, w), v) for w, v in view.fetch(key, args.from_time,
                                                                    args.to_time)]  # fmt: skip
        return view.fetch_all(args.from_time, args.to_time)
    if kind == "session":
        if key is not None:
            return [(Windowed(key, w), v) for w, v in view.fetch(key)]
        return view.all()
    if key is not None:
        found = view.get(key)
        return [] if found is None else [(key, found)]
    if args.range:
        low, high = (parse_key(view, text) for text in args.range)
        return view.range(low, high)  # type: ignore[no-any-return]
    if args.prefix is not None and kind == "key_value":
        return view.prefix_scan(parse_key(view, args.prefix))  # type: ignore[no-any-return]
    if args.prefix is not None:
        raise QueryError(f"store {view.name} ({kind}) has no prefix query")
    return view.all()  # type: ignore[no-any-return]


def parse_key(view: Any, text: str) -> Any:
    """``text`` as a key of ``view``'s store (see the module's docstring)."""
    if view.kind == "dedup":
        found = _json(text)
        return tuple(found) if isinstance(found, list) else found
    serde: Serde = view.key_serde
    name = getattr(serde, "name", "")
    if name == "string":
        return text
    if name == "bytes":
        return text.encode()
    if name in ("long", "integer", "int"):
        try:
            return int(text)
        except ValueError:
            raise QueryError(f"store {view.name} has {name} keys: {text!r} is no integer") \
                from None  # fmt: skip
    return _json(text)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word: the string itself


def _json_key(key: Any) -> dict[str, Any]:
    if isinstance(key, Windowed):
        return {"key": _plain(key.key), "window": _window(key.window)}
    return {"key": _plain(key)}


def _json_value(value: Any) -> dict[str, Any]:
    if isinstance(value, VersionedRecord):
        return {"value": _plain(value.value), "timestamp": value.timestamp,
                "valid_to": value.valid_to}  # fmt: skip
    return {"value": _plain(value)}


def _window(window: Window) -> dict[str, int]:
    return {"start": window.start, "end": window.end}


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value
