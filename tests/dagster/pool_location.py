"""``definitions.py``'s code location on topics of a test's own, for `dagster dev` in
``test_pools.py``.

The broker is shared by the whole test run and ``tests/test_demo.py`` owns the demo topic names,
so with ``STREAMPLATFORM_TEST_TOPIC_PREFIX`` set the pipelines' topics get that prefix (as
:func:`dagster_support.rename_topics` does in-process) before the definitions load: in the
webserver, the daemon and every run worker alike. Everything else — resources, application ids,
pools — is the code location's own, from the environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from dagster_support import TOPIC_NAMES  # noqa: E402

import pipelines  # noqa: E402

PREFIX_VARIABLE = "STREAMPLATFORM_TEST_TOPIC_PREFIX"

if os.environ.get(PREFIX_VARIABLE):
    for constant in TOPIC_NAMES:
        name = f"{os.environ[PREFIX_VARIABLE]}-{getattr(pipelines, constant)}"
        setattr(pipelines, constant, name)

from definitions import defs  # noqa: E402

__all__ = ["defs"]
