"""docs/tutorial.md runs as written: its ```python blocks are executed in order, in one
namespace (no broker, no Spark: the topology, its test, the Dagster definitions)."""

from __future__ import annotations

import re
from pathlib import Path


def test_tutorial_python_blocks_run():
    tutorial = (Path(__file__).parents[1] / "docs" / "tutorial.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", tutorial, flags=re.DOTALL)
    assert len(blocks) == 3, "topology, test, definitions"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/tutorial.md", "exec"), namespace)
    assert namespace["defs"].resolve_job_def("orders_dlq_replay") is not None
