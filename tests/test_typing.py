"""Types for users: mypy, run on typical user code, infers the DSL's key and value types through a
pipeline (``KStream[K, V]``, ``KTable[K, V]``, ...: the package ships py.typed) and reports a
misuse. One mypy run on a snippet, with a cache of its own (a few seconds)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import streamplatform

mypy_api = pytest.importorskip("mypy.api")

# Each ``reveal_type`` with the type mypy must reveal (module paths dropped: ``KStream[str,
# Any]`` for ``streamplatform.dsl.kstream.KStream[builtins.str, Any]``).
USER_CODE = """
    from streamplatform import StreamsBuilder
    from streamplatform.dsl import JoinWindows, KStream, SessionWindows, TimeWindows
    from streamplatform.serdes import Serdes

    builder = StreamsBuilder()
    orders = builder.stream("orders", Serdes.string(), Serdes.json())
    reveal_type(orders)  # KStream[str, Any]
    reveal_type(builder.stream("raw"))  # KStream[Any, Any]
    amounts = orders.map_values(lambda order: int(order["amount"]))
    reveal_type(amounts)  # KStream[str, int]
    reveal_type(orders.map_values(lambda key, order: f"{key}:{order}"))  # KStream[str, str]
    reveal_type(amounts.filter(lambda key, amount: amount > 10))  # KStream[str, int]
    reveal_type(orders.map(lambda key, order: (len(key), str(order))))  # KStream[int, str]
    reveal_type(orders.select_key(lambda key, order: 1.5))  # KStream[float, Any]
    reveal_type(orders.flat_map_values(lambda order: [1, 2]))  # KStream[str, int]
    reveal_type(orders.peek(lambda key, order: print(key)).merge(orders))  # KStream[str, Any]
    reveal_type(orders.group_by_key().count())  # KTable[str, int]
    reveal_type(orders.group_by_key().count().to_stream())  # KStream[str, int]
    reveal_type(orders.group_by(lambda key, order: order["user"]).count())  # KTable[Any, int]
    reveal_type(amounts.group_by_key().reduce(lambda one, two: one + two))  # KTable[str, int]
    by_key = orders.group_by_key()
    reveal_type(by_key.aggregate(lambda: 0, lambda k, v, total: total + 1))  # KTable[str, int]
    merged = by_key.aggregate(dict, lambda k, v, agg: {**agg, k: v})
    reveal_type(merged)  # KTable[str, dict[str, Any]]
    minute = TimeWindows.of_size_with_no_grace(60_000)
    reveal_type(orders.group_by_key().windowed_by(minute).count())  # KTable[Windowed[str], int]
    gap = SessionWindows.of_inactivity_gap_with_no_grace(60_000)
    reveal_type(orders.group_by_key().windowed_by(gap).count())  # KTable[Windowed[str], int]
    users = builder.table("users", Serdes.string(), Serdes.string())
    reveal_type(users)  # KTable[str, str]
    reveal_type(users.map_values(len))  # KTable[str, int]
    reveal_type(users.group_by(lambda key, name: (name, 1)).count())  # KTable[str, int]
    pairs = orders.join(users, lambda order, user: (order, user))
    reveal_type(pairs)  # KStream[str, tuple[Any, Any]]
    window = JoinWindows.of_time_difference_with_no_grace(5_000)
    reveal_type(amounts.outer_join(orders, lambda a, o: str(a), window))  # KStream[str, str]
    products = builder.global_table("products", Serdes.long(), Serdes.json())
    reveal_type(products)  # GlobalKTable[int, Any]
    priced = orders.join(products, lambda key, order: order["product"], lambda o, p: "x")
    reveal_type(priced)  # KStream[str, str]
    branches = orders.split().branch(lambda key, order: True).default_branch()
    reveal_type(branches)  # dict[str, KStream[str, Any]]
    totals = (orders.group_by_key().cogroup(lambda k, order, total: total + 1)
              .cogroup(amounts.group_by_key(), lambda k, amount, total: total - amount))
    reveal_type(totals.aggregate(lambda: 0))  # KTable[str, int]
    orders.foreach(lambda key, order: len(key))  # what a callback returns is ignored

    def to_text(stream: KStream[str, str]) -> None: ...

    to_text(amounts)  # error: arg-type
    amounts.map_values(lambda amount: amount.upper())  # error: attr-defined
    counts_by_id = builder.table("counts", Serdes.long(), Serdes.long())
    orders.join(counts_by_id, lambda order, count: count)  # error: arg-type|call-overload
"""


def test_mypy_infers_the_dsl_types_through_a_pipeline(tmp_path: Path) -> None:
    source = textwrap.dedent(USER_CODE).lstrip()
    snippet = tmp_path / "user_code.py"
    snippet.write_text(source)
    # The package is found by its source directory (an editable install's import hook is not
    # something mypy follows); errors inside it are not this test's business.
    package_root = Path(streamplatform.__file__).resolve().parent.parent
    config = tmp_path / "mypy.ini"
    config.write_text(
        f"[mypy]\nmypy_path = {package_root}\ncache_dir = {tmp_path / 'cache'}\n"
        "ignore_missing_imports = True\n\n[mypy-streamplatform.*]\nfollow_imports = silent\n"
    )
    stdout, stderr, _ = mypy_api.run(["--config-file", str(config), str(snippet)])
    assert not stderr, stderr

    lines = source.splitlines()
    revealed: dict[int, str] = {}
    errors: dict[int, str] = {}
    for match in re.finditer(r"^.*user_code\.py:(\d+): (note|error): (.*)$", stdout, re.M):
        number, kind, message = int(match[1]), match[2], match[3]
        if kind == "note" and message.startswith("Revealed type is "):
            revealed[number] = re.sub(r"\b(?:[a-z_]+\.)+", "", message[18:-1])
        elif kind == "error":
            errors[number] = message

    wanted = {
        n: line.split("# ", 1)[1] for n, line in enumerate(lines, 1) if "reveal_type(" in line
    }
    assert revealed == wanted, stdout
    # The misuses, each reported on its line with its error code (one of those named: mypy
    # versions word a call no overload matches differently).
    wanted_errors = {n: line.rsplit("# error: ", 1)[1].split("|") for n, line in enumerate(lines, 1)
                     if "# error: " in line}  # fmt: skip
    assert errors.keys() == wanted_errors.keys(), stdout
    for number, message in errors.items():
        assert message.rsplit("[", 1)[1].rstrip("]") in wanted_errors[number], stdout
    assert (
        'incompatible type "KStream[str, int]"; expected "KStream[str, str]"'
        in errors[min(wanted_errors)]
    )
