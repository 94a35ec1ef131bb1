"""docs/processor-api.md runs as written: its ```python blocks are executed in order, in one
namespace (the counter, its store, its test with commits at batch boundaries)."""

from __future__ import annotations

import re
from pathlib import Path


def test_processor_api_python_blocks_run():
    page = (Path(__file__).parents[1] / "docs" / "processor-api.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    assert len(blocks) == 2, "the processor and its topology, its test"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/processor-api.md", "exec", dont_inherit=True), namespace)
    assert namespace["topology"] is not None
