"""The Dagster code location loads."""

import dagster as dg


def test_definitions_load():
    import definitions

    assert isinstance(definitions.defs, dg.Definitions)
    dg.Definitions.validate_loadable(definitions.defs)
