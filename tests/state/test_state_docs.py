"""The examples in the state package's docstrings run as tests."""

from __future__ import annotations

import doctest

import pytest

import streamplatform.state
import streamplatform.state.stores


@pytest.mark.parametrize("module", [streamplatform.state, streamplatform.state.stores])
def test_docstring_examples(module) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0
    assert result.failed == 0
