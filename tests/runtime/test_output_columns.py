"""A task's output columns built in C (``rows.binary_column``, ``rows.int64_column``, from
``_task_loop.binary_buffers`` and ``int64_buffer``) against ``pa.array`` of the same values:
the same Arrow array, nulls and empty values included, and ``pa.array``'s own answer (or
error) for anything C declines."""

from __future__ import annotations

from unittest.mock import patch

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from streamplatform.runtime import rows

if rows._binary_buffers is None:
    pytest.skip("the package was built without its C extensions", allow_module_level=True)

binary_values = st.one_of(st.binary(max_size=20), st.none(), st.just(b""))
int_values = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 2**63 - 1]))
# What C declines: pa.array decides (a conversion or its error).
odd_values = st.sampled_from([bytearray(b"ab"), "text", 2**64, True, None, 1.5, memoryview(b"x")])


def _both(build, values, index: int):
    """``build`` of rows holding ``values`` at ``index``, in C and by ``pa.array``: each an
    array, or the error's type."""
    table = [(object(),) * index + (value, "after") for value in values]
    results = []
    for native in (True, False):
        with patch.object(rows, "NATIVE_COLUMNS", native):
            try:
                array = build(table, index)
                array.validate(full=True)
                results.append(array)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as error:
                results.append(type(error))
    return results


@settings(max_examples=examples(80), deadline=None)
@given(
    values=st.lists(st.one_of(binary_values, odd_values), max_size=40),
    index=st.integers(0, 3),
)
def test_a_binary_column_built_in_c_is_pa_arrays(values, index):
    native, reference = _both(rows.binary_column, values, index)
    assert native == reference
    if isinstance(native, pa.Array):
        assert native.null_count == values.count(None)
        assert native.type == pa.binary()


@settings(max_examples=examples(80), deadline=None)
@given(
    values=st.lists(st.one_of(int_values, odd_values), max_size=40),
    index=st.integers(0, 3),
)
def test_an_int64_column_built_in_c_is_pa_arrays(values, index):
    native, reference = _both(rows.int64_column, values, index)
    assert native == reference


def test_the_c_path_builds_the_columns_of_plain_bytes_and_ints():
    """The common case takes the buffers built in C (not pa.array's fallback)."""
    table = [(b"k1", b"v", 5), (None, b"", -7), (b"key-3", None, 2**63 - 1)]
    assert rows._binary_buffers(table, 0) == (
        1,
        bytes([0b101]),
        b"".join(n.to_bytes(4, "little") for n in (0, 2, 2, 7)),
        b"k1key-3",
    )
    assert rows._int64_buffer(table, 2) == b"".join(
        n.to_bytes(8, "little", signed=True) for n in (5, -7, 2**63 - 1)
    )
    assert rows._binary_buffers(table + [(bytearray(b"x"), b"", 0)], 0) is None
    assert rows._int64_buffer(table + [(b"", b"", None)], 2) is None
    assert rows.binary_column(table, 1).to_pylist() == [b"v", b"", None]
