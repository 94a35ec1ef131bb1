"""docs/tutorial.md runs as written: its ```python blocks are executed in order, in one
namespace (no broker, no Spark: the topology, its test, the Dagster definitions)."""

from __future__ import annotations

import re
from pathlib import Path


def test_tutorial_python_blocks_run():
    tutorial = (Path(__file__).parents[1] / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", tutorial, flags=re.DOTALL)
    assert len(blocks) == 4, "topology, test, definitions, as-of join backfills"
    namespace: dict = {}
    for block in blocks:
        # dont_inherit: the blocks run as a user's module would, without this file's
        # `from __future__ import annotations` (Dagster reads real annotations).
        exec(compile(block, "docs/tutorial.md", "exec", dont_inherit=True), namespace)
    assert namespace["defs"].resolve_job_def("orders_dlq_replay") is not None
